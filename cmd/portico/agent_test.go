package main

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/dataplane"
)

func TestParseAgentFlags(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
		check   func(t *testing.T, c agentConfig)
	}{
		{name: "flags", args: []string{"-group", "edge/web", "-iface", "eth0", "-node-name", "n1", "-vip-pool", "10.0.0.0/24!10.0.0.1; 2001:db8::/120"},
			check: func(t *testing.T, c agentConfig) {
				if c.group != "edge/web" || c.iface != "eth0" || c.node != "n1" || len(c.pools) != 2 {
					t.Errorf("config %+v", c)
				}
				if len(c.pools[0].Exclude) != 1 {
					t.Errorf("pool exclusions %v", c.pools[0].Exclude)
				}
			}},
		{name: "downward API environment", args: []string{"-group", "edge/web"},
			env: map[string]string{"NODE_NAME": "n2", "POD_NAMESPACE": "portico", "PORTICO_IFACE": "eno1", "PORTICO_VRRP_INTERVAL": "50ms"},
			check: func(t *testing.T, c agentConfig) {
				if c.node != "n2" || c.podNamespace != "portico" || c.iface != "eno1" || c.vrrpInterval.Milliseconds() != 50 {
					t.Errorf("config %+v", c)
				}
			}},
		{name: "flag beats environment", args: []string{"-group", "edge/web", "-iface", "eth1", "-node-name", "n3"},
			env: map[string]string{"PORTICO_IFACE": "eno1", "NODE_NAME": "other"},
			check: func(t *testing.T, c agentConfig) {
				if c.iface != "eth1" || c.node != "n3" {
					t.Errorf("config %+v", c)
				}
			}},
		{name: "group required", args: []string{"-iface", "eth0", "-node-name", "n"}, wantErr: "-group"},
		{name: "group needs a namespace", args: []string{"-group", "web", "-iface", "eth0", "-node-name", "n"}, wantErr: "-group"},
		{name: "node required", args: []string{"-group", "a/b", "-iface", "eth0"}, wantErr: "-node-name"},
		{name: "bad pool", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-vip-pool", "10.0.0.0/33"}, wantErr: "-vip-pool"},
		{name: "bad environment value", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n"},
			env: map[string]string{"PORTICO_VRRP_PRIORITY": "high"}, wantErr: "vrrp-priority"},
		{name: "degraded not below priority", args: []string{"-group", "a/b", "-iface", "eth0", "-node-name", "n", "-vrrp-priority", "10"}, wantErr: "priority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseAgentFlags(tc.args, env(tc.env))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

func TestDesiredFor(t *testing.T) {
	vip := netip.MustParseAddr("192.0.2.10")
	a, b, c, d := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3"), netip.MustParseAddr("10.0.0.4")
	macB, _ := net.ParseMAC("02:00:00:00:00:02")
	macC, _ := net.ParseMAC("02:00:00:00:00:03")
	snap := model.Snapshot{Groups: []model.Group{
		{Name: "edge/web", VIPs: []netip.Addr{vip}, VRID: 7, Ports: []model.Port{{Protocol: model.TCP, Port: 443}}, Replicas: []model.Replica{
			{Addr: a, State: model.Ready}, {Addr: b, State: model.Ready, Weight: 2}, {Addr: c, State: model.Draining}, {Addr: d, State: model.Ready},
		}},
		{Name: "edge/other", VIPs: []netip.Addr{netip.MustParseAddr("192.0.2.11")}, Replicas: []model.Replica{{Addr: b}}},
		{Name: "edge/novip", Replicas: []model.Replica{{Addr: b}}},
	}}
	local := func(x netip.Addr) bool { return x == a }
	macs := map[netip.Addr]net.HardwareAddr{b: macB, c: macC}
	mac := func(x netip.Addr) (net.HardwareAddr, bool) { m, ok := macs[x]; return m, ok }

	got, missing := desiredFor(snap, "edge/web", 42, local, mac)
	want := dataplane.Desired{Seed: 42, Groups: []dataplane.Group{{
		Name: "edge/web", VIPs: []netip.Addr{vip}, Ports: []model.Port{{Protocol: model.TCP, Port: 443}},
		Backends: []dataplane.Backend{
			{Addr: a, Local: true},
			{Addr: b, MAC: macB, Weight: 2},
			{Addr: c, MAC: macC, Draining: true},
		},
	}}}
	if diff := cmp.Diff(want, got, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
		t.Errorf("desired (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]netip.Addr{d}, missing, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
		t.Errorf("unresolved (-want +got):\n%s", diff)
	}
	if got, _ := desiredFor(snap, "edge/novip", 42, local, mac); len(got.Groups) != 0 {
		t.Errorf("a group without VIPs gave %+v", got.Groups)
	}
	if got, _ := desiredFor(snap, "edge/gone", 42, local, mac); len(got.Groups) != 0 || got.Seed != 42 {
		t.Errorf("a missing group gave %+v", got)
	}
}
