package bgp

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"

	"github.com/portico-edge/portico/test/testenv"
)

// startSpeaker runs a speaker until the test ends.
func startSpeaker(t *testing.T, name string, cfg Config) (*Speaker, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	met, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, zaptest.NewLogger(t).Named(name), met)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	// GoBGP's StartBgp writes package variables (table.SelectionOptions,
	// table.UseMultiplePaths): two servers of one process must not start at
	// the same time. Run holds s.mu until StartBgp has returned.
	testenv.Eventually(t, 10*time.Second, func() string {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.state == notStarted {
			return name + " has not started"
		}
		return ""
	})
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: Run: %v", name, err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("%s: Run did not return within 10s of its context's end", name)
		}
	})
	return s, reg
}

// ribPath is what a receiving speaker holds for a prefix.
type ribPath struct {
	ASPath      []uint32
	Communities []string
	NextHop     string
	LocalPref   bool // a LOCAL_PREF attribute is present
}

// rib lists the best paths of family in s's global RIB.
func rib(t *testing.T, s *Speaker, family bgp.Family) map[netip.Prefix]ribPath {
	t.Helper()
	out := map[netip.Prefix]ribPath{}
	err := s.srv.ListPath(apiutil.ListPathRequest{TableType: api.TableType_TABLE_TYPE_GLOBAL, Family: family},
		func(nlri bgp.NLRI, paths []*apiutil.Path) {
			pfx, err := netip.ParsePrefix(nlri.String())
			if err != nil {
				t.Errorf("nlri %v: %v", nlri, err)
				return
			}
			for _, p := range paths {
				if !p.Best {
					continue
				}
				var rp ribPath
				for _, a := range p.Attrs {
					switch a := a.(type) {
					case *bgp.PathAttributeAsPath:
						for _, seg := range a.Value {
							rp.ASPath = append(rp.ASPath, seg.GetAS()...)
						}
					case *bgp.PathAttributeCommunities:
						for _, c := range a.Value {
							rp.Communities = append(rp.Communities, fmt.Sprintf("%d:%d", c>>16, c&0xffff))
						}
					case *bgp.PathAttributeNextHop:
						rp.NextHop = a.Value.String()
					case *bgp.PathAttributeLocalPref:
						rp.LocalPref = true
					case *bgp.PathAttributeMpReachNLRI:
						rp.NextHop = a.Nexthop.String()
					}
				}
				slices.Sort(rp.Communities)
				out[pfx] = rp
			}
		})
	if err != nil {
		t.Fatalf("list paths: %v", err)
	}
	return out
}

