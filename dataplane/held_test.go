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
// flow, pins nothing; the same report again writes nothing.
func TestPinHeld(t *testing.T) {
	bpftest.Require(t)
	dr := newDirector(t, "d")
	a := []Backend{r1, r2}
	b := []Backend{r1, r2, r4}
	silent := flowWhere(t, 41000, [][]Backend{a, b}, r2, r4)
	reported := flowWhere(t, silent.SPort+1, [][]Backend{a, b}, r2, r4)
	stays := flowWhere(t, reported.SPort+1, [][]Backend{a, b}, r2, r2)
	dr.apply(t, desired(a...))
	if off := dr.d.OffRing(r2.Addr, []Flow{flowOf(reported), flowOf(stays)}); len(off) != 0 {
		t.Fatalf("off the ring before the change: %v", off)
	}
	dr.apply(t, desired(b...))
	off := dr.d.OffRing(r2.Addr, []Flow{flowOf(reported), flowOf(stays)})
	if len(off) != 1 || off[0] != flowOf(reported) {
		t.Fatalf("off the ring after r4 joined: %v, want only %v", off, flowOf(reported))
	}
	held := []Held{{Flow: off[0], Holder: r2.Addr}, {Flow: flowOf(silent), Holder: netip.MustParseAddr("10.0.0.99")}}
	udp := flowOf(udp4(41999))
	held = append(held, Held{Flow: udp, Holder: r2.Addr})
	if n, err := dr.d.PinHeld(held); err != nil || n != 1 {
		t.Fatalf("PinHeld wrote %d pins (%v), want 1", n, err)
	}
	if n, err := dr.d.PinHeld(held); err != nil || n != 0 {
		t.Fatalf("PinHeld again wrote %d pins (%v), want 0", n, err)
	}
	dr.endTransitions(t)
	if got := dr.send(t, reported, b...); got.Addr != r2.Addr {
		t.Errorf("after the transition the reported connection went to %s, want its holder %s", got.Addr, r2.Addr)
	}
	if got := dr.send(t, silent, b...); got.Addr != r4.Addr {
		t.Errorf("after the transition a silent, unreported connection went to %s, want the current ring's %s", got.Addr, r4.Addr)
	}
}
