package dataplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/portico-edge/portico/dataplane/bpftest"
	"github.com/portico-edge/portico/dataplane/xdptest"
	"github.com/portico-edge/portico/test/netlab"
)

var (
	r4MAC = mustMAC("02:00:00:00:01:04")
	r4    = Backend{Addr: netip.MustParseAddr("10.0.0.14"), MAC: r4MAC}
)

// director is one edge node's xdp_lb for the transition tests, which send the same
// changes to two of them.
type director struct {
	name string
	d    *Dataplane
}

func newDirector(t *testing.T, name string) director {
	t.Helper()
	d := loadForTest(t)
	if err := d.SetMAC(nicMAC); err != nil {
		t.Fatal(err)
	}
	return director{name, d}
}

// newModelDirector is newDirector whose stack is a model (sock_model): a test
// says which connections it has.
func newModelDirector(t *testing.T, name string) director {
	t.Helper()
	d := loadWith(t, Options{RingSize: testRing, FlowEntries: 4096, sockModel: 64})
	if err := d.SetMAC(nicMAC); err != nil {
		t.Fatal(err)
	}
	return director{name, d}
}

func (dr director) apply(t *testing.T, want Desired) {
	t.Helper()
	if _, err := dr.d.Apply(want); err != nil {
		t.Fatalf("%s: apply: %v", dr.name, err)
	}
}

// send runs p through the director and returns the backend it went to.
func (dr director) send(t *testing.T, p xdptest.Packet, bs ...Backend) Backend {
	t.Helper()
	return dr.sendFrame(t, p.Bytes(), bs...)
}

func (dr director) sendFrame(t *testing.T, frame []byte, bs ...Backend) Backend {
	t.Helper()
	verdict, out, err := xdptest.Run(dr.d.Program(), frame)
	if err != nil {
		t.Fatalf("%s: run: %v", dr.name, err)
	}
	if verdict != xdptest.TX {
		t.Fatalf("%s: verdict %s, want TX", dr.name, xdptest.VerdictName(verdict))
	}
	for _, b := range bs {
		if net.HardwareAddr(out[0:6]).String() == b.MAC.String() {
			return b
		}
	}
	t.Fatalf("%s: sent to %s, none of the backends", dr.name, net.HardwareAddr(out[0:6]))
	return Backend{}
}

// run sends a frame through the director, wants verdict, and returns what it sent.
func (dr director) run(t *testing.T, name string, frame []byte, verdict uint32) []byte {
	t.Helper()
	v, out, err := xdptest.Run(dr.d.Program(), frame)
	if err != nil {
		t.Fatal(err)
	}
	if v != verdict {
		t.Fatalf("%s: %s: verdict %s, want %s", dr.name, name, xdptest.VerdictName(v), xdptest.VerdictName(verdict))
	}
	return out
}

// state counts the entries of flows and new_pins.
func (dr director) state(t *testing.T) (pinned, news int) {
	t.Helper()
	return entries(t, dr.d.objs.Flows), entries(t, dr.d.objs.NewPins)
}

// endTransitions makes every previous ring stop counting, as time would.
func (dr director) endTransitions(t *testing.T) {
	t.Helper()
	for vip := range dr.d.st.prevUntil {
		if err := dr.d.endTransition(vip); err != nil {
			t.Fatal(err)
		}
	}
}

// flowWhere finds a TCP flow (IPv4, ACK) from start on whose picks over the
// successive replica sets are want[i].
func flowWhere(t *testing.T, start uint16, sets [][]Backend, want ...Backend) xdptest.Packet {
	t.Helper()
	return flowWhereOf(t, func(s uint16) xdptest.Packet { return tcp4(s, xdptest.ACK) }, start, sets, want...)
}

// flowWhereOf is flowWhere for the flows mk makes.
func flowWhereOf(t *testing.T, mk func(uint16) xdptest.Packet, start uint16, sets [][]Backend, want ...Backend) xdptest.Packet {
	t.Helper()
	for sport := start; sport < start+5000; sport++ {
		p := mk(sport)
		ok := true
		for i, set := range sets {
			if pick(t, p, set...) != want[i].Addr {
				ok = false
				break
			}
		}
		if ok {
			return p
		}
	}
	t.Fatalf("no flow goes %v over %d replica sets", want, len(sets))
	return xdptest.Packet{}
}

