package bgp

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

func validConfig() Config {
	return Config{
		ASN:      65001,
		RouterID: netip.MustParseAddr("10.0.0.1"),
		Peers: []Peer{{
			Addr:        netip.MustParseAddr("10.0.0.254"),
			ASN:         65000,
			BFD:         &BFD{MinTx: 50 * time.Millisecond, MinRx: 50 * time.Millisecond},
			Communities: []string{"65000:100"},
		}},
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(c *Config)
		wantErr string // substring; "" means valid
	}{
		{"valid", func(c *Config) {}, ""},
		{"valid ibgp with local pref", func(c *Config) { c.Peers[0].ASN = 65001; c.Peers[0].LocalPref = 200 }, ""},
		{"valid graceful restart", func(c *Config) { c.GracefulRestart = true }, ""},
		{"valid listen", func(c *Config) { c.ListenPort = 179 }, ""},
		{"valid ipv6 next hop", func(c *Config) { c.NextHop6 = netip.MustParseAddr("fd00::1") }, ""},
		{"asn 0", func(c *Config) { c.ASN = 0 }, "asn 0 is not a usable AS number"},
		{"asn AS_TRANS", func(c *Config) { c.ASN = 23456 }, "asn 23456 is not a usable"},
		{"no router id", func(c *Config) { c.RouterID = netip.Addr{} }, "router id invalid IP is not an IPv4 address"},
		{"ipv6 router id", func(c *Config) { c.RouterID = netip.MustParseAddr("fd00::1") }, "router id fd00::1 is not an IPv4"},
		{"bad listen port", func(c *Config) { c.ListenPort = 70000 }, "listen port 70000"},
		// Peers may come later (Reconfigure: BGPPeer objects).
		{"valid without peers", func(c *Config) { c.Peers = nil }, ""},
		{"valid ebgp multihop", func(c *Config) { c.Peers[0].BFD = nil; c.Peers[0].EBGPMultiHop = true }, ""},
		{"bfd with multihop", func(c *Config) { c.Peers[0].EBGPMultiHop = true }, "bfd is single hop"},
		{"duplicate peer", func(c *Config) { c.Peers = append(c.Peers, c.Peers[0]) }, "peer 10.0.0.254: listed twice"},
		{"duplicate peer v4-mapped", func(c *Config) {
			p := c.Peers[0]
			p.Addr = netip.MustParseAddr("::ffff:10.0.0.254")
			c.Peers = append(c.Peers, p)
		}, "listed twice"},
		{"peer asn 0", func(c *Config) { c.Peers[0].ASN = 0 }, "peer 10.0.0.254: asn 0"},
		{"peer no address", func(c *Config) { c.Peers[0].Addr = netip.Addr{} }, "not a unicast address"},
		{"bad community", func(c *Config) { c.Peers[0].Communities = []string{"65000"} }, `community "65000" is not of the form`},
		{"community out of range", func(c *Config) { c.Peers[0].Communities = []string{"65536:1"} }, `community "65536:1"`},
		{"bfd tx below 10ms", func(c *Config) { c.Peers[0].BFD.MinTx = 5 * time.Millisecond }, "bfd min tx 5ms is not 10ms to 1h"},
		{"bfd rx below 10ms", func(c *Config) { c.Peers[0].BFD.MinRx = time.Millisecond }, "bfd min rx 1ms"},
		{"hold time fraction", func(c *Config) { c.Peers[0].HoldTime = 2500 * time.Millisecond }, "must be whole seconds"},
		{"hold time too short", func(c *Config) { c.Peers[0].HoldTime = 2 * time.Second }, "hold time 2s is not 3s to 65535s"},
		{"keepalive not below hold", func(c *Config) { c.Peers[0].HoldTime = 3 * time.Second; c.Peers[0].KeepaliveInterval = 3 * time.Second }, "keepalive interval 3s"},
		{"local pref on ebgp", func(c *Config) { c.Peers[0].LocalPref = 200 }, "local pref applies to iBGP peers only"},
		{"local prefs differ", func(c *Config) {
			c.Peers[0].ASN, c.Peers[0].LocalPref = 65001, 200
			c.Peers = append(c.Peers, Peer{Addr: netip.MustParseAddr("10.0.0.253"), ASN: 65001, LocalPref: 300})
		}, "local pref 300 differs"},
		{"passive without listening", func(c *Config) { c.Peers[0].Passive = true }, "passive, but the speaker does not listen"},
		{"restart time too long", func(c *Config) { c.GracefulRestart = true; c.RestartTime = 5000 * time.Second }, "restart time 1h23m20s"},
		{"ipv4 next hop6", func(c *Config) { c.NextHop6 = netip.MustParseAddr("10.0.0.1") }, "next hop for IPv6 10.0.0.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.edit(&c)
			c.SetDefaults()
			err := c.Validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tt.wantErr != "" && err == nil:
				t.Fatalf("Validate() = nil, want an error containing %q", tt.wantErr)
			case tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr):
				t.Fatalf("Validate() = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	c := validConfig()
	bfd := c.Peers[0].BFD
	c.SetDefaults()
	p := c.Peers[0]
	if c.ListenPort != -1 || p.HoldTime != 9*time.Second || p.KeepaliveInterval != 3*time.Second || p.ConnectRetry != time.Second {
		t.Errorf("defaults: listen %d, hold %v, keepalive %v, connect retry %v; want -1, 9s, 3s, 1s",
			c.ListenPort, p.HoldTime, p.KeepaliveInterval, p.ConnectRetry)
	}
	if p.BFD.Multiplier != 3 || bfd.Multiplier != 0 {
		t.Errorf("bfd multiplier %d (caller's %d), want 3 (caller's untouched 0)", p.BFD.Multiplier, bfd.Multiplier)
	}
}
