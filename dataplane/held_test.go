package dataplane

import (
	"net/netip"
	"testing"

	"github.com/portico-edge/portico/dataplane/bpftest"
)

// TestPinHeld: a connection silent through a whole transition follows the
// current ring afterwards (bpf/README.md's limit), unless its holder reported
// it (OffRing there) and this director pinned it (PinHeld): then it reaches its
// holder, after the transition too. A report of an unknown holder, or of a UDP
// flow, pins nothing; the same report again writes nothing. Once the holder
// stops reporting it (UnpinHeld), the connection follows the ring again; a pin
// that names another replica is not the holder's to remove.
func TestPinHeld(t *testing.T) {
	bpftest.Require(t)
	dr := newDirector(t, "d")
	a := []Backend{r1, r2}
	b := []Backend{r1, r2, r4}
	silent := flowWhere(t, 41000, [][]Backend{a, b}, r2, r4)
	reported := flowWhere(t, silent.SPort+1, [][]Backend{a, b}, r2, r4)
	stays := flowWhere(t, reported.SPort+1, [][]Backend{a, b}, r2, r2)
	var clock uint64
	dr.apply(t, desired(a...))
	if off := dr.d.OffRing(r2.Addr, []Flow{flowOf(reported), flowOf(stays)}, false); len(off) != 0 {
		t.Fatalf("off the ring before the change: %v", off)
	}
	dr.apply(t, desired(b...))
	off := dr.d.OffRing(r2.Addr, []Flow{flowOf(reported), flowOf(stays)}, false)
	if len(off) != 1 || off[0] != flowOf(reported) {
		t.Fatalf("off the ring after r4 joined: %v, want only %v", off, flowOf(reported))
	}
	// While the edges' verdicts differ, every connection to a VIP is listed
	// (not one to an address that is no VIP).
	notVIP := flowOf(reported)
	notVIP.Dst = netip.MustParseAddr("198.51.100.77")
	if all := dr.d.OffRing(r2.Addr, []Flow{flowOf(reported), flowOf(stays), notVIP}, true); len(all) != 2 {
		t.Fatalf("every connection to a VIP: %v, want %v and %v", all, flowOf(reported), flowOf(stays))
	}
	// A holder this node does not know is skipped (UDP flows are pinned as
	// TCP connections are: TestUDPHeldPin).
	held := []Held{{Flow: off[0], Holder: r2.Addr}, {Flow: flowOf(silent), Holder: netip.MustParseAddr("10.0.0.99")}}
	if n, err := dr.d.PinHeld(held); err != nil || n != 1 {
		t.Fatalf("PinHeld wrote %d pins (%v), want 1", n, err)
	}
	if n, err := dr.d.PinHeld(held); err != nil || n != 0 {
		t.Fatalf("PinHeld again wrote %d pins (%v), want 0", n, err)
	}
	dr.endTransitions(t)
	// The directors' pin clock lapsed (no pin of theirs used for an hour):
	// the held pins count on their own clock, and their use does not revive
	// the directors' (which would make every SYN look at flows again).
	if err := dr.d.objs.PinClock.Put(uint32(0), uint64(0)); err != nil {
		t.Fatal(err)
	}
	k := flowOf(reported).key()
	var v lbFlowVal
	if err := dr.d.objs.Flows.Lookup(&k, &v); err != nil {
		t.Fatal(err)
	}
	v.LastSeenNs = 1 // long unused: its use now refreshes it, and a clock
	if err := dr.d.objs.Flows.Put(&k, &v); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if got := dr.send(t, reported, b...); got.Addr != r2.Addr {
			t.Errorf("after the transition the reported connection went to %s, want its holder %s", got.Addr, r2.Addr)
		}
	}
	if err := dr.d.objs.PinClock.Lookup(uint32(0), &clock); err != nil || clock != 0 {
		t.Errorf("pin clock %d (%v) after a held pin's use, want it left lapsed", clock, err)
	}
	if got := dr.send(t, silent, b...); got.Addr != r4.Addr {
		t.Errorf("after the transition a silent, unreported connection went to %s, want the current ring's %s", got.Addr, r4.Addr)
	}
	other := Held{Flow: flowOf(stays), Holder: r4.Addr}
	if n, err := dr.d.PinHeld([]Held{other}); err != nil || n != 1 {
		t.Fatalf("PinHeld of r4's report wrote %d pins (%v), want 1", n, err)
	}
	// A report repeated writes no pin, but keeps xdp_lb looking at pins: a
	// held connection may be silent for longer than LB_PIN_IDLE_SEC.
	if err := dr.d.objs.HeldClock.Put(uint32(0), uint64(1)); err != nil {
		t.Fatal(err)
	}
	if n, err := dr.d.PinHeld([]Held{other}); err != nil || n != 0 {
		t.Fatalf("PinHeld of the same report wrote %d pins (%v), want 0", n, err)
	}
	if err := dr.d.objs.HeldClock.Lookup(uint32(0), &clock); err != nil || clock <= 1 {
		t.Fatalf("held clock %d (%v) after a report of a held connection, want it refreshed", clock, err)
	}
	if n, err := dr.d.UnpinHeld([]Held{{Flow: flowOf(reported), Holder: r2.Addr}, {Flow: flowOf(stays), Holder: r2.Addr}}); err != nil || n != 1 {
		t.Fatalf("UnpinHeld removed %d pins (%v), want 1 (r2's own; the other names r4)", n, err)
	}
	if got := dr.send(t, reported, b...); got.Addr != r4.Addr {
		t.Errorf("after its holder stopped reporting it the connection went to %s, want the current ring's %s", got.Addr, r4.Addr)
	}
	if got := dr.send(t, stays, b...); got.Addr != r4.Addr {
		t.Errorf("a connection r4 reports went to %s, want r4", got.Addr)
	}
}
