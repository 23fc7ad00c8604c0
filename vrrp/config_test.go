package vrrp

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
)

func TestLoadConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vrrp.json")
	const file = `{
  "interface": "eth0",
  "instances": [
    {"vrid": 1, "vips": ["10.0.0.100", "10.0.0.101"], "advert_interval": "20ms", "peers": ["10.0.0.2"]},
    {"name": "v6", "vrid": 1, "priority": 255, "vips": ["2001:db8::100"], "garp_refresh": "-1s"},
    {"name": "legacy", "vrid": 2, "version": 2, "no_preempt": true, "preempt_delay": "5s", "vips": ["10.0.0.102"]}
  ]
}`
	if err := os.WriteFile(path, []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	d := func(v time.Duration) Duration { return Duration{v} }
	want := Config{Interface: "eth0", Instances: []InstanceConfig{
		{Name: "vrid-1", VRID: 1, Version: 3, Priority: 100, AdvertInterval: d(20 * time.Millisecond),
			VIPs: []netip.Addr{a4("10.0.0.100"), a4("10.0.0.101")}, Peers: []netip.Addr{a4("10.0.0.2")},
			GARPCount: 3, GARPSpacing: d(50 * time.Millisecond), GARPRefresh: d(10 * time.Second)},
		{Name: "v6", VRID: 1, Version: 3, Priority: 255, AdvertInterval: d(time.Second),
			VIPs: []netip.Addr{a4("2001:db8::100")}, GARPCount: 3, GARPSpacing: d(50 * time.Millisecond), GARPRefresh: d(-time.Second)},
		{Name: "legacy", VRID: 2, Version: 2, Priority: 100, AdvertInterval: d(time.Second), NoPreempt: true, PreemptDelay: d(5 * time.Second),
			VIPs: []netip.Addr{a4("10.0.0.102")}, GARPCount: 3, GARPSpacing: d(50 * time.Millisecond), GARPRefresh: d(10 * time.Second)},
	}}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("LoadConfig (-want +got):\n%s", diff)
	}
}

