package dataplane

import (
	"net"
	"slices"
	"testing"

	"github.com/portico-edge/portico/dataplane/xdptest"
)

// TestRescue: a frame walked to this node (r3), whose chain has nothing above
// it, while the walk's edges called a replica down that this node calls
// serving (the mark's downs: r1) and placed below itself. The walk passed r1
// by; this node hands the frame once more, to r1, marked to be served there
// and never sent on (LB_MARK_RESCUE). With no downs (the edges agree) it ends
// here as before. As the rescued node, it serves what its stack has and ends
// the rest as a chain's end does.
func TestRescue(t *testing.T) {
	dr := newModelDirector(t, "r3's node")
	dr.apply(t, desired(r1, r2, r3))
	dr.endTransitions(t)
	var p xdptest.Packet
	for sport := uint16(30000); ; sport++ {
		if p = tcp4(sport, xdptest.ACK); pick(t, p, r1, r2, r3) == r1.Addr {
			break
		}
	}
	vip := dr.d.st.vipIDs[vip4]
	settled := func() { must(t, dr.d.objs.RingChanged.Put(vip, uint64(0))) }
	settled()
	// r2 directed it (its tag: 0x000c) and walked it here as serving; r1's
	// bit (address ending in 3) in the downs, or none.
	walked := func(downs int) []byte {
		return withMACs(xdptest.WithTag(xdptest.WithTCPMark(to(p, r3), xdptest.MarkTagged|downs<<12|1<<8|1), 0x000c), r2MAC, nicMAC)
	}
	rescues := func() uint64 {
		c, err := dr.d.Counters()
		if err != nil {
			t.Fatal(err)
		}
		return c.Reasons[lbReasonREASON_HANDOFF_RESCUE]
	}

	dr.run(t, "walked here, the edges agree", walked(0), xdptest.Pass)
	out := dr.run(t, "walked here, r2 calls r1 down", walked(8), xdptest.TX)
	want := withMACs(xdptest.WithTag(xdptest.WithTCPMark(to(p, r3), int(lbLbLimitsLB_MARK_RESCUE)), 0x000c), nicMAC, r1MAC)
	if !slices.Equal(out, want) {
		m, _ := xdptest.TCPMark(out)
		t.Fatalf("rescued to %s with mark %#x, want r1 with LB_MARK_RESCUE (%#x)", net.HardwareAddr(out[:6]), m, int(lbLbLimitsLB_MARK_RESCUE))
	}
	if !xdptest.TCPChecksumOK(out) {
		t.Error("rescued frame: TCP checksum wrong")
	}
	if n := rescues(); n != 1 {
		t.Errorf("reason handoff_rescue counted %d, want 1", n)
	}
	// As the rescued node: r1 sent it here.
	rescued := func(mark int) []byte {
		return withMACs(xdptest.WithTCPMark(to(p, r3), mark), r1MAC, nicMAC)
	}
	f := Flow{Src: p.Src, Dst: p.Dst, SPort: p.SPort, DPort: p.DPort, Protocol: p.Proto}
	must(t, dr.d.objs.SockModel.Put(f.key(), uint32(1)))
	dr.run(t, "rescued, a connection here", rescued(int(lbLbLimitsLB_MARK_RESCUE)), xdptest.Pass)
	dr.run(t, "rescued by a settling edge, a connection here", rescued(int(lbLbLimitsLB_MARK_RESCUE_WAIT)), xdptest.Pass)
	must(t, dr.d.objs.SockModel.Delete(f.key()))
	dr.run(t, "rescued, none here, settled", rescued(int(lbLbLimitsLB_MARK_RESCUE)), xdptest.Pass)
	dr.run(t, "rescued by a settling edge, none here", rescued(int(lbLbLimitsLB_MARK_RESCUE_WAIT)), xdptest.Drop)
	dr.apply(t, desired(r1, r2, r3, r4)) // a change
	dr.run(t, "rescued, none here, right after a change", rescued(int(lbLbLimitsLB_MARK_RESCUE)), xdptest.Drop)
}
