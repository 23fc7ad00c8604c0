package dataplane

import (
	"slices"
	"testing"
	"time"

	"github.com/portico-edge/portico/dataplane/xdptest"
)

// TestUDPSeen: xdp_lb records the UDP flows this node's stack serves (its
// ring's, and those another director chose it for), and OwnUDP lists those
// that lived long enough and sent recently: what a holder reports for UDP,
// which leaves no socket per flow.
func TestUDPSeen(t *testing.T) {
	dr := newModelDirector(t, "r3's node")
	dr.apply(t, desired(r1, r2, r3))
	var here, there xdptest.Packet
	for sport := uint16(20000); !here.Src.IsValid() || !there.Src.IsValid(); sport++ {
		p := udp4(sport)
		switch pick(t, p, r1, r2, r3) {
		case r3.Addr:
			if !here.Src.IsValid() {
				here = p
			}
		case r1.Addr:
			if !there.Src.IsValid() {
				there = p
			}
		}
	}
	dr.run(t, "a UDP flow of this node's ring", here.Bytes(), xdptest.Pass)
	dr.run(t, "its next datagram", here.Bytes(), xdptest.Pass)
	// Another director (r1) chose this node for a flow the ring gives r1.
	dr.run(t, "a UDP flow another director sent here", withMACs(there.Bytes(), r1MAC, nicMAC), xdptest.Pass)
	// And one this node sends on is not this node's.
	dr.run(t, "a UDP flow of r1's", there.WithMACs(clientMAC, nicMAC).Bytes(), xdptest.TX)

	all, err := dr.d.OwnUDP(0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(all, func(a, b Flow) int { return int(a.SPort) - int(b.SPort) })
	want := []Flow{flowOf(here), flowOf(there)}
	slices.SortFunc(want, func(a, b Flow) int { return int(a.SPort) - int(b.SPort) })
	if !slices.Equal(all, want) {
		t.Fatalf("UDP flows served here: %v, want %v", all, want)
	}
	// Only flows that lived: here's first datagram came a minute ago.
	if lived, err := dr.d.OwnUDP(time.Second, time.Hour); err != nil || len(lived) != 0 {
		t.Fatalf("flows that lived 1 s: %v (%v), want none yet", lived, err)
	}
	k := flowOf(here).key()
	var v lbUdpSeenVal
	must(t, dr.d.objs.UdpSeen.Lookup(&k, &v))
	v.FirstNs -= uint64(time.Minute)
	must(t, dr.d.objs.UdpSeen.Put(&k, &v))
	if lived, err := dr.d.OwnUDP(time.Second, time.Hour); err != nil || !slices.Equal(lived, []Flow{flowOf(here)}) {
		t.Fatalf("flows that lived 1 s: %v (%v), want %v", lived, err, flowOf(here))
	}
	// One silent for longer than idle is over.
	v.LastNs -= uint64(2 * time.Minute)
	v.FirstNs -= uint64(2 * time.Minute)
	must(t, dr.d.objs.UdpSeen.Put(&k, &v))
	if lived, err := dr.d.OwnUDP(time.Second, time.Minute); err != nil || len(lived) != 0 {
		t.Fatalf("flows that sent within a minute: %v (%v), want none", lived, err)
	}
}

// TestUDPHeldPin: a UDP flow another edge reports holding is pinned to it
// (PinHeld) and goes there after the transition that moved its slot, whatever
// the ring says, until its holder stops reporting it.
func TestUDPHeldPin(t *testing.T) {
	dr := newDirector(t, "d")
	a := []Backend{r1, r2}
	b := []Backend{r1, r2, r4}
	p := flowWhereOf(t, udp4, 42000, [][]Backend{a, b}, r2, r4)
	dr.apply(t, desired(a...))
	dr.apply(t, desired(b...))
	held := []Held{{Flow: flowOf(p), Holder: r2.Addr}}
	if n, err := dr.d.PinHeld(held); err != nil || n != 1 {
		t.Fatalf("PinHeld wrote %d pins (%v), want 1", n, err)
	}
	dr.endTransitions(t)
	dr.retireCaches(t)
	if got := dr.send(t, p, b...); got.Addr != r2.Addr {
		t.Errorf("after the transition the reported UDP flow went to %s, want its holder %s", got.Addr, r2.Addr)
	}
	if n, err := dr.d.UnpinHeld(held); err != nil || n != 1 {
		t.Fatalf("UnpinHeld removed %d pins (%v), want 1", n, err)
	}
	if got := dr.send(t, p, b...); got.Addr != r4.Addr {
		t.Errorf("once no longer reported the UDP flow went to %s, want the ring's %s", got.Addr, r4.Addr)
	}
}