func TestConfigValidate(t *testing.T) {
	base := func() InstanceConfig {
		return InstanceConfig{VRID: 1, VIPs: []netip.Addr{a4("10.0.0.100")}}
	}
	cases := []struct {
		name string
		cfg  Config
		want string // substring of the error
	}{
		{"no interface", Config{Instances: []InstanceConfig{base()}}, "interface is not set"},
		{"no instances", Config{Interface: "eth0"}, "no instances"},
		{"vrid 0", Config{Interface: "eth0", Instances: []InstanceConfig{func() InstanceConfig { c := base(); c.VRID = 0; return c }()}}, "vrid must be 1 to 255"},
		{"no vips", Config{Interface: "eth0", Instances: []InstanceConfig{func() InstanceConfig { c := base(); c.VIPs = nil; return c }()}}, "no vips"},
		{"mixed families", Config{Interface: "eth0", Instances: []InstanceConfig{func() InstanceConfig {
			c := base()
			c.VIPs = append(c.VIPs, a4("2001:db8::1"))
			return c
		}()}}, "one family"},
		{"peer family", Config{Interface: "eth0", Instances: []InstanceConfig{func() InstanceConfig { c := base(); c.Peers = []netip.Addr{a4("fe80::1")}; return c }()}}, "not of the vips' family"},
		{"global ipv6 peer", Config{Interface: "eth0", Instances: []InstanceConfig{func() InstanceConfig {
			c := base()
			c.VIPs, c.Peers = []netip.Addr{a4("2001:db8::100")}, []netip.Addr{a4("fe80::2"), a4("2001:db8::2")}
			return c
		}()}}, "peer 2001:db8::2 is not a link-local address"},
		{"duplicate vrid", Config{Interface: "eth0", Instances: []InstanceConfig{base(), func() InstanceConfig { c := base(); c.Name = "other"; return c }()}}, "already used"},
		{"v2 fraction", Config{Interface: "eth0", Instances: []InstanceConfig{func() InstanceConfig {
			c := base()
			c.Version, c.AdvertInterval = 2, Duration{500 * time.Millisecond}
			return c
		}()}}, "whole seconds"},
		{"v2 ipv6", Config{Interface: "eth0", Instances: []InstanceConfig{func() InstanceConfig {
			c := base()
			c.Version, c.VIPs = 2, []netip.Addr{a4("2001:db8::1")}
			return c
		}()}}, "IPv4 only"},
		{"v3 5ms", Config{Interface: "eth0", Instances: []InstanceConfig{func() InstanceConfig { c := base(); c.AdvertInterval = Duration{5 * time.Millisecond}; return c }()}}, "centiseconds"},
		{"version 4", Config{Interface: "eth0", Instances: []InstanceConfig{func() InstanceConfig { c := base(); c.Version = 4; return c }()}}, "version must be 2 or 3"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.SetDefaults()
			err := tc.cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	ok := Config{Interface: "eth0", Instances: []InstanceConfig{base()}}
	ok.SetDefaults()
	if err := ok.Validate(); err != nil {
		t.Errorf("Validate of a good config = %v", err)
	}
	v6 := Config{Interface: "eth0", Instances: []InstanceConfig{{VRID: 1, VIPs: []netip.Addr{a4("2001:db8::100")},
		Peers: []netip.Addr{a4("fe80::2"), netip.MustParseAddr("fe80::3%eth0")}}}}
	v6.SetDefaults()
	if err := v6.Validate(); err != nil {
		t.Errorf("Validate with link-local IPv6 peers = %v", err)
	}
	if got := v6.Instances[0].Peers[1]; got != a4("fe80::3") {
		t.Errorf("peer = %v, want fe80::3 without its zone (sources are compared without one)", got)
	}
}

func TestMetricsNames(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.state.WithLabelValues("a").Set(2)
	m.transitions.WithLabelValues("a", "backup", "master").Inc()
	m.advertsSent.WithLabelValues("a").Inc()
	m.advertsReceived.WithLabelValues("a").Inc()
	m.garpSent.WithLabelValues("a", kindARPRequest).Inc()
	m.conflicts.WithLabelValues("a").Inc()
	m.priority.WithLabelValues("a").Set(100)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
		// Every rejection reason has a series from the start.
		if mf.GetName() == "portico_vrrp_adverts_rejected_total" && len(mf.GetMetric()) != len(Reasons) {
			t.Errorf("rejected series = %d, want one per reason (%d)", len(mf.GetMetric()), len(Reasons))
		}
	}
	want := []string{
		"portico_vrrp_adverts_received_total", "portico_vrrp_adverts_rejected_total", "portico_vrrp_adverts_sent_total",
		"portico_vrrp_conflicts_total", "portico_vrrp_gratuitous_sent_total", "portico_vrrp_priority",
		"portico_vrrp_state", "portico_vrrp_transitions_total",
	}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("metric names (-want +got):\n%s", diff)
	}
	if _, err := NewMetrics(reg); err == nil {
		t.Error("registering twice did not fail")
	}
}

// TestExampleConfig keeps the documented example file loadable.
func TestExampleConfig(t *testing.T) {
	if _, err := LoadConfig("../test/vrrp/example.json"); err != nil {
		t.Fatal(err)
	}
}

func TestSetDefaultsUnmapsAddresses(t *testing.T) {
	c := Config{Interface: "eth0", Instances: []InstanceConfig{{VRID: 1,
		VIPs: []netip.Addr{a4("::ffff:10.0.0.100")}, Peers: []netip.Addr{a4("::ffff:10.0.0.2")}}}}
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := c.Instances[0].VIPs[0]; got != a4("10.0.0.100") {
		t.Errorf("vip = %v, want 10.0.0.100", got)
	}
	if got := c.Instances[0].Peers[0]; got != a4("10.0.0.2") {
		t.Errorf("peer = %v, want 10.0.0.2", got)
	}
}
