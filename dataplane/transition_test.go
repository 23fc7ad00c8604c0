package dataplane

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/portico-edge/portico/dataplane/bpftest"
	"github.com/portico-edge/portico/dataplane/xdptest"
)

// TestNoStateWithoutChange: new connections and their packets leave no entry
// while the rings do not change.
func TestNoStateWithoutChange(t *testing.T) {
	dr := newDirector(t, "d1")
	dr.apply(t, desired(r1, r2))
	for i := range 500 {
		p := tcp4(uint16(20000+i), xdptest.ACK)
		want := pick(t, p, r1, r2)
		if got := dr.send(t, syn(p), r1, r2); got.Addr != want {
			t.Fatalf("SYN %d went to %s, the ring says %s", i, got.Addr, want)
		}
		if got := dr.send(t, p, r1, r2); got.Addr != want {
			t.Fatalf("ACK %d went to %s, the ring says %s", i, got.Addr, want)
		}
		dr.send(t, udp4(uint16(20000+i)), r1, r2)
	}
	if pinned, news := dr.state(t); pinned+news != 0 {
		t.Errorf("500 connections and 500 UDP flows left %d pinned and %d new entries, want none", pinned, news)
	}
}

// TestTransition: around one change, on a director that saw the flows and on one
// that never did. A flow older than the change stays on its replica (pinned on its
// first packet after the change); a connection opened after it follows the new
// ring and stays there (remembered at its SYN, pinned by its next packet); a flow
// the change did not move needs no entry; an ICMP error follows the older flow and
// creates nothing.
func TestTransition(t *testing.T) {
	d1, d2 := newDirector(t, "d1"), newDirector(t, "d2")
	before, after := []Backend{r1, r2}, []Backend{r1, r2, r4}
	old := flowWhere(t, 30000, [][]Backend{before, after}, r1, r4) // moved by the change
	kept := flowWhere(t, 30000, [][]Backend{before, after}, r2, r2)
	fresh := flowWhere(t, old.SPort+1, [][]Backend{before, after}, r2, r4)
	for _, d := range []director{d1, d2} {
		d.apply(t, desired(before...))
	}
	d1.send(t, syn(old), before...)
	d1.send(t, old, before...)
	d1.send(t, syn(kept), before...)

	for _, d := range []director{d1, d2} {
		d.apply(t, desired(after...))
	}
	for _, d := range []director{d1, d2} {
		if got := d.send(t, old, after...); got.Addr != r1.Addr {
			t.Errorf("%s: the older flow went to %s, want its replica %s", d.name, got.Addr, r1.Addr)
		}
		if got := d.send(t, kept, after...); got.Addr != r2.Addr {
			t.Errorf("%s: a flow the change did not move went to %s", d.name, got.Addr)
		}
	}
	for _, d := range []director{d1, d2} {
		if pinned, news := d.state(t); pinned != 1 || news != 0 {
			t.Errorf("%s: %d pinned, %d new entries, want the older flow pinned alone", d.name, pinned, news)
		}
	}
	if got := d1.send(t, syn(fresh), after...); got.Addr != r4.Addr {
		t.Errorf("a connection opened after the change went to %s, want %s", got.Addr, r4.Addr)
	}
	for range 3 {
		if got := d1.send(t, fresh, after...); got.Addr != r4.Addr {
			t.Errorf("its next packet went to %s, want %s", got.Addr, r4.Addr)
		}
	}
	if pinned, news := d1.state(t); pinned != 2 || news != 0 {
		t.Errorf("d1: %d pinned, %d new entries, want 2 (the older flow; the new connection, by its handshake's ACK) and 0", pinned, news)
	}

	// An ICMP error about the older flow (sent by a router on the path of the
	// replica's reply) reaches that replica and pins nothing, on a director that
	// never saw the flow.
	d3 := newDirector(t, "d3")
	d3.apply(t, desired(before...))
	d3.apply(t, desired(after...))
	reply := old
	reply.Src, reply.Dst, reply.SPort, reply.DPort = old.Dst, old.Src, old.DPort, old.SPort
	reply.Payload = make([]byte, 1400)
	icmp := xdptest.ICMPError(clientMAC, nicMAC, router4, vip4, 3, 4, 1280, reply.IP()[:28])
	if got := d3.sendFrame(t, icmp, after...); got.Addr != r1.Addr {
		t.Errorf("the ICMP error went to %s, want the older flow's replica %s", got.Addr, r1.Addr)
	}
	if pinned, news := d3.state(t); pinned+news != 0 {
		t.Errorf("an ICMP error left %d entries", pinned+news)
	}

	// The transition over, the older flow stays where it was pinned; a flow that
	// sent nothing during it follows the current ring.
	silent := flowWhere(t, fresh.SPort+1, [][]Backend{before, after}, r1, r4)
	d1.endTransitions(t)
	if got := d1.send(t, old, after...); got.Addr != r1.Addr {
		t.Errorf("after the transition the pinned flow went to %s, want %s", got.Addr, r1.Addr)
	}
	if got := d1.send(t, silent, after...); got.Addr != r4.Addr {
		t.Errorf("after the transition a flow silent throughout went to %s, want the current ring's %s", got.Addr, r4.Addr)
	}
}