// TestAnnounceLoopback peers two speakers over loopback (no root needed): the
// edge dials the "router", which listens; each transition of Announce must show
// in the router's RIB.
func TestAnnounceLoopback(t *testing.T) {
	port := int32(testenv.Ports(t, 1)[0])
	nh6 := netip.MustParseAddr("fd00:99::11")
	router, _ := startSpeaker(t, "router", Config{
		ASN: 65000, RouterID: netip.MustParseAddr("10.0.0.2"), ListenPort: port, NextHop6: nh6,
		Peers: []Peer{{Addr: netip.MustParseAddr("127.0.0.1"), ASN: 65001, Passive: true}},
	})
	edge, edgeReg := startSpeaker(t, "edge", Config{
		ASN: 65001, RouterID: netip.MustParseAddr("10.0.0.1"), NextHop6: nh6,
		Peers: []Peer{{Addr: netip.MustParseAddr("127.0.0.2"), ASN: 65000, Port: uint16(port), Communities: []string{"65000:100"}}},
	})

	testenv.Eventually(t, 15*time.Second, func() string {
		if st := edge.Status().Peers[0].State; st != "established" {
			return "edge session is " + st
		}
		return ""
	})
	// The metrics follow GoBGP's peer events, a moment after the state Status
	// reads (CI once read them in between).
	testenv.Eventually(t, 5*time.Second, func() string {
		if got := testutil.ToFloat64(edge.met.established); got != 1 {
			return fmt.Sprintf("established sessions gauge = %v, want 1", got)
		}
		if got := testutil.ToFloat64(edge.met.sessionTransitions.WithLabelValues("127.0.0.2", "established")); got != 1 {
			return fmt.Sprintf("transitions to established = %v, want 1", got)
		}
		if got := testutil.ToFloat64(edge.met.sessionUp.WithLabelValues("127.0.0.2")); got != 1 {
			return fmt.Sprintf("session_up{peer=127.0.0.2} = %v, want 1", got)
		}
		return ""
	})

	vip6 := netip.MustParsePrefix("fd00:99::100/128")
	normal := ribPath{ASPath: []uint32{65001}, Communities: []string{"65000:100"}, NextHop: "127.0.0.1"}
	depref := ribPath{ASPath: []uint32{65001, 65001, 65001, 65001}, Communities: []string{"65000:100", "65535:0"}, NextHop: "127.0.0.1"}
	steps := []struct {
		name string
		pref Preference
		want map[netip.Prefix]ribPath
		ann  []Announcement
	}{
		{"normal", Normal, map[netip.Prefix]ribPath{vip1: normal, vip2: normal}, []Announcement{{vip1, Normal}, {vip2, Normal}}},
		{"depreferenced", Depreferenced, map[netip.Prefix]ribPath{vip1: depref, vip2: depref}, []Announcement{{vip1, Depreferenced}, {vip2, Depreferenced}}},
		{"withdrawn", Withdrawn, map[netip.Prefix]ribPath{}, nil},
		{"normal again", Normal, map[netip.Prefix]ribPath{vip1: normal, vip2: normal}, []Announcement{{vip1, Normal}, {vip2, Normal}}},
	}
	for _, st := range steps {
		if err := edge.Announce([]netip.Prefix{vip2, vip1}, st.pref); err != nil {
			t.Fatalf("%s: Announce: %v", st.name, err)
		}
		var got map[netip.Prefix]ribPath
		if _, err := testenv.Poll(context.Background(), 5*time.Second, 20*time.Millisecond, func() bool {
			got = rib(t, router, bgp.RF_IPv4_UC)
			return cmp.Equal(st.want, got)
		}); err != nil {
			t.Fatalf("%s: router's RIB (-want +got):\n%s", st.name, cmp.Diff(st.want, got))
		}
		if d := cmp.Diff(st.ann, edge.Status().Announced, cmpPrefix); d != "" {
			t.Errorf("%s: Status().Announced (-want +got):\n%s", st.name, d)
		}
	}
	// A second call with the same state changes nothing.
	if err := edge.Announce([]netip.Prefix{vip1, vip2}, Normal); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(edge.met.announced.WithLabelValues("normal")); got != 2 {
		t.Errorf("announced prefixes gauge (normal) = %v, want 2", got)
	}

	// Dropping vip2 from the set withdraws it alone; an IPv6 /128 goes out with
	// Config.NextHop6.
	if err := edge.Announce([]netip.Prefix{vip1, vip6}, Normal); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() string {
		want4 := map[netip.Prefix]ribPath{vip1: normal}
		want6 := map[netip.Prefix]ribPath{vip6: {ASPath: []uint32{65001}, Communities: []string{"65000:100"}, NextHop: nh6.String()}}
		if d := cmp.Diff(want4, rib(t, router, bgp.RF_IPv4_UC)); d != "" {
			return "ipv4 RIB (-want +got):\n" + d
		}
		if d := cmp.Diff(want6, rib(t, router, bgp.RF_IPv6_UC)); d != "" {
			return "ipv6 RIB (-want +got):\n" + d
		}
		return ""
	})

	st := edge.Status()
	if p := st.Peers[0]; p.EstablishedAt.IsZero() || p.BFD != "" {
		t.Errorf("peer status %+v: want an established time and no BFD", p)
	}
	if _, err := json.Marshal(st); err != nil {
		t.Errorf("Status is not JSON-serializable: %v", err)
	}
	if rs := router.Status().Peers[0]; rs.Received != 2 || rs.Accepted != 2 {
		t.Errorf("router's peer status: received %d accepted %d, want 2 and 2", rs.Received, rs.Accepted)
	}
	b, _ := json.Marshal(st)
	t.Logf("edge status: %s", b)
	_ = edgeReg
}

// TestAnnounceRejects checks what Announce refuses, before any session.
func TestAnnounceRejects(t *testing.T) {
	c := validConfig()
	met, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(c, zaptest.NewLogger(t), met)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"10.0.0.0/24", "fd00::1/128"} {
		if err := s.Announce([]netip.Prefix{netip.MustParsePrefix(p)}, Normal); err == nil {
			t.Errorf("Announce(%s) = nil, want an error", p)
		}
	}
	if err := s.Announce([]netip.Prefix{vip1}, Depreferenced); err != nil {
		t.Errorf("Announce before Run = %v, want nil (kept for Run)", err)
	}
	if d := cmp.Diff([]Announcement{{vip1, Depreferenced}}, s.Status().Announced, cmpPrefix); d != "" {
		t.Errorf("Status().Announced (-want +got):\n%s", d)
	}
}

// TestSessionUpBeforeRun: every configured peer has its session_up series from
// the start, at 0, so an alert on session_up == 0 fires for a peer that never
// came up, not only for one that went down.
func TestSessionUpBeforeRun(t *testing.T) {
	reg := prometheus.NewRegistry()
	met, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	peers := []Peer{{Addr: netip.MustParseAddr("192.0.2.1"), ASN: 65000}, {Addr: netip.MustParseAddr("2001:db8::1"), ASN: 65000}}
	if _, err := New(Config{ASN: 65001, RouterID: netip.MustParseAddr("10.0.0.1"), Peers: peers}, zaptest.NewLogger(t), met); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(met.sessionUp); n != len(peers) {
		t.Fatalf("session_up has %d series, want one per peer (%d)", n, len(peers))
	}
	for _, p := range peers {
		if got := testutil.ToFloat64(met.sessionUp.WithLabelValues(p.Addr.String())); got != 0 {
			t.Errorf("session_up{peer=%s} = %v before Run, want 0", p.Addr, got)
		}
	}
}
