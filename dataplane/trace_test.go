package dataplane

import (
	"net/netip"
	"testing"

	"github.com/portico-edge/portico/dataplane/xdptest"
)

func flowOf(p xdptest.Packet) Flow {
	return Flow{Src: p.Src, Dst: p.Dst, SPort: p.SPort, DPort: p.DPort, Protocol: p.Proto}
}

// TestTrace: what Trace reads about a flow is what xdp_lb does with it, on real
// maps: the rings of a transition in the order a chain walks them, the moved
// bit, and the pin its next packet leaves.
func TestTrace(t *testing.T) {
	dr := newDirector(t, "d")
	before, after := []Backend{r1, r2}, []Backend{r1, r2, r4}
	old := flowWhere(t, 30000, [][]Backend{before, after}, r1, r4) // moved by the change
	kept := flowWhere(t, 30000, [][]Backend{before, after}, r2, r2)
	dr.apply(t, desired(before...))

	tr, err := dr.d.Trace(flowOf(old))
	if err != nil {
		t.Fatal(err)
	}
	if !tr.VIP || tr.Moved || tr.Transition != 0 || len(tr.Rings) != 1 || tr.Rings[0].Backend.Addr != r1.Addr {
		t.Fatalf("before any change: %+v, want the current ring alone, naming %s", tr, r1.Addr)
	}
	if h := FlowHash(flowOf(old), dr.d.cfg.Seed); tr.Hash != h || tr.Slot != h%dr.d.opts.RingSize {
		t.Errorf("hash %#x slot %d, want %#x and that modulo the ring size %d", tr.Hash, tr.Slot, h, dr.d.opts.RingSize)
	}

	dr.apply(t, desired(after...))
	tr, err = dr.d.Trace(flowOf(old))
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Addr{r1.Addr, r4.Addr}
	if !tr.Moved || tr.Transition == 0 || len(tr.Rings) != 2 || tr.Rings[0].Ring != "previous" || tr.Rings[0].Backend.Addr != want[0] ||
		tr.Rings[1].Ring != "current" || tr.Rings[1].Backend.Addr != want[1] {
		t.Fatalf("in the transition: %+v, want moved, previous %s, current %s", tr, want[0], want[1])
	}
	if tr.Pinned != nil || tr.New != nil {
		t.Errorf("pins before any packet: %+v %+v", tr.Pinned, tr.New)
	}
	if got := dr.send(t, old, after...); got.Addr != r1.Addr {
		t.Fatalf("the older flow went to %s, want %s", got.Addr, r1.Addr)
	}
	if tr, err = dr.d.Trace(flowOf(old)); err != nil {
		t.Fatal(err)
	}
	if tr.Pinned == nil || tr.Pinned.Backend.Addr != r1.Addr {
		t.Errorf("after its packet: pin %+v, want one to %s", tr.Pinned, r1.Addr)
	}

	if tr, err = dr.d.Trace(flowOf(kept)); err != nil {
		t.Fatal(err)
	}
	if tr.Moved || tr.Rings[len(tr.Rings)-1].Backend.Addr != r2.Addr {
		t.Errorf("a flow the change did not move: %+v", tr)
	}

	other := old
	other.Dst = netip.MustParseAddr("192.0.2.99")
	if tr, err = dr.d.Trace(flowOf(other)); err != nil || tr.VIP {
		t.Errorf("a flow to no VIP: %+v, %v", tr, err)
	}
	closed := flowOf(old)
	closed.DPort = 10247 // the VIP serves TCP 80 and UDP 53
	if tr, err = dr.d.Trace(closed); err != nil || !tr.VIP || !tr.Closed || len(tr.Rings) != 0 {
		t.Errorf("a flow to a port the VIP does not serve: %+v, %v; want a closed VIP, no rings", tr, err)
	}
}