// TestTransitionTwoChanges: a second change within the transition keeps the ring
// from before the first as the previous one, so flows older than both stay, and a
// connection opened between the two stays on the replica it started on, also when
// the second change moves its slot (then it is pinned for good). Draining and
// removed replicas: a draining replica keeps its flows, a removed one's go where
// the rings say.
func TestTransitionTwoChanges(t *testing.T) {
	dr := newDirector(t, "d1")
	a := []Backend{r1, r2}
	b := []Backend{r1, r2, r4}
	c := []Backend{r1, draining(r2), r4}
	serving := []Backend{r1, r4}                                // c's ring
	f0 := flowWhere(t, 40000, [][]Backend{a, b}, r2, r4)        // older than both
	f1 := flowWhere(t, 40000, [][]Backend{a, b}, r1, r2)        // opened between them
	gone := flowWhere(t, f1.SPort+1, [][]Backend{a, b}, r1, r1) // its replica is removed later
	dr.apply(t, desired(a...))
	dr.send(t, syn(f0), a...)
	dr.send(t, syn(gone), a...)

	dr.apply(t, desired(b...))
	if got := dr.send(t, syn(f1), b...); got.Addr != r2.Addr {
		t.Fatalf("a connection opened after the first change went to %s, want %s", got.Addr, r2.Addr)
	}
	dr.apply(t, desired(c...))
	if want := pick(t, f1, serving...); want == r2.Addr {
		t.Fatalf("f1's slot should move off draining r2")
	}
	if got := dr.send(t, f0, b...); got.Addr != r2.Addr {
		t.Errorf("a flow older than both changes went to %s, want its draining replica %s", got.Addr, r2.Addr)
	}
	if got := dr.send(t, f1, b...); got.Addr != r2.Addr {
		t.Errorf("a connection opened between the changes went to %s, want its draining replica %s", got.Addr, r2.Addr)
	}
	if pinned, _ := dr.state(t); pinned != 2 {
		t.Errorf("%d pinned flows, want 2 (f0, and f1 moved by the second change)", pinned)
	}
	dr.endTransitions(t)
	for _, f := range []xdptest.Packet{f0, f1} {
		if got := dr.send(t, f, b...); got.Addr != r2.Addr {
			t.Errorf("after the transition, pinned flow %d went to %s, want %s", f.SPort, got.Addr, r2.Addr)
		}
	}

	// r1 removed: its flow goes where the rings say, even though it was there
	// first.
	dr.apply(t, desired(draining(r2), r4))
	if got := dr.send(t, gone, b...); got.Addr != r4.Addr {
		t.Errorf("the flow of removed r1 went to %s, want %s", got.Addr, r4.Addr)
	}
}

