package main

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseVRRPFlags(t *testing.T) {
	cfgFile := filepath.Join(t.TempDir(), "vrrp.json")
	if err := os.WriteFile(cfgFile, []byte(`{"interface":"eth1","instances":[{"vrid":9,"vips":["192.0.2.9"]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
		check   func(t *testing.T, iface string, vrid, version, prio uint8, interval, refresh time.Duration, vips []netip.Addr)
	}{
		{name: "defaults come from vrrp.Config", args: []string{"-iface", "eth0", "-vrid", "7", "-vip", "192.0.2.7"},
			check: func(t *testing.T, iface string, vrid, version, prio uint8, interval, refresh time.Duration, vips []netip.Addr) {
				if iface != "eth0" || vrid != 7 || version != 3 || prio != 100 || interval != time.Second || refresh != 10*time.Second || len(vips) != 1 {
					t.Errorf("got %s vrid %d v%d prio %d interval %v refresh %v vips %v", iface, vrid, version, prio, interval, refresh, vips)
				}
			}},
		{name: "flags", args: []string{"-iface", "eth0", "-vrid", "8", "-version", "2", "-priority", "150", "-advert-interval", "2s", "-vip", "192.0.2.8"},
			check: func(t *testing.T, iface string, vrid, version, prio uint8, interval, refresh time.Duration, vips []netip.Addr) {
				if version != 2 || prio != 150 || interval != 2*time.Second {
					t.Errorf("got v%d prio %d interval %v", version, prio, interval)
				}
			}},
		{name: "config file", args: []string{"-config", cfgFile, "-debug"},
			check: func(t *testing.T, iface string, vrid, version, prio uint8, interval, refresh time.Duration, vips []netip.Addr) {
				if iface != "eth1" || vrid != 9 || prio != 100 {
					t.Errorf("got %s vrid %d prio %d", iface, vrid, prio)
				}
			}},
		{name: "router flags with -config", args: []string{"-config", cfgFile, "-iface", "eth0"}, wantErr: "cannot be combined"},
		{name: "priority 0 is reserved", args: []string{"-iface", "eth0", "-vrid", "7", "-priority", "0", "-vip", "192.0.2.7"}, wantErr: "reserved"},
		{name: "vrid out of range", args: []string{"-iface", "eth0", "-vrid", "300", "-vip", "192.0.2.7"}, wantErr: "range"},
		{name: "bad VIP", args: []string{"-iface", "eth0", "-vrid", "7", "-vip", "192.0.2"}, wantErr: "-vip"},
		{name: "no VIP", args: []string{"-iface", "eth0", "-vrid", "7"}, wantErr: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _, err := parseVRRPFlags(tc.args)
			if tc.check == nil {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			in := cfg.Instances[0]
			tc.check(t, cfg.Interface, in.VRID, in.Version, in.Priority, in.AdvertInterval.Duration, in.GARPRefresh.Duration, in.VIPs)
		})
	}
}
