package dataplane

import (
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/portico-edge/portico/dataplane/bpftest"
	"github.com/portico-edge/portico/dataplane/xdptest"
	"github.com/portico-edge/portico/test/netlab"
)

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

// TestDownIsAskedLast: a replica the liveness checks call dead gets no new flows,
// and in a flow's chain it comes after every serving replica: a director sends a
// packet of its slot to the serving replica first, whose node, without the
// connection, hands it on to the down replica (so a wrong verdict breaks no
// connection, and no survivor's connection is ever sent to a node that may be
// dead). Once its MAC is unknown its flows are picked again; a UDP datagram is
// not sent to it at all (bpf/README.md, "UDP").
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
	// A UDP walk asks no replica called down (a dead one would take every new
	// flow's datagrams): a datagram of the down replica's slot goes to a
	// serving one, which its director pins (it sent it by its ring alone),
	// and it stays there once the replica only drains.
	var u xdptest.Packet
	for sport := uint16(23000); sport < 28000; sport++ {
		if u = udp4(sport); pick(t, u, all...) == r1.Addr {
			break
		}
	}
	held := dr.send(t, u, all...)
	if held.Addr == r1.Addr {
		t.Errorf("a UDP flow of the down replica's slot went to it (%s), want a serving replica", held.Addr)
	}
	dr.apply(t, desired(draining(r1), r2, r4))
	if got := dr.send(t, u, all...); got.Addr != held.Addr {
		t.Errorf("the UDP flow went to %s once r1 only drains, want it kept on %s (its director's pin)", got.Addr, held.Addr)
	}
	g := flowWhere(t, f.SPort+1, [][]Backend{all, {r2, r4}}, r1, r4)
	noMAC := down(r1)
	noMAC.MAC = nil
	dr.apply(t, desired(noMAC, r2, r4))
	if got := dr.send(t, g, all...); got.Addr != r4.Addr {
		t.Errorf("without its MAC, the down replica's flow went to %s, want it picked again (%s)", got.Addr, r4.Addr)
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
		dr.retireCaches(t) // the pin kept
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
	// director's tag: r3's address ends in 0x000d, and the walk's downs: r1,
	// whose address ends in 3, bit 3), and r1 in its turn.
	out := dr.run(t, "pinned to r1, called down, in the transition", p.Bytes(), xdptest.TX)
	if want := xdptest.WithTag(xdptest.WithTCPMark(to(p, r2), xdptest.MarkTagged|1<<15|1<<8|1), 0x000d); !slices.Equal(out, want) {
		m, _ := xdptest.TCPMark(out)
		t.Fatalf("in the transition: sent to %s with mark %#x, want r2, walked as serving, r1 down (0x18101)", net.HardwareAddr(out[:6]), m)
	}
	// After it, the director sends it to r2, marked, with r1's tag (its
	// address ends in 0x000b).
	dr.endTransitions(t)
	dr.retireCaches(t) // the pin kept
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
