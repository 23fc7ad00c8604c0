package bgp

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
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

// TestPathAttrs checks the attributes of each preference, for eBGP-only and
// for iBGP configurations.
func TestPathAttrs(t *testing.T) {
	ebgp := validConfig()
	ebgp.Peers = append(ebgp.Peers, Peer{Addr: netip.MustParseAddr("10.0.0.253"), ASN: 65000, Communities: []string{"65000:200", "65000:100"}})
	ibgp := validConfig()
	ibgp.Peers[0].ASN, ibgp.Peers[0].LocalPref = 65001, 200
	type attrs struct {
		ASPath      []uint32
		Communities []uint32
		LocalPref   *uint32
		NextHop     string
	}
	pref := func(v uint32) *uint32 { return &v }
	tests := []struct {
		name string
		cfg  Config
		a    Announcement
		want attrs
	}{
		{"ebgp normal", ebgp, Announcement{vip1, Normal},
			attrs{Communities: []uint32{65000<<16 | 100, 65000<<16 | 200}, NextHop: "0.0.0.0"}},
		// LOCAL_PREF 0 is in every depreferenced path; GoBGP strips it towards
		// eBGP peers (the loopback test sees no LOCAL_PREF at the receiver).
		{"ebgp depreferenced", ebgp, Announcement{vip1, Depreferenced},
			attrs{ASPath: []uint32{65001, 65001, 65001}, Communities: []uint32{65000<<16 | 100, 65000<<16 | 200, 0xffff0000}, LocalPref: pref(0), NextHop: "0.0.0.0"}},
		{"ibgp normal", ibgp, Announcement{vip1, Normal},
			attrs{Communities: []uint32{65000<<16 | 100}, LocalPref: pref(200), NextHop: "0.0.0.0"}},
		{"ibgp depreferenced: no prepend (an AS loop there), local pref 0", ibgp, Announcement{vip1, Depreferenced},
			attrs{Communities: []uint32{65000<<16 | 100, 0xffff0000}, LocalPref: pref(0), NextHop: "0.0.0.0"}},
		{"ipv6", func() Config { c := ebgp; c.NextHop6 = netip.MustParseAddr("fd00::11"); return c }(),
			Announcement{netip.MustParsePrefix("fd00::100/128"), Normal},
			attrs{Communities: []uint32{65000<<16 | 100, 65000<<16 | 200}, NextHop: "fd00::11"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.cfg
			c.SetDefaults()
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			p, err := newPathAttrs(&c).path(tt.a, false)
			if err != nil {
				t.Fatal(err)
			}
			var got attrs
			for _, a := range p.Attrs {
				switch a := a.(type) {
				case *bgp.PathAttributeAsPath:
					for _, seg := range a.Value {
						got.ASPath = append(got.ASPath, seg.GetAS()...)
					}
				case *bgp.PathAttributeCommunities:
					got.Communities = a.Value
				case *bgp.PathAttributeLocalPref:
					if got.LocalPref != nil {
						t.Errorf("two LOCAL_PREF attributes")
					}
					got.LocalPref = pref(a.Value)
				case *bgp.PathAttributeNextHop:
					got.NextHop = a.Value.String()
				case *bgp.PathAttributeMpReachNLRI:
					got.NextHop = a.Nexthop.String()
				}
			}
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("attributes (-want +got):\n%s", d)
			}
		})
	}
}
