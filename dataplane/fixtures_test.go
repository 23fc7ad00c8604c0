package dataplane

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/portico-edge/portico/dataplane/xdptest"
)

// step sends one frame, optionally after applying a new desired state.
type step struct {
	name    string
	apply   *Desired
	in      []byte
	verdict uint32
	out     []byte // expected frame; nil means "unchanged"
	reasons map[Reason]uint64
}

type fixture struct {
	name  string
	state Desired
	steps func(t testing.TB) []step
}

func ptr[T any](v T) *T { return &v }

func fixtures() []fixture {
	single := func(b Backend) Desired { return desired(b) }
	return []fixture{
		{"v4 tcp to remote backend", single(r1), func(t testing.TB) []step {
			p := tcp4(40001, xdptest.SYN)
			return []step{{in: p.Bytes(), verdict: xdptest.TX, out: to(p, r1), reasons: reasons(rTX, 1)}}
		}},
		{"v4 udp to remote backend", single(r1), func(t testing.TB) []step {
			p := udp4(40002)
			return []step{{in: p.Bytes(), verdict: xdptest.TX, out: to(p, r1), reasons: reasons(rTX, 1)}}
		}},
		{"v6 tcp to remote backend", single(r2), func(t testing.TB) []step {
			p := tcp6(40003, xdptest.SYN)
			return []step{{in: p.Bytes(), verdict: xdptest.TX, out: to(p, r2), reasons: reasons(rTX, 1)}}
		}},
		{"v6 udp to remote backend", single(r2), func(t testing.TB) []step {
			p := udp6(40004)
			return []step{{in: p.Bytes(), verdict: xdptest.TX, out: to(p, r2), reasons: reasons(rTX, 1)}}
		}},
		{"local backend passes unchanged", single(r3), func(t testing.TB) []step {
			return []step{
				{name: "v4", in: tcp4(40005, xdptest.SYN).Bytes(), verdict: xdptest.Pass, reasons: reasons(rLocal, 1)},
				{name: "v6", in: udp6(40005).Bytes(), verdict: xdptest.Pass, reasons: reasons(rLocal, 1)},
			}
		}},
		{"established flow stays when a backend is added", single(r1), func(t testing.TB) []step {
			// A flow the two-backend ring would send to r2: it must stay on r1.
			sp := sportFor(t, func(s uint16) xdptest.Packet { return tcp4(s, xdptest.ACK) }, r2, r1, r2)
			p := tcp4(sp, xdptest.ACK)
			mkSYN := func(s uint16) xdptest.Packet { return tcp4(s, xdptest.SYN) }
			fresh := mkSYN(sportFrom(t, sp+1, mkSYN, r2, r1, r2))
			return []step{
				{name: "first packet", in: p.Bytes(), verdict: xdptest.TX, out: to(p, r1), reasons: reasons(rTX, 1)},
				// Marked as the director's likeliest guess (r1 held the
				// slot before): r1's node, had it not the connection,
				// would walk the chain from its start.
				{name: "after adding r2: pinned to r1", apply: ptr(desired(r1, r2)), in: p.Bytes(), verdict: xdptest.TX, out: xdptest.WithTCPMark(to(p, r1), 1<<8|1), reasons: reasons(rPinned, 1, rTX, 1)},
				{name: "and stays", in: p.Bytes(), verdict: xdptest.TX, out: xdptest.WithTCPMark(to(p, r1), 1<<8|1), reasons: reasons(rTX, 1)},
				{name: "new flow uses the new ring", in: fresh.Bytes(), verdict: xdptest.TX, out: to(fresh, r2), reasons: reasons(rNewPinned, 1, rTX, 1)},
			}
		}},
		{"draining backend keeps old flows, gets no new ones", desired(r1, r2), func(t testing.TB) []step {
			mk := func(s uint16) xdptest.Packet { return udp4(s) }
			old := udp4(sportFor(t, mk, r1, r1, r2))
			// A new connection the old ring would have sent to r1.
			mkSYN := func(s uint16) xdptest.Packet { return tcp4(s, xdptest.SYN) }
			fresh := mkSYN(sportFrom(t, old.SPort+1, mkSYN, r1, r1, r2))
			ack := fresh
			ack.Flags = xdptest.ACK
			return []step{
				{name: "flow to r1", in: old.Bytes(), verdict: xdptest.TX, out: to(old, r1), reasons: reasons(rTX, 1)},
				// Walked to r1 first (the chain's lower address), which
				// serves it if its stack did before (TestUDPWalk).
				{name: "r1 draining: old flow asked of r1 first", apply: ptr(desired(draining(r1), r2)), in: old.Bytes(), verdict: xdptest.TX, out: withUDPMark(to(old, r1), 1), reasons: reasons(rTX, 1)},
				{name: "r1 draining: new connection goes to r2", in: fresh.Bytes(), verdict: xdptest.TX, out: to(fresh, r2), reasons: reasons(rNewPinned, 1, rTX, 1)},
				{name: "r1 draining: its handshake's ACK pins it there", in: ack.Bytes(), verdict: xdptest.TX, out: inTransition(ack, r2), reasons: reasons(rPinned, 1, rTX, 1)},
			}
		}},
		{"removed backend: flow picked again", desired(r1, r2), func(t testing.TB) []step {
			p := tcp6(sportFor(t, func(s uint16) xdptest.Packet { return tcp6(s, xdptest.ACK) }, r1, r1, r2), xdptest.ACK)
			return []step{
				{name: "flow to r1", in: p.Bytes(), verdict: xdptest.TX, out: to(p, r1), reasons: reasons(rTX, 1)},
				{name: "r1 removed", apply: ptr(desired(r2)), in: p.Bytes(), verdict: xdptest.TX, out: inTransition(p, r2), reasons: reasons(rTX, 1)},
			}
		}},
		{"a down replica's flows move, no other replica's, on a director that never saw them", desired(r2, r3), func(t testing.TB) []step {
			mk := func(s uint16) xdptest.Packet { return tcp4(s, xdptest.ACK) }
			kept := mk(sportFor(t, mk, r2, r1, r2, r3))
			moved := mk(sportFrom(t, kept.SPort+1, mk, r1, r1, r2, r3))
			want := r2
			if pick(t, moved, r2, r3) == r3.Addr {
				want = r3
			}
			return []step{
				{name: "r1 down: r2's flow stays on r2", apply: ptr(desired(down(r1), r2, r3)), in: kept.Bytes(), verdict: xdptest.TX, out: xdptest.WithTag(xdptest.WithTCPMark(to(kept, r2), xdptest.MarkTagged|1<<8|int(lbLbLimitsLB_MARK_PROBE)), 0x000d) /* r3's tag: this node's */, reasons: reasons(rTX, 1)},
				{name: "r1 down: its flow goes where the serving replicas' table says", in: moved.Bytes(), verdict: verdictFor(want), out: outFor(moved, want), reasons: reasonsFor(want)},
			}
		}},
		{"a new connection on a reused 5-tuple follows the ring, not the old entry", single(r1), func(t testing.TB) []step {
			// An old flow pinned to r1; the ring now sends its 5-tuple to r2. A SYN
			// on that 5-tuple is a new connection: it goes where every director's
			// ring says, and replaces the old entry.
			ack := tcp4(sportFor(t, func(s uint16) xdptest.Packet { return tcp4(s, xdptest.ACK) }, r2, r1, r2), xdptest.ACK)
			syn := ack
			syn.Flags = xdptest.SYN
			return []step{
				{name: "old flow pinned to r1", in: ack.Bytes(), verdict: xdptest.TX, out: to(ack, r1), reasons: reasons(rTX, 1)},
				{name: "r2 added: the old flow stays", apply: ptr(desired(r1, r2)), in: ack.Bytes(), verdict: xdptest.TX, out: xdptest.WithTCPMark(to(ack, r1), 1<<8|1), reasons: reasons(rPinned, 1, rTX, 1)},
				{name: "a SYN on the same 5-tuple follows the ring", in: syn.Bytes(), verdict: xdptest.TX, out: to(syn, r2), reasons: reasons(rNewPinned, 1, rTX, 1)},
				{name: "and the connection stays there", in: ack.Bytes(), verdict: xdptest.TX, out: inTransition(ack, r2), reasons: reasons(rPinned, 1, rTX, 1)},
			}
		}},
		{"a frame another edge steered here is never steered again", desired(r1, r2, r3), func(t testing.TB) []step {
			// A director whose ring differs from this node's (a change reaches the
			// nodes a few ms apart) sends this node a flow it would send to r2:
			// steering it on could bounce it between two nodes.
			mk := func(s uint16) xdptest.Packet { return tcp4(s, xdptest.SYN) }
			p := mk(sportFor(t, mk, r2, r1, r2, r3))
			fromR1 := p.WithMACs(r1MAC, nicMAC)
			mine := mk(sportFor(t, mk, r3, r1, r2, r3)).WithMACs(r1MAC, nicMAC)
			est := tcp4(sportFrom(t, p.SPort+1, func(s uint16) xdptest.Packet { return tcp4(s, xdptest.ACK) }, r2, r1, r2, r3), xdptest.ACK)
			return []step{
				{name: "from a peer: served here", in: fromR1.Bytes(), verdict: xdptest.Pass, reasons: reasons(rFromPeer, 1)},
				{name: "from the client: steered, no flow pinned by the peer's frame", in: p.Bytes(), verdict: xdptest.TX, out: to(p, r2), reasons: reasons(rTX, 1)},
				{name: "from a peer, chosen here anyway", in: mine.Bytes(), verdict: xdptest.Pass, reasons: reasons(rFromPeer, 1)},
				{name: "established flow from the client", in: est.Bytes(), verdict: xdptest.TX, out: to(est, r2), reasons: reasons(rTX, 1)},
				{name: "the same flow from a peer (cached)", in: est.WithMACs(r2MAC, nicMAC).Bytes(), verdict: xdptest.Pass, reasons: reasons(rFromPeer, 1)},
			}
		}},
		{"non-VIP traffic passes byte-identical; a VIP's other ports are closed", single(r1), func(t testing.TB) []step {
			otherAddr := tcp4(40010, xdptest.SYN)
			otherAddr.Dst = other4
			// The VIP serves TCP 80 and UDP 53 only: nothing of the node may
			// answer on its other ports (the liveness checks', the metrics',
			// the kubelet's, ssh).
			otherPort := tcp4(40011, xdptest.SYN)
			otherPort.DPort = 10247
			otherProto := udp4(40012)
			otherProto.DPort = 80
			otherPort6 := tcp6(40015, xdptest.SYN)
			otherPort6.DPort = 22
			fromVIP := tcp4(40013, xdptest.ACK)
			fromVIP.Src, fromVIP.Dst, fromVIP.SPort, fromVIP.DPort = vip4, client4, 80, 40013
			return []step{
				{name: "other address", in: otherAddr.Bytes(), verdict: xdptest.Pass, reasons: reasons(rNotVIP, 1)},
				{name: "other port", in: otherPort.Bytes(), verdict: xdptest.Drop, reasons: reasons(rVIPClosed, 1)},
				{name: "other protocol", in: otherProto.Bytes(), verdict: xdptest.Drop, reasons: reasons(rVIPClosed, 1)},
				{name: "other port, IPv6", in: otherPort6.Bytes(), verdict: xdptest.Drop, reasons: reasons(rVIPClosed, 1)},
				{name: "reply from the VIP", in: fromVIP.Bytes(), verdict: xdptest.Pass, reasons: reasons(rNotVIP, 1)},
				{name: "arp", in: xdptest.ARPRequest(clientMAC, client4, vip4), verdict: xdptest.Pass, reasons: reasons(rNotIP, 1)},
				{name: "icmp echo to the VIP", in: xdptest.ICMPEcho(clientMAC, nicMAC, client4, vip4), verdict: xdptest.Pass, reasons: reasons(rICMPOther, 1)},
				{name: "icmpv6 echo to the VIP", in: xdptest.ICMPEcho(clientMAC, nicMAC, client6, vip6), verdict: xdptest.Pass, reasons: reasons(rICMPOther, 1)},
				{name: "VIP frame flooded to us, addressed to another MAC", in: tcp4(40014, xdptest.SYN).WithMACs(clientMAC, r2MAC).Bytes(),
					verdict: xdptest.Pass, reasons: reasons(rOtherHost, 1)},
			}
		}},
		{"icmp errors follow the inner flow", single(r1), func(t testing.TB) []step {
			// The flows are pinned to r1 first; after r2 joins, the ring would send
			// them to r2, so reaching r1 proves the flow table was used.
			mk4 := func(s uint16) xdptest.Packet { return tcp4(s, xdptest.ACK) }
			mk6 := func(s uint16) xdptest.Packet { return tcp6(s, xdptest.ACK) }
			f4 := mk4(sportFor(t, mk4, r2, r1, r2))
			f6 := mk6(sportFor(t, mk6, r2, r1, r2))
			reply := func(p xdptest.Packet) xdptest.Packet { // what the backend sent back (DSR)
				q := p
				q.Src, q.Dst, q.SPort, q.DPort = p.Dst, p.Src, p.DPort, p.SPort
				q.Payload = make([]byte, 1400)
				return q
			}
			fragNeeded := xdptest.ICMPError(clientMAC, nicMAC, router4, vip4, 3, 4, 1280, reply(f4).IP()[:28])
			ptb := xdptest.ICMPError(clientMAC, nicMAC, router6, vip6, 2, 0, 1280, reply(f6).IP()[:48])
			return []step{
				{name: "v4 flow", in: f4.Bytes(), verdict: xdptest.TX, out: to(f4, r1), reasons: reasons(rTX, 1)},
				{name: "v6 flow", in: f6.Bytes(), verdict: xdptest.TX, out: to(f6, r1), reasons: reasons(rTX, 1)},
				{name: "frag needed to r1", apply: ptr(desired(r1, r2)), in: fragNeeded, verdict: xdptest.TX,
					out: withMACs(fragNeeded, nicMAC, r1MAC), reasons: reasons(rICMP, 1, rTX, 1)},
				{name: "packet too big to r1", in: ptb, verdict: xdptest.TX,
					out: withMACs(ptb, nicMAC, r1MAC), reasons: reasons(rICMP, 1, rTX, 1)},
			}
		}},
		{"icmp error about an unknown flow follows the ring", desired(r1, r2), func(t testing.TB) []step {
			mk := func(s uint16) xdptest.Packet { return udp4(s) }
			f := mk(sportFor(t, mk, r2, r1, r2))
			q := f
			q.Src, q.Dst, q.SPort, q.DPort = f.Dst, f.Src, f.DPort, f.SPort
			unreach := xdptest.ICMPError(clientMAC, nicMAC, client4, vip4, 3, 3, 0, q.IP())
			return []step{{in: unreach, verdict: xdptest.TX, out: withMACs(unreach, nicMAC, r2MAC), reasons: reasons(rICMP, 1, rTX, 1)}}
		}},
		{"fragments and options", single(r1), func(t testing.TB) []step {
			frag := udp4(40020)
			frag.MoreFragments = true
			later := udp4(40020)
			later.FragOffset = 185
			opts := tcp4(40021, xdptest.SYN)
			opts.IPOptions = []byte{0x94, 0x04, 0, 0} // router alert
			hopByHop := ipv6WithHopByHop(tcp6(40022, xdptest.SYN))
			v6frag := ipv6WithFragment(udp6(40023))
			return []step{
				{name: "first fragment", in: frag.Bytes(), verdict: xdptest.Pass, reasons: reasons(rFragment, 1)},
				{name: "later fragment", in: later.Bytes(), verdict: xdptest.Pass, reasons: reasons(rFragment, 1)},
				{name: "ipv4 options are steered", in: opts.Bytes(), verdict: xdptest.TX, out: to(opts, r1), reasons: reasons(rOptions, 1, rTX, 1)},
				{name: "ipv6 hop-by-hop", in: hopByHop, verdict: xdptest.Pass, reasons: reasons(rV6Ext, 1)},
				{name: "ipv6 fragment header", in: v6frag, verdict: xdptest.Pass, reasons: reasons(rFragment, 1)},
			}
		}},
		{"removed VIP: its cached flows pass", single(r1), func(t testing.TB) []step {
			p := tcp4(40050, xdptest.ACK)
			gone := Desired{Seed: testSeed}
			return []step{
				{name: "flow cached", in: p.Bytes(), verdict: xdptest.TX, out: to(p, r1), reasons: reasons(rTX, 1)},
				{name: "fast path", in: p.Bytes(), verdict: xdptest.TX, out: to(p, r1), reasons: reasons(rTX, 1)},
				{name: "VIP removed", apply: &gone, in: p.Bytes(), verdict: xdptest.Pass, reasons: reasons(rNotVIP, 1)},
			}
		}},
		{"any-port VIP steers every TCP and UDP port", Desired{Seed: testSeed, Groups: []Group{{
			Name: "edge/any", VIPs: []netip.Addr{vip4, vip6}, Backends: []Backend{r2},
		}}}, func(t testing.TB) []step {
			high := tcp4(40060, xdptest.SYN)
			high.DPort = 65000
			u := udp6(40061)
			u.DPort = 1
			return []step{
				{name: "tcp/65000", in: high.Bytes(), verdict: xdptest.TX, out: to(high, r2), reasons: reasons(rTX, 1)},
				{name: "udp/1 over v6", in: u.Bytes(), verdict: xdptest.TX, out: to(u, r2), reasons: reasons(rTX, 1)},
				{name: "icmp echo still local", in: xdptest.ICMPEcho(clientMAC, nicMAC, client4, vip4), verdict: xdptest.Pass, reasons: reasons(rICMPOther, 1)},
			}
		}},
		// No replica ready: the draining ones take new flows (as kube-proxy
		// serves terminating endpoints when none is ready), never one called
		// down; with every replica down the node's own stack answers.
		{"VIP with only draining backends", desired(draining(r1), draining(down(r2))), func(t testing.TB) []step {
			var steps []step
			for port := uint16(40030); port < 40038; port++ {
				syn := tcp4(port, xdptest.SYN)
				steps = append(steps, step{name: fmt.Sprintf("SYN %d", port), in: syn.Bytes(), verdict: xdptest.TX, out: to(syn, r1), reasons: reasons(rTX, 1)})
			}
			return steps
		}},
		{"VIP with only down backends", desired(down(r1), draining(down(r2))), func(t testing.TB) []step {
			return []step{{in: tcp4(40030, xdptest.SYN).Bytes(), verdict: xdptest.Pass, reasons: reasons(rNoBackend, 1)}}
		}},
		{"truncated headers at every layer", single(r1), func(t testing.TB) []step {
			var steps []step
			cut := func(name string, frame []byte, n int) {
				steps = append(steps, step{name: fmt.Sprintf("%s cut at %d", name, n), in: frame[:n], verdict: xdptest.Pass, reasons: reasons(rMalformed, 1)})
			}
			v4, v6 := tcp4(40040, xdptest.SYN).Bytes(), tcp6(40041, xdptest.SYN).Bytes()
			u4 := udp4(40042).Bytes()
			for _, n := range []int{14, 20, 33, 34, 40, 53} {
				cut("v4 tcp", v4, n)
			}
			for _, n := range []int{14, 30, 53, 54, 60, 73} {
				cut("v6 tcp", v6, n)
			}
			cut("v4 udp", u4, 41)
			icmp := xdptest.ICMPError(clientMAC, nicMAC, router4, vip4, 3, 4, 1280, tcp4(80, xdptest.ACK).IP()[:28])
			for _, n := range []int{34 + 4, 34 + 8 + 10, 34 + 8 + 20 + 2} {
				cut("icmp", icmp, n)
			}
			bad := slices.Clone(v4)
			bad[14] = 0x44 // IHL 4 < 5
			steps = append(steps, step{name: "v4 ihl 4", in: bad, verdict: xdptest.Pass, reasons: reasons(rMalformed, 1)})
			return steps
		}},
	}
}

