package bgp

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// cmpPrefix compares netip.Prefix values, whose fields are unexported.
var cmpPrefix = cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })

var (
	vip1 = netip.MustParsePrefix("10.99.0.100/32")
	vip2 = netip.MustParsePrefix("10.99.0.101/32")
)

func TestDiff(t *testing.T) {
	tests := []struct {
		name      string
		announced map[netip.Prefix]Preference
		desired   []netip.Prefix
		pref      Preference
		want      change
	}{
		{"nothing to normal", nil, []netip.Prefix{vip1, vip2}, Normal,
			change{add: []Announcement{{vip1, Normal}, {vip2, Normal}}}},
		{"normal again is nothing", map[netip.Prefix]Preference{vip1: Normal, vip2: Normal}, []netip.Prefix{vip2, vip1}, Normal,
			change{}},
		{"normal to depreferenced", map[netip.Prefix]Preference{vip1: Normal, vip2: Normal}, []netip.Prefix{vip1, vip2}, Depreferenced,
			change{add: []Announcement{{vip1, Depreferenced}, {vip2, Depreferenced}}}},
		{"depreferenced to withdrawn", map[netip.Prefix]Preference{vip1: Depreferenced, vip2: Depreferenced}, []netip.Prefix{vip1, vip2}, Withdrawn,
			change{withdraw: []netip.Prefix{vip1, vip2}}},
		{"withdrawn to normal", nil, []netip.Prefix{vip1}, Normal,
			change{add: []Announcement{{vip1, Normal}}}},
		{"a prefix leaves the set", map[netip.Prefix]Preference{vip1: Normal, vip2: Normal}, []netip.Prefix{vip1}, Normal,
			change{withdraw: []netip.Prefix{vip2}}},
		{"one changes, one leaves, one comes", map[netip.Prefix]Preference{vip1: Normal}, []netip.Prefix{vip2}, Depreferenced,
			change{add: []Announcement{{vip2, Depreferenced}}, withdraw: []netip.Prefix{vip1}}},
		{"withdrawn with nothing announced", nil, []netip.Prefix{vip1}, Withdrawn, change{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := diff(tt.announced, tt.desired, tt.pref)
			if d := cmp.Diff(tt.want, got, cmp.AllowUnexported(change{}), cmpopts.EquateEmpty(), cmpPrefix); d != "" {
				t.Errorf("diff (-want +got):\n%s", d)
			}
		})
	}
}

func TestCheckPrefixes(t *testing.T) {
	nh6 := netip.MustParseAddr("fd00::1")
	tests := []struct {
		name   string
		prefix string
		nh6    netip.Addr
		ok     bool
	}{
		{"ipv4 host", "10.0.0.1/32", netip.Addr{}, true},
		{"ipv4 net", "10.0.0.0/24", netip.Addr{}, false},
		{"ipv6 host with next hop", "fd00::100/128", nh6, true},
		{"ipv6 host without next hop", "fd00::100/128", netip.Addr{}, false},
		{"ipv6 net", "fd00::/64", nh6, false},
		{"v4-mapped", "::ffff:10.0.0.1/128", nh6, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkPrefixes([]netip.Prefix{netip.MustParsePrefix(tt.prefix)}, tt.nh6)
			if (err == nil) != tt.ok {
				t.Errorf("checkPrefixes(%s) = %v, want ok=%v", tt.prefix, err, tt.ok)
			}
		})
	}
}
