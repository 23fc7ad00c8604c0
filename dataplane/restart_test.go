package dataplane

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/portico-edge/portico/dataplane/bpftest"
	"github.com/portico-edge/portico/dataplane/xdptest"
)

// TestRestartStartsNoTransition: an agent restarted (the maps pinned, the same
// replicas) swaps no ring, so it neither starts a transition nor ends one early.
func TestRestartStartsNoTransition(t *testing.T) {
	dr := newDirector(t, "d1")
	dr.apply(t, desired(r1, r2))
	dr.apply(t, desired(r1, r2, r4)) // a transition under way
	until := dr.d.st.prevUntil
	again, err := Load(Options{PinPath: dr.d.opts.PinPath, RingSize: testRing, FlowEntries: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	stats, err := again.Apply(desired(r1, r2, r4))
	if err != nil {
		t.Fatal(err)
	}
	if stats.Rings != 0 {
		t.Errorf("the restarted agent swapped %d rings for the same replicas", stats.Rings)
	}
	for vip, u := range until {
		var m lbRingMeta
		if err := again.objs.RingsMeta.Lookup(vip, &m); err != nil {
			t.Fatal(err)
		}
		if time.Duration(m.PrevUntilNs) != u {
			t.Errorf("vip %d: transition until %v after the restart, was %v", vip, time.Duration(m.PrevUntilNs), u)
		}
	}
	// The older flow still goes to its replica through the restarted maps.
	old := flowWhere(t, 60000, [][]Backend{{r1, r2}, {r1, r2, r4}}, r1, r4)
	if got := (director{"restarted", again}).send(t, old, r1, r2, r4); got.Addr != r1.Addr {
		t.Errorf("after the restart the older flow went to %s, want %s", got.Addr, r1.Addr)
	}
}

// TestRestartKeepsHistory: a restarted agent reads a VIP's mid rings back in
// their order from the circle rings_meta describes, also once the circle has
// wrapped (more changes than it holds), and its next change adds to it.
func TestRestartKeepsHistory(t *testing.T) {
	dr := newDirector(t, "d1")
	var bs []Backend
	for i := range 7 {
		bs = append(bs, Backend{Addr: netip.AddrFrom4([4]byte{10, 0, 0, byte(30 + i)}), MAC: net.HardwareAddr{2, 0, 0, 0, 3, byte(i)}})
	}
	dr.apply(t, desired(bs...))
	changes := 0
	for i := range bs { // more distinct rings than the history holds
		for j := i + 1; j < len(bs) && changes < 20; j++ {
			st := slices.Clone(bs)
			st[i], st[j] = draining(st[i]), down(st[j])
			dr.apply(t, desired(st...))
			changes++
		}
	}
	vip := dr.d.st.vipIDs[vip4]
	mids := dr.d.st.midSlots[vip]
	if len(mids) != int(lbLbLimitsLB_MID_RINGS) || changes <= len(mids)+1 {
		t.Fatalf("%d mid rings after %d changes, want a full circle of %d that wrapped", len(mids), changes, lbLbLimitsLB_MID_RINGS)
	}
	again, err := Load(Options{PinPath: dr.d.opts.PinPath, RingSize: testRing, FlowEntries: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	got := again.st.midSlots[vip]
	if len(got) != len(mids) {
		t.Fatalf("restarted: %d mid rings, want %d", len(got), len(mids))
	}
	for k := range mids {
		if !slices.Equal(got[k], mids[k]) {
			t.Fatalf("restarted: mid ring %d (newest first) differs from the one written", k)
		}
	}
	if again.st.midHead[vip] != dr.d.st.midHead[vip] {
		t.Errorf("restarted: newest mid ring at place %d, want %d", again.st.midHead[vip], dr.d.st.midHead[vip])
	}
	cur := again.st.rings[vip]
	if _, err := again.Apply(desired(bs[:3]...)); err != nil { // one more change
		t.Fatal(err)
	}
	if after := again.st.midSlots[vip]; !slices.Equal(after[0], cur) || !slices.Equal(after[1], mids[0]) {
		t.Error("after the restart, a change does not make the replaced ring the newest mid ring before the others")
	}
}

// TestLoadReplacesRingsItCannotUse: pinned rings of another size, or of an
// earlier version's layout (lb_cfg.ring_layout 0), are replaced on Load instead
// of failing it: the first Apply fills new ones, which packets then follow. Rings
// of the same size and layout are kept (an ordinary restart or upgrade).
func TestLoadReplacesRingsItCannotUse(t *testing.T) {
	bpftest.Require(t)
	pin := testPinPath()
	t.Cleanup(func() { Uninstall(pin) })
	const other = 127
	load := func(size uint32) director {
		t.Helper()
		d, err := Load(Options{PinPath: pin, RingSize: size, FlowEntries: 4096})
		if err != nil {
			t.Fatalf("load with %d slots: %v", size, err)
		}
		if err := d.SetMAC(nicMAC); err != nil {
			t.Fatal(err)
		}
		return director{fmt.Sprintf("ring of %d", size), d}
	}
	ringSizes := func(dr director) []int {
		t.Helper()
		vs, err := dr.d.VIPs()
		if err != nil {
			t.Fatal(err)
		}
		var out []int
		for _, v := range vs {
			out = append(out, v.RingSize)
		}
		return out
	}
	p := tcp4(41000, xdptest.ACK)

	dr := load(testRing)
	dr.apply(t, desired(r1, r2))
	dr.d.Close()

	dr = load(other)
	if got := ringSizes(dr); slices.ContainsFunc(got, func(n int) bool { return n != 0 }) {
		t.Errorf("after a ring size change, rings of %v slots before the first Apply, want none", got)
	}
	dr.apply(t, desired(r1, r2))
	if got := ringSizes(dr); slices.ContainsFunc(got, func(n int) bool { return n != other }) {
		t.Errorf("rings of %v slots, want %d", got, other)
	}
	if got, want := dr.send(t, p, r1, r2).Addr, pickIn(t, other, p, r1, r2); got != want {
		t.Errorf("a flow went to %s, the ring of %d slots says %s", got, other, want)
	}
	dr.d.Close()

	dr = load(other)
	if got := ringSizes(dr); slices.ContainsFunc(got, func(n int) bool { return n != other }) {
		t.Errorf("a restart with the same ring size kept rings of %v slots, want %d", got, other)
	}
	dr.d.Close()

	// An earlier version, whose pins carry no layout version: its rings are
	// taken over where lb_cfg says they have this size and layout, and
	// replaced where not (ring_layout 0: the unpacked rings).
	for _, tc := range []struct {
		name   string
		layout uint16
		want   int
	}{{"same layout", uint16(lbLbLimitsLB_RING_LAYOUT), other}, {"unpacked rings", 0, 0}} {
		legacy := testPinPath()
		t.Cleanup(func() { Uninstall(legacy) })
		old, err := Load(Options{PinPath: legacy, RingSize: other, FlowEntries: 4096, legacyPins: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := old.SetMAC(nicMAC); err != nil {
			t.Fatal(err)
		}
		director{"earlier version", old}.apply(t, desired(r1, r2))
		old.cfg.RingLayout = tc.layout
		if err := old.writeConfig(); err != nil {
			t.Fatal(err)
		}
		old.Close()
		d, err := Load(Options{PinPath: legacy, RingSize: other, FlowEntries: 4096})
		if err != nil {
			t.Fatalf("%s: load over an earlier version's pins: %v", tc.name, err)
		}
		got := ringSizes(director{tc.name, d})
		d.Close()
		if len(got) == 0 || slices.ContainsFunc(got, func(n int) bool { return n != tc.want }) {
			t.Errorf("over an earlier version's rings (%s), rings of %v slots before the first Apply, want %d", tc.name, got, tc.want)
		}
	}
}

// loadAt loads a data plane with the tests' ring and flow sizes and the NIC's MAC.
func loadAt(t *testing.T, o Options) *Dataplane {
	t.Helper()
	o.RingSize, o.FlowEntries = testRing, 4096
	d, err := Load(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.SetMAC(nicMAC); err != nil {
		t.Fatal(err)
	}
	return d
}

// ownSYNPasses: a new connection in a slot of the local replica (local says
// which SYNs land there) goes to this node's stack.
func ownSYNPasses(t *testing.T, d *Dataplane, local func(xdptest.Packet) bool) {
	t.Helper()
	for i := range 400 {
		p := tcp4(uint16(40000+i), xdptest.SYN)
		if !local(p) {
			continue
		}
		verdict, _, err := xdptest.Run(d.Program(), p.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		if verdict != xdptest.Pass {
			t.Fatalf("a new connection in the local replica's slot: verdict %s, want PASS", xdptest.VerdictName(verdict))
		}
		return
	}
	t.Fatal("no SYN of 400 in the local replica's slots")
}

// transitionOf is how long vip4's transition still runs (0: none).
func transitionOf(t *testing.T, d *Dataplane) time.Duration {
	t.Helper()
	vs, err := d.VIPs()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		if v.Addr == vip4 {
			return v.Transition
		}
	}
	t.Fatal("vip4 not in the maps")
	return 0
}

// TestArrival: a new director (Options.Arrival, nothing pinned) starts in a
// transition from the ring the others held before its replica joined: older
// flows go where that ring says, also those of a draining replica and those whose
// slot is now its own replica's; new connections follow the current ring. Without
// Arrival, or with rings already pinned (a restart), no transition starts.
func TestArrival(t *testing.T) {
	bpftest.Require(t)
	load := func(pin string, arrival bool) *Dataplane {
		return loadAt(t, Options{PinPath: pin, Arrival: arrival})
	}
	transition := func(d *Dataplane) time.Duration { return transitionOf(t, d) }
	bs := []Backend{r1, draining(r2), r3}
	members := []MaglevBackend{{Addr: r1.Addr}, {Addr: r2.Addr}, {Addr: r3.Addr}}
	before, err := arrivalTable(bs, members, testRing)
	if err != nil {
		t.Fatal(err)
	}
	serving := func(a netip.Addr) bool { return a == r1.Addr || a == r3.Addr }
	all, err := BuildTable(members, testRing)
	if err != nil {
		t.Fatal(err)
	}
	some, err := BuildTable([]MaglevBackend{{Addr: r1.Addr}, {Addr: r3.Addr}}, testRing)
	if err != nil {
		t.Fatal(err)
	}
	now := all.Fill(serving, some)
	pickOf := func(tab Table, p xdptest.Packet) netip.Addr {
		f := Flow{Src: p.Src, Dst: p.Dst, SPort: p.SPort, DPort: p.DPort, Protocol: p.Proto}
		return tab.Backends[tab.Slots[FlowHash(f, testSeed)%testRing]]
	}

	pin := testPinPath()
	d := load(pin, true)
	t.Cleanup(func() { Uninstall(pin) })
	dr := director{"new", d}
	dr.apply(t, desired(bs...))
	if tr := transition(d); tr <= 0 {
		t.Fatalf("a new director with Arrival: transition %v, want one under way", tr)
	}
	onDraining, onOwnSlots := 0, 0
	for i := range 400 {
		p := tcp4(uint16(30000+i), xdptest.ACK)
		was, is := pickOf(before, p), pickOf(now, p)
		if was == r3.Addr {
			t.Fatalf("the arrival ring names the local replica for %v", p.SPort)
		}
		// Its chain names where the others sent it, and the walk starts at
		// the chain's first in its order (r1 and the draining r2 both serve:
		// by address), which hands it on to the next if it does not have it.
		tr, err := d.Trace(Flow{Src: p.Src, Dst: p.Dst, SPort: p.SPort, DPort: p.DPort, Protocol: p.Proto})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(tr.Rings, func(r TraceRing) bool { return r.Backend.Addr == was }) {
			t.Fatalf("older flow %d: the rings give %+v, none where the others sent it (%s)", p.SPort, tr.Rings, was)
		}
		first := was
		if is != r3.Addr && is.Less(was) {
			first = is
		}
		if got := dr.send(t, p, r1, r2); got.Addr != first {
			t.Fatalf("older flow %d went to %s, want %s (the first of its chain: the others sent it to %s; the current ring says %s)", p.SPort, got.Addr, first, was, is)
		}
		switch {
		case was == r2.Addr:
			onDraining++
		case was != is && is == r3.Addr:
			onOwnSlots++
		}
	}
	if onDraining == 0 || onOwnSlots == 0 {
		t.Fatalf("flows on the draining replica %d, in slots that are now the local replica's %d: the test proves nothing", onDraining, onOwnSlots)
	}
	t.Logf("of 400 older flows, %d on the draining replica and %d in the local replica's new slots went where the others sent them", onDraining, onOwnSlots)
	ownSYNPasses(t, d, func(p xdptest.Packet) bool { return pickOf(now, p) == r3.Addr })
	d.Close()

	// A restart finds the rings pinned: nothing new starts (the lease above runs on).
	d = load(pin, true)
	if d.arriving {
		t.Error("a restart with pinned rings arrives again")
	}
	d.Close()

	// Without Arrival a new data plane starts without a transition.
	pin2 := testPinPath()
	d = load(pin2, false)
	t.Cleanup(func() { d.Close(); Uninstall(pin2) })
	director{"plain", d}.apply(t, desired(bs...))
	if tr := transition(d); tr != 0 {
		t.Errorf("without Arrival: transition %v, want none", tr)
	}
}

// TestRejoin: a restarted agent (Options.Rejoin, rings pinned) replays its own
// replica's down before its first state: the other edges called it down while
// it restarted, and connections they opened then, in slots that are its own
// again, live where the down ring sent them. A first start (nothing pinned)
// starts no transition.
func TestRejoin(t *testing.T) {
	bpftest.Require(t)
	load := func(pin string) *Dataplane { return loadAt(t, Options{PinPath: pin, Rejoin: true}) }
	transition := func(d *Dataplane) time.Duration { return transitionOf(t, d) }
	bs := []Backend{r1, r2, r3}
	all, err := BuildTable([]MaglevBackend{{Addr: r1.Addr}, {Addr: r2.Addr}, {Addr: r3.Addr}}, testRing)
	if err != nil {
		t.Fatal(err)
	}
	others, err := BuildTable([]MaglevBackend{{Addr: r1.Addr}, {Addr: r2.Addr}}, testRing)
	if err != nil {
		t.Fatal(err)
	}
	downRing := all.Fill(func(a netip.Addr) bool { return a != r3.Addr }, others)
	pickOf := func(tab Table, p xdptest.Packet) netip.Addr {
		f := Flow{Src: p.Src, Dst: p.Dst, SPort: p.SPort, DPort: p.DPort, Protocol: p.Proto}
		return tab.Backends[tab.Slots[FlowHash(f, testSeed)%testRing]]
	}

	pin := testPinPath()
	t.Cleanup(func() { Uninstall(pin) })
	d := load(pin)
	if d.rejoining {
		t.Error("a first start, nothing pinned, rejoins")
	}
	director{"first", d}.apply(t, desired(bs...))
	if tr := transition(d); tr != 0 {
		t.Errorf("a first start: transition %v, want none", tr)
	}
	d.Close()

	d = load(pin)
	defer d.Close()
	if !d.rejoining {
		t.Fatal("a restart with pinned rings does not rejoin")
	}
	dr := director{"restarted", d}
	dr.apply(t, desired(bs...))
	if tr := transition(d); tr <= 0 {
		t.Fatalf("a restart with Rejoin: transition %v, want one under way", tr)
	}
	moved := 0
	for i := range 400 {
		p := tcp4(uint16(30000+i), xdptest.ACK)
		if pickOf(all, p) != r3.Addr {
			continue
		}
		moved++
		want := pickOf(downRing, p)
		if got := dr.send(t, p, r1, r2); got.Addr != want {
			t.Fatalf("a connection opened while the others called this node down, in its slot: went to %s, want %s (where the down ring sent it)", got.Addr, want)
		}
	}
	if moved == 0 {
		t.Fatal("no flow in the local replica's slots: the test proves nothing")
	}
	t.Logf("%d connections in the restarted node's slots, opened while it was called down, went where the others sent them", moved)
	// A new connection in its slots is its own.
	ownSYNPasses(t, d, func(p xdptest.Packet) bool { return pickOf(all, p) == r3.Addr })
	// Its next Apply is a plain one.
	if d.rejoining {
		t.Error("still rejoining after the first Apply")
	}
}