// ipv6WithHopByHop inserts an empty hop-by-hop options header.
func ipv6WithHopByHop(p xdptest.Packet) []byte {
	return insertV6Ext(p.Bytes(), 0, []byte{0, 0, 1, 4, 0, 0, 0, 0})
}

// ipv6WithFragment inserts a fragment header (first fragment, more to come).
func ipv6WithFragment(p xdptest.Packet) []byte {
	return insertV6Ext(p.Bytes(), 44, []byte{0, 0, 0, 1, 0, 0, 0, 42})
}

func insertV6Ext(frame []byte, nh byte, ext []byte) []byte {
	ext = slices.Clone(ext)
	ext[0] = frame[14+6] // the extension's next header is the old one
	out := slices.Concat(frame[:54], ext, frame[54:])
	out[14+6] = nh
	plen := int(out[18])<<8 | int(out[19]) + len(ext)
	out[18], out[19] = byte(plen>>8), byte(plen)
	return out
}

func TestFixtures(t *testing.T) {
	for _, fx := range fixtures() {
		t.Run(fx.name, func(t *testing.T) {
			// A step's counters depend on this CPU's flow cache.
			defer onOneCPU(t)()
			d := loadForTest(t)
			if err := d.SetMAC(nicMAC); err != nil {
				t.Fatal(err)
			}
			if _, err := d.Apply(fx.state); err != nil {
				t.Fatalf("apply: %v", err)
			}
			for i, s := range fx.steps(t) {
				name := s.name
				if name == "" {
					name = fmt.Sprint(i)
				}
				if s.apply != nil {
					if _, err := d.Apply(*s.apply); err != nil {
						t.Fatalf("%s: apply: %v", name, err)
					}
				}
				before, err := d.Counters()
				if err != nil {
					t.Fatal(err)
				}
				in := slices.Clone(s.in)
				verdict, out, err := xdptest.Run(d.Program(), in)
				if err != nil {
					t.Fatalf("%s: run: %v", name, err)
				}
				if verdict != s.verdict {
					t.Errorf("%s: verdict %s, want %s", name, xdptest.VerdictName(verdict), xdptest.VerdictName(s.verdict))
				}
				want := s.out
				if want == nil {
					want = s.in
				}
				if diff := cmp.Diff(want, out); diff != "" {
					t.Errorf("%s: output frame (-want +got):\n%s", name, diff)
				}
				after, err := d.Counters()
				if err != nil {
					t.Fatal(err)
				}
				got := map[Reason]uint64{}
				for r := range ReasonCount {
					if delta := after.Reasons[r] - before.Reasons[r]; delta != 0 {
						got[Reason(r)] = delta
					}
				}
				if diff := cmp.Diff(s.reasons, got); diff != "" {
					t.Errorf("%s: reason counter deltas (-want +got):\n%s", name, diff)
				}
			}
		})
	}
}
