package dataplane

import (
	"testing"

	"github.com/portico-edge/portico/dataplane/xdptest"
)

// A hand-off mark on a frame from no peer edge (issue 24: reserved bits a
// stranger sets; issue 21: a spoofed packet must not make an edge send it on
// more than once) buys one hand-off at most: in a transition, where a peer's
// marked frame is walked along the flow's chain with its hop count, a
// stranger's leaves with the last hop the budget allows, so the next edge
// serves it or drops it and never sends it on (REASON_STRANGER_MARK). A new
// peer that this edge has not learned yet gets the same one hop.
func TestStrangerMark(t *testing.T) {
	defer onOneCPU(t)()
	d := loadForTest(t)
	if err := d.SetMAC(nicMAC); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Apply(desired(r1)); err != nil {
		t.Fatal(err)
	}
	// A flow whose slot moves from r1 to r2: in the transition its chain
	// names both.
	mk := func(s uint16) xdptest.Packet { return tcp4(s, xdptest.ACK) }
	p := mk(sportFor(t, mk, r2, r1, r2))
	if _, err := d.Apply(desired(r1, r2)); err != nil {
		t.Fatal(err)
	}
	run := func(in []byte) (uint32, []byte, uint64) {
		t.Helper()
		verdict, out, reasons := runCounted(t, d, in)
		return verdict, out, reasons[int(lbReasonREASON_STRANGER_MARK)]
	}
	hops := func(frame []byte) int {
		m, _ := xdptest.TCPMark(frame)
		return m >> 8 & 0xff
	}
	marked := xdptest.WithTCPMark(p.Bytes(), 1<<8|1)

	// A peer's (r1's) frame walks on with one hop more.
	verdict, out, strangers := run(withMACs(marked, r1MAC, nicMAC))
	if verdict != xdptest.TX || hops(out) != 2 || strangers != 0 {
		t.Fatalf("a peer's marked frame: %s with %d hops (%d stranger marks), want TX with 2 (the walk goes on)", xdptest.VerdictName(verdict), hops(out), strangers)
	}
	// A stranger's (the client's) frame: one hop, the budget's last.
	verdict, out, strangers = run(marked)
	if strangers != 1 {
		t.Errorf("%d stranger marks counted, want 1", strangers)
	}
	if verdict == xdptest.TX && hops(out) != int(lbLbLimitsLB_MAX_HOPS) {
		t.Errorf("a stranger's marked frame sent on with %d hops, want %d (none left: the next edge never sends it on)", hops(out), lbLbLimitsLB_MAX_HOPS)
	}
	// Its next edge (a peer of this one) has no hop left to give it.
	if verdict == xdptest.TX {
		verdict, _, _ = run(withMACs(out, r2MAC, nicMAC))
		if verdict == xdptest.TX {
			t.Errorf("the frame a stranger marked was sent on a second time")
		}
	}
}