func syn(p xdptest.Packet) xdptest.Packet { p.Flags = xdptest.SYN; return p }

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

// TestHandoff: a director sent this node a packet of a TCP connection its stack
// does not have, in a transition. The node sends it on along the flow's chain,
// in the order every chain is walked (class: serving, down, another site's;
// then address), to the first replica after itself (after the start, for a frame
// a director steered or guessed), marked with the receiver's class (reserved bits
// and the urgent pointer of the TCP header, checksum kept right, IPv4 and IPv6
// alike), and pins that for after the transition. A marked frame goes only up
// that order; at the chain's end, right after a change, it is dropped (TCP sends
// it again). The receiving edge clears the mark: its stack gets the frame as the
// client sent it.
func TestHandoff(t *testing.T) {
	dr := newModelDirector(t, "r3's node")
	before, after := []Backend{r1, r3}, []Backend{r1, r3, r4}
	fromPeer := func(p xdptest.Packet) xdptest.Packet { return p.WithMACs(r1MAC, nicMAC) }
	run := func(name string, frame []byte, verdict uint32) []byte {
		t.Helper()
		return dr.run(t, name, frame, verdict)
	}
	serving, probe := 1, int(lbLbLimitsLB_MARK_PROBE)
	for _, mk := range []func(uint16, uint8) xdptest.Packet{tcp4, tcp6} {
		ack := func(s uint16) xdptest.Packet { return mk(s, xdptest.ACK) }
		toNew := flowWhereOf(t, ack, 50000, [][]Backend{before, after}, r3, r4) // here before, r4's now
		toOld := flowWhereOf(t, ack, 50000, [][]Backend{before, after}, r1, r3) // r1's before, here now
		dr.apply(t, desired(before...))
		dr.endTransitions(t)
		run("no transition: served here", fromPeer(toNew).Bytes(), xdptest.Pass)

		dr.apply(t, desired(after...))
		run("a SYN is served here", fromPeer(syn(toNew)).Bytes(), xdptest.Pass)
		in := fromPeer(toNew).Bytes()
		out := run("this node's before, r4's now", slices.Clone(in), xdptest.TX)
		if got := net.HardwareAddr(out[0:6]).String(); got != r4.MAC.String() {
			t.Errorf("sent to %s, want r4", got)
		}
		if m, _ := xdptest.TCPMark(out); m != 1<<8|serving || !xdptest.TCPChecksumOK(out) {
			t.Errorf("sent with mark %#x (want 0x101: r4 serves, one hand-off) or a wrong TCP checksum: % x", m, out[:70])
		}
		// Received marked as serving, or as a director's guess (walked from
		// the start), this node sends it to the next serving replica above
		// its own address whatever the sender's rings: r4, one hand-off more.
		// Where the stack has it, it is served with the mark cleared: the
		// stack gets the frame as the client sent it.
		for _, m := range []int{1<<8 | serving, 1<<8 | probe} {
			if again := run("received marked", xdptest.WithTCPMark(in, m), xdptest.TX); !slices.Equal(again[:6], r4MAC) {
				t.Errorf("marked %#x: sent to %s, want r4", m, net.HardwareAddr(again[:6]))
			} else if got, _ := xdptest.TCPMark(again); got != 2<<8|serving {
				t.Errorf("marked %#x: sent on with mark %#x, want 0x201", m, got)
			}
		}
		// A walk r4 directed carries r4's tag (its address ends in 0x000e):
		// r4 checked its own stack, and is skipped; nothing else is above.
		if again := run("received marked, tagged by r4", xdptest.WithTag(xdptest.WithTCPMark(in, xdptest.MarkTagged|1<<8|serving), 0x000e), xdptest.Drop); again != nil && slices.Equal(again[:6], r4MAC) {
			t.Errorf("a walk r4 directed was sent back to r4")
		}
		// Tagged by another node, it goes to r4, tag and all.
		if again := run("received marked, tagged by r1", xdptest.WithTag(xdptest.WithTCPMark(in, xdptest.MarkTagged|1<<8|serving), 0x000b), xdptest.TX); !slices.Equal(again[:6], r4MAC) {
			t.Errorf("tagged by r1: sent to %s, want r4", net.HardwareAddr(again[:6]))
		} else if got, _ := xdptest.TCPMark(again); got != xdptest.MarkTagged|2<<8|serving {
			t.Errorf("tagged by r1: sent on with mark %#x, want it tagged, 0x201", got)
		}
		f := Flow{Src: toNew.Src, Dst: toNew.Dst, SPort: toNew.SPort, DPort: toNew.DPort, Protocol: toNew.Proto}
		if err := dr.d.objs.SockModel.Put(f.key(), uint32(1)); err != nil {
			t.Fatal(err)
		}
		back := run("received marked, a connection here", withMACs(out, r1MAC, nicMAC), xdptest.Pass)
		if want := withMACs(in, r1MAC, nicMAC); !slices.Equal(back, want) {
			t.Errorf("the receiving edge passed % x, want % x", back, want)
		}
		if err := dr.d.objs.SockModel.Delete(f.key()); err != nil {
			t.Fatal(err)
		}
		if out := run("its next packet (pinned)", slices.Clone(in), xdptest.TX); !slices.Equal(out[:6], r4MAC) {
			t.Errorf("its next packet went to %s", net.HardwareAddr(out[:6]))
		}
		dr.endTransitions(t)
		if out := run("after the transition (pinned)", slices.Clone(in), xdptest.TX); !slices.Equal(out[:6], r4MAC) {
			t.Errorf("after the transition it went to %s", net.HardwareAddr(out[:6]))
		}
		dr.apply(t, desired(before...))
		dr.endTransitions(t)
		dr.apply(t, desired(after...))
		// A frame from a director is walked from the chain's start (the
		// director's rings may differ from this node's for a moment).
		if out := run("r1's before, this node's now", fromPeer(toOld).Bytes(), xdptest.TX); !slices.Equal(out[:6], r1MAC) {
			t.Errorf("r1's before: sent to %s, want r1", net.HardwareAddr(out[:6]))
		} else if m, _ := xdptest.TCPMark(out); m != 1<<8|serving {
			t.Errorf("r1's before: mark %#x, want 0x101", m)
		}
		// Marked as serving, it goes only up: r1 is below this node, and
		// nothing is above it in this chain; nor in the class of the down
		// ones; and after LB_MAX_HOPS hand-offs, a frame goes no further.
		run("marked serving, nothing above", xdptest.WithTCPMark(fromPeer(toOld).Bytes(), 1<<8|serving), xdptest.Drop)
		run("marked down, nothing above", xdptest.WithTCPMark(fromPeer(toOld).Bytes(), 1<<8|2), xdptest.Drop)
		run("marked after 8 hand-offs", xdptest.WithTCPMark(fromPeer(toNew).Bytes(), 8<<8|serving), xdptest.Drop)
		dr.endTransitions(t)
		if err := dr.d.ClearFlows(); err != nil {
			t.Fatal(err)
		}
	}
	c, err := dr.d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if wait, in := c.Reasons[lbReasonREASON_HANDOFF_WAIT], c.Reasons[rHandoffIn]; c.Reasons[rHandoff] != 14 || wait != 8 || in != 2 {
		t.Errorf("hand-offs %d out, %d dropped at the end of their chain, %d served; want 14, 8, 2", c.Reasons[rHandoff], wait, in)
	}
}

