package bgp

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/portico-edge/portico/test/testenv"
)

// peerState is one peer of s.Status(), "" if s has no such peer.
func peerState(s *Speaker, addr netip.Addr) (PeerStatus, bool) {
	for _, p := range s.Status().Peers {
		if p.Addr == addr {
			return p, true
		}
	}
	return PeerStatus{}, false
}

// TestReconfigureLoopback runs an edge speaker against two "routers" over
// loopback (no root needed) and changes its peers while it runs: a second peer
// is added, the first one's timers and BFD change, the first one is removed.
// Each step must leave the sessions it does not concern alone (same
// established time, no new transition), and the routers must see the change.
func TestReconfigureLoopback(t *testing.T) {
	ports := testenv.Ports(t, 2)
	edgeAddr := netip.MustParseAddr("127.0.0.1")
	routerA, _ := startSpeaker(t, "router-a", Config{ASN: 65000, RouterID: netip.MustParseAddr("10.0.0.2"), ListenPort: int32(ports[0]),
		Peers: []Peer{{Addr: edgeAddr, ASN: 65001, Passive: true}}})
	routerB, _ := startSpeaker(t, "router-b", Config{ASN: 65000, RouterID: netip.MustParseAddr("10.0.0.3"), ListenPort: int32(ports[1]),
		Peers: []Peer{{Addr: edgeAddr, ASN: 65001, Passive: true}}})
	a := Peer{Addr: netip.MustParseAddr("127.0.0.2"), ASN: 65000, Port: ports[0]}
	b := Peer{Addr: netip.MustParseAddr("127.0.0.3"), ASN: 65000, Port: ports[1], Communities: []string{"65000:200"}}
	edge, _ := startSpeaker(t, "edge", Config{ASN: 65001, RouterID: netip.MustParseAddr("10.0.0.1"), Peers: []Peer{a}})
	ctx := context.Background()

	established := func(s *Speaker, addr netip.Addr) func() string {
		return func() string {
			if p, ok := peerState(s, addr); !ok || p.State != sessionEstablished {
				return fmt.Sprintf("session with %v: %+v (configured %v)", addr, p, ok)
			}
			return ""
		}
	}
	testenv.Eventually(t, 15*time.Second, established(edge, a.Addr))
	if err := edge.Announce([]netip.Prefix{vip1}, Normal); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() string {
		if _, ok := rib(t, routerA, bgp.RF_IPv4_UC)[vip1]; !ok {
			return "router a has no path to " + vip1.String()
		}
		return ""
	})
	first, _ := peerState(edge, a.Addr)
	// sessionStays checks that a's session is the one that came up first.
	sessionStays := func(step string) {
		t.Helper()
		p, _ := peerState(edge, a.Addr)
		if p.State != sessionEstablished || !p.EstablishedAt.Equal(first.EstablishedAt) {
			t.Errorf("%s: session with a is %s since %v, want established since %v (untouched)", step, p.State, p.EstablishedAt, first.EstablishedAt)
		}
		if n := testutil.ToFloat64(edge.met.sessionTransitions.WithLabelValues(a.Addr.String(), sessionEstablished)); n != 1 {
			t.Errorf("%s: a's session came up %v times, want once", step, n)
		}
	}
	changes := func(step string, want map[string]float64) {
		t.Helper()
		for _, c := range []string{peerAdded, peerRemoved, peerUpdated, peerRestarted, peerFailed} {
			if got := testutil.ToFloat64(edge.met.peerChanges.WithLabelValues(c)); got != want[c] {
				t.Errorf("%s: peer_changes_total{change=%q} = %v, want %v", step, c, got, want[c])
			}
		}
	}

	// A second peer: its session comes up, the first one's stays; the path
	// gets b's community, so every router sees it replaced.
	if err := edge.Reconfigure(ctx, []Peer{a, b}); err != nil {
		t.Fatalf("add b: %v", err)
	}
	testenv.Eventually(t, 15*time.Second, established(edge, b.Addr))
	testenv.Eventually(t, 5*time.Second, func() string {
		want := ribPath{ASPath: []uint32{65001}, Communities: []string{"65000:200"}, NextHop: "127.0.0.1"}
		for name, r := range map[string]*Speaker{"a": routerA, "b": routerB} {
			if d := cmp.Diff(map[netip.Prefix]ribPath{vip1: want}, rib(t, r, bgp.RF_IPv4_UC)); d != "" {
				return "router " + name + "'s RIB (-want +got):\n" + d
			}
		}
		return ""
	})
	sessionStays("add b")
	changes("add b", map[string]float64{peerAdded: 1})
	if got := testutil.ToFloat64(edge.met.peers); got != 2 {
		t.Errorf("peers gauge = %v, want 2", got)
	}

	// The same peers again: nothing happens.
	if err := edge.Reconfigure(ctx, []Peer{b, a}); err != nil {
		t.Fatal(err)
	}
	changes("same peers", map[string]float64{peerAdded: 1})

	// a's timers and BFD change: an update, the session stays.
	a2 := a
	a2.HoldTime, a2.BFD = 6*time.Second, &BFD{MinTx: 200 * time.Millisecond, MinRx: 200 * time.Millisecond, Multiplier: 5}
	if err := edge.Reconfigure(ctx, []Peer{a2, b}); err != nil {
		t.Fatalf("change a: %v", err)
	}
	changes("change a", map[string]float64{peerAdded: 1, peerUpdated: 1})
	time.Sleep(2 * bfdStartDelay) // syncBFD's turn: BFD on for a (the router has none; GoBGP's BFD waits)
	sessionStays("change a")

	// An invalid set changes nothing.
	if err := edge.Reconfigure(ctx, []Peer{a2, b, b}); err == nil || !strings.Contains(err.Error(), "listed twice") {
		t.Errorf("Reconfigure with b twice = %v, want an error naming it", err)
	}
	if err := edge.Reconfigure(ctx, []Peer{{Addr: netip.MustParseAddr("127.0.0.4"), ASN: 0}}); err == nil {
		t.Errorf("Reconfigure with asn 0 = nil, want an error")
	}
	if n := len(edge.Status().Peers); n != 2 {
		t.Errorf("after refused changes the speaker has %d peers, want 2", n)
	}
	sessionStays("refused")

	// a removed: router a's session ends, b's stays, a's series go.
	bUp, _ := peerState(edge, b.Addr)
	if err := edge.Reconfigure(ctx, []Peer{b}); err != nil {
		t.Fatalf("remove a: %v", err)
	}
	testenv.Eventually(t, 10*time.Second, func() string {
		if p, _ := peerState(routerA, edgeAddr); p.State == sessionEstablished {
			return "router a still has its session with the edge"
		}
		return ""
	})
	if _, ok := peerState(edge, a.Addr); ok {
		t.Errorf("edge still lists a after its removal")
	}
	if p, _ := peerState(edge, b.Addr); p.State != sessionEstablished || !p.EstablishedAt.Equal(bUp.EstablishedAt) {
		t.Errorf("b's session after a's removal: %s since %v, want established since %v", p.State, p.EstablishedAt, bUp.EstablishedAt)
	}
	if n := testutil.CollectAndCount(edge.met.sessionUp); n != 1 {
		t.Errorf("session_up has %d series after a's removal, want 1 (b)", n)
	}
	changes("remove a", map[string]float64{peerAdded: 1, peerUpdated: 1, peerRemoved: 1})
	testenv.Eventually(t, 5*time.Second, func() string {
		if got := testutil.ToFloat64(edge.met.established); got != 1 {
			return fmt.Sprintf("established sessions gauge = %v, want 1", got)
		}
		return ""
	})

	// b's ASN changes: the session restarts (GoBGP sends a new OPEN); router b
	// refuses the wrong AS, so it stays down.
	b2 := b
	b2.ASN = 65009
	if err := edge.Reconfigure(ctx, []Peer{b2}); err != nil {
		t.Fatalf("change b's asn: %v", err)
	}
	changes("b's asn", map[string]float64{peerAdded: 1, peerUpdated: 1, peerRemoved: 1, peerRestarted: 1})
	testenv.Eventually(t, 10*time.Second, func() string {
		if p, _ := peerState(edge, b.Addr); p.State == sessionEstablished {
			return "the session with b is still established with the wrong AS"
		}
		return ""
	})
}