// TestExpireEndsTransitions: once its lease has passed, Expire clears a VIP's
// transition (lease and previous ring), so the program reads no clock for it; a
// flow older than the change then goes where the current ring says, unpinned.
func TestExpireEndsTransitions(t *testing.T) {
	bpftest.Require(t)
	pin := testPinPath()
	d, err := Load(Options{PinPath: pin, RingSize: testRing, FlowEntries: 4096, Transition: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close(); Uninstall(pin) })
	if err := d.SetMAC(nicMAC); err != nil {
		t.Fatal(err)
	}
	dr := director{"d1", d}
	before, after := []Backend{r1, r2}, []Backend{r1, r2, r4}
	old := flowWhere(t, 30000, [][]Backend{before, after}, r1, r4)
	dr.apply(t, desired(before...))
	dr.apply(t, desired(after...))
	leases := map[uint32]time.Duration{}
	for vip, until := range d.st.prevUntil {
		leases[vip] = until
	}
	if len(leases) == 0 {
		t.Fatal("no transition after a change")
	}
	transitions := func() []time.Duration {
		vs, err := d.VIPs()
		if err != nil {
			t.Fatal(err)
		}
		var out []time.Duration
		for _, v := range vs {
			out = append(out, v.Transition)
		}
		return out
	}
	if got := transitions(); len(got) == 0 || got[0] <= 0 || got[0] > 300*time.Millisecond {
		t.Errorf("VIPs report transitions %v, want under way (at most 300ms)", got)
	}
	if err := d.Expire(); err != nil {
		t.Fatal(err)
	}
	last := time.Duration(0)
	for vip, until := range leases {
		// Checked after Expire: if the lease still runs now, it ran when Expire looked.
		if monotonicNow() < until && d.st.prevUntil[vip] == 0 {
			t.Errorf("vip %d: Expire ended a transition within its lease", vip)
		}
		last = max(last, until)
	}
	time.Sleep(last - monotonicNow() + 10*time.Millisecond)
	if err := d.Expire(); err != nil {
		t.Fatal(err)
	}
	for vip := range d.st.rings {
		var m lbRingMeta
		if err := d.objs.RingsMeta.Lookup(vip, &m); err != nil {
			t.Fatal(err)
		}
		var prev *ebpf.Map
		err := d.objs.PrevRings.Lookup(vip, &prev)
		if err == nil {
			prev.Close()
		}
		if m.PrevUntilNs != 0 || !errors.Is(err, ebpf.ErrKeyNotExist) {
			t.Errorf("vip %d: after Expire lease %d, previous ring lookup %v; want 0 and none", vip, m.PrevUntilNs, err)
		}
	}
	if got := dr.send(t, old, after...); got.Addr != r4.Addr {
		t.Errorf("after the transition the older flow went to %s, want the current ring's %s", got.Addr, r4.Addr)
	}
	if got := transitions(); slices.ContainsFunc(got, func(d time.Duration) bool { return d != 0 }) {
		t.Errorf("VIPs report transitions %v after Expire, want none", got)
	}
	if pinned, news := dr.state(t); pinned+news != 0 {
		t.Errorf("%d pinned and %d new entries after the transition, want none", pinned, news)
	}
}

// TestPinLapsesInTheCache: when pins lapse (no pin used for LB_PIN_IDLE_SEC, and
// Expire clears the clock), a flow this CPU's cache holds as pinned follows the
// ring again, as it would without the cache; a SYN reusing its 5-tuple then
// would not have retired the entry.
func TestPinLapsesInTheCache(t *testing.T) {
	dr := newDirector(t, "d1")
	before, after := []Backend{r1, r2}, []Backend{r1, r2, r4}
	old := flowWhere(t, 30000, [][]Backend{before, after}, r1, r4)
	dr.apply(t, desired(before...))
	dr.apply(t, desired(after...))
	for range 2 { // pinned, then served from the cache as pinned
		if got := dr.send(t, old, after...); got.Addr != r1.Addr {
			t.Fatalf("in the transition the older flow went to %s, want %s", got.Addr, r1.Addr)
		}
	}
	dr.endTransitions(t)
	if err := dr.d.objs.PinClock.Put(uint32(0), uint64(0)); err != nil {
		t.Fatal(err)
	}
	if got := dr.send(t, old, after...); got.Addr != r4.Addr {
		t.Errorf("with pins lapsed the cached pinned flow went to %s, want the ring's %s", got.Addr, r4.Addr)
	}
}