// ipv4Checksum is the Internet checksum over an IPv4 header: 0 when it is right.
func ipv4Checksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

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

// TestDownIsAskedLast: a replica the liveness checks call dead gets no new flows,
// and in a flow's chain it comes after every serving replica: a director sends a
// packet of its slot to the serving replica first, whose node, without the
// connection, hands it on to the down replica (so a wrong verdict breaks no
// connection, and no survivor's connection is ever sent to a node that may be
// dead). Once its MAC is unknown its flows are picked again; its UDP flows are
// picked again at once (a draining replica keeps them).
func TestDownIsAskedLast(t *testing.T) {
	dr := newDirector(t, "d1")
	r2node := newDirector(t, "r2's node")
	all := []Backend{r1, r2, r4}
	f := flowWhere(t, 21000, [][]Backend{all, {r2, r4}}, r1, r2)
	dr.apply(t, desired(all...))
	dr.send(t, f, all...)
	dr.apply(t, desired(down(r1), r2, r4))
	if got := dr.send(t, f, all...); got.Addr != r2.Addr {
		t.Errorf("a flow of the down replica's slot went to %s, want the serving replica %s first", got.Addr, r2.Addr)
	}
	local2 := r2
	local2.Local, local2.MAC = true, nil
	r2node.apply(t, desired(r1, local2, r4))
	r2node.apply(t, desired(down(r1), local2, r4))
	out := r2node.run(t, "r2's node, without the connection", f.WithMACs(r4MAC, nicMAC).Bytes(), xdptest.TX) // from a director (a peer)
	if m, _ := xdptest.TCPMark(out); !slices.Equal(out[:6], r1MAC) || m&0xff != 2 {
		t.Errorf("r2's node sent it to %s with mark %#x, want the down replica r1 at place 2", net.HardwareAddr(out[:6]), m)
	}
	if got := dr.send(t, syn(f), all...); got.Addr == r1.Addr {
		t.Errorf("a new connection went to the down replica")
	}
	// A UDP flow cannot be told from a new one: one that the previous ring put
	// on the down replica is picked again, not sent to a node that may be dead.
	var u xdptest.Packet
	for sport := uint16(23000); sport < 28000; sport++ {
		if u = udp4(sport); pick(t, u, all...) == r1.Addr {
			break
		}
	}
	if got := dr.send(t, u, all...); got.Addr == r1.Addr {
		t.Errorf("a UDP flow of the down replica's slot went to it (%s), want it picked again", got.Addr)
	}
	dr.apply(t, desired(draining(r1), r2, r4))
	if got := dr.send(t, u, all...); got.Addr != r1.Addr {
		t.Errorf("a UDP flow of a draining replica went to %s, want it kept on %s", got.Addr, r1.Addr)
	}
	g := flowWhere(t, f.SPort+1, [][]Backend{all, {r2, r4}}, r1, r4)
	noMAC := down(r1)
	noMAC.MAC = nil
	dr.apply(t, desired(noMAC, r2, r4))
	if got := dr.send(t, g, all...); got.Addr != r4.Addr {
		t.Errorf("without its MAC, the down replica's flow went to %s, want it picked again (%s)", got.Addr, r4.Addr)
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
	dr.d.cfg.RingLayout = 0 // what an earlier version left pinned
	if err := dr.d.writeConfig(); err != nil {
		t.Fatal(err)
	}
	dr.d.Close()

	dr = load(other)
	defer dr.d.Close()
	if got := ringSizes(dr); slices.ContainsFunc(got, func(n int) bool { return n != 0 }) {
		t.Errorf("over an earlier version's rings, rings of %v slots before the first Apply, want none", got)
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

// TestLocalConnectionSettles: for a packet older than a ring change, in a slot
// the change moved to or from this node's replica, this node's own stack decides
// (bpf_skc_lookup_tcp in a namespace that really has, or lacks, the connection):
// a connection it has stays here, whatever the previous ring says; one the
// previous ring places here but it does not have goes where the current ring
// sends it. A director's pin to another replica yields to a connection its own
// stack has (one that opened here where no ring placed it: an edge that took
// the director's SYN for a client's steered it back).
func TestLocalConnectionSettles(t *testing.T) {
	bpftest.Require(t)
	lab, err := netlab.New("pc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Errorf("clean up lab: %v", err)
		}
	})
	node, err := lab.AddNode("ed", netip.MustParsePrefix("10.214.0.10/24"), mustMAC("02:00:0a:d6:00:0a"))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []netip.Addr{vip4, client4} {
		must(t, netlab.IP("-n", node.NS, "addr", "add", a.String()+"/32", "dev", "lo"))
	}
	before, after := []Backend{r1, r3}, []Backend{r1, r3, r4}
	toOld := flowWhere(t, 41000, [][]Backend{before, after}, r1, r3)     // r1's before, here now
	toNew := flowWhere(t, 42000, [][]Backend{before, after}, r3, r4)     // here before, r4's now
	elsewhere := flowWhere(t, 43000, [][]Backend{before, after}, r1, r4) // never here
	dr := newDirector(t, "here")
	dr.apply(t, desired(before...))
	dr.apply(t, desired(after...))
	run := func(p xdptest.Packet) (uint32, []byte) {
		t.Helper()
		var verdict uint32
		var out []byte
		must(t, netlab.Do(node.NS, func() error {
			var err error
			verdict, out, err = xdptest.Run(dr.d.Program(), p.Bytes())
			return err
		}))
		return verdict, out
	}
	// Without connections: the previous ring for a flow it places elsewhere, the
	// current ring for one it places here.
	if v, out := run(toOld); v != xdptest.TX || net.HardwareAddr(out[0:6]).String() != r1.MAC.String() {
		t.Errorf("no local connection, r1's before: verdict %s to %s, want TX to r1", xdptest.VerdictName(v), net.HardwareAddr(out[0:6]))
	}
	if v, out := run(toNew); v != xdptest.TX || net.HardwareAddr(out[0:6]).String() != r4.MAC.String() {
		t.Errorf("no local connection, here before, r4's now: verdict %s to %s, want TX to r4", xdptest.VerdictName(v), net.HardwareAddr(out[0:6]))
	}
	must(t, dr.d.ClearFlows()) // the packets above pinned their flows
	// A connection opened in the transition, pinned to r4 by its handshake.
	for _, p := range []xdptest.Packet{syn(elsewhere), elsewhere} {
		if v, out := run(p); v != xdptest.TX || net.HardwareAddr(out[0:6]).String() != r4.MAC.String() {
			t.Fatalf("new in the transition, r4's: verdict %s to %s, want TX to r4", xdptest.VerdictName(v), net.HardwareAddr(out[0:6]))
		}
	}

	// With the connections open in this node's stack.
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	must(t, netlab.Do(node.NS, func() error {
		ln, err := net.Listen("tcp4", netip.AddrPortFrom(vip4, 80).String())
		if err != nil {
			return err
		}
		defer ln.Close()
		for _, p := range []xdptest.Packet{toOld, toNew, elsewhere} {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: client4.AsSlice(), Port: int(p.SPort)}}
			c, err := d.Dial("tcp4", netip.AddrPortFrom(vip4, 80).String())
			if err != nil {
				return err
			}
			s, err := ln.Accept()
			if err != nil {
				return err
			}
			conns = append(conns, c, s)
		}
		return nil
	}))
	// The client's packets acknowledge what this node's side sent: its
	// receive sequence (read in TCP repair mode, as CRIU does).
	stale := map[uint16]xdptest.Packet{}
	for i, p := range []*xdptest.Packet{&toOld, &toNew, &elsewhere} {
		stale[p.SPort] = *p
		p.Ack = rcvNxt(t, conns[2*i])
	}
	if v, out := run(toOld); v != xdptest.Pass {
		t.Errorf("local connection, r1's before, here now: verdict %s (to %s), want PASS", xdptest.VerdictName(v), net.HardwareAddr(out[0:6]))
	}
	if v, out := run(toNew); v != xdptest.Pass {
		t.Errorf("local connection, here before, r4's now: verdict %s (to %s), want PASS", xdptest.VerdictName(v), net.HardwareAddr(out[0:6]))
	}
	// The pin to r4 yields, from the flow cache and from flows alike.
	for _, where := range []string{"flow cache", "flows"} {
		if v, out := run(elsewhere); v != xdptest.Pass {
			t.Errorf("local connection, pinned to r4 (%s): verdict %s (to %s), want PASS", where, xdptest.VerdictName(v), net.HardwareAddr(out[0:6]))
		}
		dr.d.cfg.Generation++ // every CPU's cache retired, the pin kept
		must(t, dr.d.writeConfig())
	}

	// A packet whose ACK this node's socket never sent for is another
	// connection's on the same 5-tuple (a client reused the port of one whose
	// end never reached this socket): not this node's, so it goes where the
	// rings say (CI's TestPortico/RollingUpdateWithDrain: a new connection's
	// packets went into a FIN_WAIT socket left on the VIP's new owner, and hung).
	if v, out := run(stale[toNew.SPort]); v != xdptest.TX || net.HardwareAddr(out[0:6]).String() != r4.MAC.String() {
		t.Errorf("a socket of the 5-tuple whose sequence the packet does not fit: verdict %s (to %s), want TX to r4, as without one",
			xdptest.VerdictName(v), net.HardwareAddr(out[0:6]))
	}

	// Once they ended here (this node closed first, so its side waits in
	// TIME_WAIT), the 5-tuples are no connections of this node's: a client
	// reuses its ports, and a new connection on one may be another replica's
	// (a director that took it for its own would reset it).
	must(t, dr.d.ClearFlows())
	for i := 1; i < len(conns); i += 2 {
		conns[i].Close() // this node's side first
	}
	time.Sleep(100 * time.Millisecond)
	for i := 0; i < len(conns); i += 2 {
		conns[i].Close()
	}
	time.Sleep(100 * time.Millisecond)
	out, err := exec.Command("ip", "netns", "exec", node.NS, "ss", "-Htan", "state", "time-wait").CombinedOutput()
	if err != nil {
		t.Fatalf("ss: %v: %s", err, out)
	}
	for _, p := range []xdptest.Packet{toOld, toNew} {
		if !strings.Contains(string(out), fmt.Sprintf(":%d", p.SPort)) {
			t.Fatalf("no TIME_WAIT socket of port %d here:\n%s", p.SPort, out)
		}
	}
	if v, out := run(toOld); v != xdptest.TX || net.HardwareAddr(out[0:6]).String() != r1.MAC.String() {
		t.Errorf("ended here, r1's before: verdict %s to %s, want TX to r1", xdptest.VerdictName(v), net.HardwareAddr(out[0:6]))
	}
	if v, out := run(toNew); v != xdptest.TX || net.HardwareAddr(out[0:6]).String() != r4.MAC.String() {
		t.Errorf("ended here, here before, r4's now: verdict %s to %s, want TX to r4", xdptest.VerdictName(v), net.HardwareAddr(out[0:6]))
	}
}

// TestDownPin: a director's exact pin to a replica called down may be stale, a
// reused port's new connection placed by the ring while its old holder died.
// In a moved slot whose chain names it, the chain is walked instead. Outside a
// moved slot it asks the ring's replica first (LB_MARK_DOWNPIN, the pinned
// replica's tag in the frame), which serves what its stack has and hands the
// rest to the pinned one, to be served there (one called down wrongly keeps its
// connections).
func TestDownPin(t *testing.T) {
	dr := newModelDirector(t, "r3's node")
	var p xdptest.Packet
	found := false
	for sport := uint16(52000); sport < 56000 && !found; sport++ {
		p = tcp4(sport, xdptest.ACK)
		dr.apply(t, desired(r2, r3))
		dr.endTransitions(t)
		if pick(t, p, r1, r2, r3) != r1.Addr || pick(t, p, r2, r3) != r2.Addr {
			continue
		}
		// Opened in the transition r1's arrival made: pinned to r1 by its
		// handshake.
		dr.apply(t, desired(r1, r2, r3))
		for _, f := range []xdptest.Packet{syn(p), p} {
			if out := dr.run(t, "opened on r1", f.Bytes(), xdptest.TX); !slices.Equal(out[:6], r1MAC) {
				t.Fatalf("sent to %s, want r1", net.HardwareAddr(out[:6]))
			}
		}
		dr.apply(t, desired(down(r1), r2, r3))
		tr, err := dr.d.Trace(Flow{Src: p.Src, Dst: p.Dst, SPort: p.SPort, DPort: p.DPort, Protocol: p.Proto})
		if err != nil {
			t.Fatal(err)
		}
		found = slices.ContainsFunc(tr.Rings, func(r TraceRing) bool { return r.Ring == "current" && r.Backend.Addr == r2.Addr })
		if !found {
			must(t, dr.d.ClearFlows())
		}
	}
	if !found {
		t.Fatal("no flow pinned to r1 that the ring gives r2 once r1 is down")
	}
	// r1 is down. In the transition its verdict started, where the slot
	// moved and the chain names r1, the pin is not trusted: the chain is
	// walked, its serving replica r2 first (marked as serving, with this
	// director's tag: r3's address ends in 0x000d), and r1 in its turn.
	out := dr.run(t, "pinned to r1, called down, in the transition", p.Bytes(), xdptest.TX)
	if want := xdptest.WithTag(xdptest.WithTCPMark(to(p, r2), xdptest.MarkTagged|1<<8|1), 0x000d); !slices.Equal(out, want) {
		m, _ := xdptest.TCPMark(out)
		t.Fatalf("in the transition: sent to %s with mark %#x, want r2, walked as serving (0x10101)", net.HardwareAddr(out[:6]), m)
	}
	// After it, the director sends it to r2, marked, with r1's tag (its
	// address ends in 0x000b).
	dr.endTransitions(t)
	dr.d.cfg.Generation++ // every CPU's flow cache retired, the pin kept
	must(t, dr.d.writeConfig())
	out = dr.run(t, "pinned to r1, called down", p.Bytes(), xdptest.TX)
	want := xdptest.WithTag(xdptest.WithTCPMark(to(p, r2), xdptest.MarkTagged|1<<8|int(lbLbLimitsLB_MARK_DOWNPIN)), 0x000b)
	if !slices.Equal(out, want) {
		t.Fatalf("sent % x,\nwant % x", out, want)
	}
	// As the ring's replica receives it (this program, from another director,
	// r4): with the connection it is served; without, it goes on to r1, to be
	// served there.
	in := withMACs(out, r4MAC, nicMAC)
	f := Flow{Src: p.Src, Dst: p.Dst, SPort: p.SPort, DPort: p.DPort, Protocol: p.Proto}
	must(t, dr.d.objs.SockModel.Put(f.key(), uint32(1)))
	dr.run(t, "marked down-pin, a connection here", slices.Clone(in), xdptest.Pass)
	must(t, dr.d.objs.SockModel.Delete(f.key()))
	on := dr.run(t, "marked down-pin, no connection here", slices.Clone(in), xdptest.TX)
	if m, _ := xdptest.TCPMark(on); !slices.Equal(on[:6], r1MAC) || m != 255 || !xdptest.TCPChecksumOK(on) {
		t.Errorf("handed on to %s with mark %#x, want r1, marked to be served (0xff)", net.HardwareAddr(on[:6]), m)
	}
	// r1 up again: the pin is followed as before.
	dr.apply(t, desired(r1, r2, r3))
	if out := dr.run(t, "pinned to r1, up", p.Bytes(), xdptest.TX); !slices.Equal(out[:6], r1MAC) {
		t.Errorf("r1 up: sent to %s, want r1", net.HardwareAddr(out[:6]))
	}
}

// tcpRecvQueue is linux/tcp.h's TCP_RECV_QUEUE (x/sys/unix lacks it).
const tcpRecvQueue = 1

// rcvNxt is the next sequence number a TCP connection expects: what its
// peer sent so far, which its ACKs name. Read in repair mode (root), as CRIU
// reads a live socket's queues.
func rcvNxt(t *testing.T, c net.Conn) uint32 {
	t.Helper()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var seq int
	var serr error
	if err := raw.Control(func(fd uintptr) {
		if serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_REPAIR, 1); serr != nil {
			return
		}
		defer unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_REPAIR, 0)
		if serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_REPAIR_QUEUE, tcpRecvQueue); serr != nil {
			return
		}
		seq, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_QUEUE_SEQ)
	}); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatalf("read a socket's receive sequence: %v", serr)
	}
	return uint32(seq)
}
