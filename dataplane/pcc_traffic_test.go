package dataplane

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/portico-edge/portico/dataplane/xdptest"
)

// traffic opens a few connections and sends a packet of about a third of the
// open ones.
func (w *pccWorld) traffic() *pccFailure {
	for range 1 + w.rng.IntN(3) {
		if f := w.open(); f != nil {
			return f
		}
	}
	if *pccUDP && w.rng.IntN(2) == 0 {
		if f := w.openUDP(); f != nil {
			return f
		}
	}
	// Now and then a connection ends: its holder closed it first, so its
	// socket waits in TIME_WAIT, and the client may reuse its port. (A UDP
	// flow's session ends without a packet: it is simply no longer checked.)
	if len(w.flows) > 0 && w.rng.IntN(4) == 0 {
		i := w.rng.IntN(len(w.flows))
		f := w.flows[i]
		if f.udp {
			w.flows = slices.Delete(w.flows, i, i+1)
			goto data
		}
		f.closing = true // the client's FIN, through whichever director the router picks
		if fail := w.check(f, fmt.Sprintf("FIN after e%d", w.event)); fail != nil {
			return fail
		}
		if err := w.nodes[f.holder].d.objs.SockModel.Put(&f.key, uint32(lbLbLimitsLB_SOCK_ENDED)); err != nil {
			w.t.Fatalf("end a socket: %v", err)
		}
		w.flows = slices.Delete(w.flows, i, i+1)
		w.ended = append(w.ended, f)
		w.stats.ended++
	}
data:
	for _, f := range slices.Clone(w.flows) {
		if w.rng.IntN(3) == 0 {
			if fail := w.check(f, fmt.Sprintf("data after e%d", w.event)); fail != nil {
				return fail
			}
		}
	}
	return nil
}

// openUDP sends a new UDP flow's first datagram: where it is served holds the
// flow (an nginx stream session), and every later datagram must go there.
func (w *pccWorld) openUDP() *pccFailure {
	f := w.newFlow()
	if f.reuses != nil {
		return nil // a TCP 5-tuple
	}
	f.udp = true
	f.pkt.Proto, f.pkt.DPort = xdptest.UDP, 53
	f.key = Flow{Src: f.pkt.Src, Dst: f.pkt.Dst, SPort: f.pkt.SPort, DPort: f.pkt.DPort, Protocol: xdptest.UDP}.key()
	f.hash = pccRouterHash(f.key)
	if w.seen[f.key] {
		return nil
	}
	w.seen[f.key] = true
	f.via = w.director(f)
	trip := w.send(f, 0, []byte("first"))
	f.history = append(f.history, fmt.Sprintf("first datagram after e%d: %s", f.after, trip))
	if most, _ := trip.mostForwards(f.via, -1); most > 1 {
		return w.failure("udp-forwarded-twice", f, "first datagram", trip) // as for TCP
	}
	switch {
	case trip.end == pccPassed && w.role[trip.at] == pccNone:
		if w.late >= 0 {
			return nil // a lagging node's view: nothing listens there
		}
		return w.failure("udp-at-non-replica", f, "first datagram", trip)
	case trip.end == pccPassed:
		f.holder = trip.at
		w.flows = append(w.flows, f)
		w.stats.udpFlows++
		return nil
	case w.late >= 0:
		return nil
	}
	return w.failure("udp-first-"+trip.end.String(), f, "first datagram", trip)
}

// open sends a new connection's SYN and, once a node's stack has it, its ACK.
func (w *pccWorld) open() *pccFailure {
	f := w.newFlow()
	f.via = w.director(f)
	trip := w.send(f, xdptest.SYN, nil)
	f.history = append(f.history, fmt.Sprintf("SYN after e%d: %s", f.after, trip))
	switch {
	case trip.end == pccPassed && w.role[trip.at] == pccNone && w.late >= 0:
		w.stats.synRefused++ // a lagging node's view: the stack there refuses it
		return nil
	case trip.end == pccPassed && w.role[trip.at] == pccNone:
		return w.failure("syn-at-non-replica", f, "SYN", trip)
	case trip.end == pccPassed && !trip.intact:
		return w.failure("altered", f, "SYN", trip)
	case trip.end == pccPassed:
		f.holder = trip.at
		if err := w.nodes[f.holder].d.objs.SockModel.Put(&f.key, uint32(1)); err != nil {
			w.t.Fatalf("put socket: %v", err)
		}
		w.flows = append(w.flows, f)
		w.stats.flows++
		if w.inTransition() {
			w.stats.inTransition++
		}
	case trip.end == pccLost && w.late >= 0:
		w.stats.synLost++ // a lagging node does not know yet that it died
		return nil
	default:
		return w.failure("syn-"+trip.end.String(), f, "SYN", trip)
	}
	return w.check(f, "ACK right after its SYN")
}

func (w *pccWorld) newFlow() *pccFlow {
	if len(w.ended) > 0 && w.rng.IntN(4) == 0 {
		// A client reuses the 5-tuple of a connection that ended.
		i := w.rng.IntN(len(w.ended))
		old := w.ended[i]
		w.ended = slices.Delete(w.ended, i, i+1)
		w.stats.reused++
		w.seen[old.key] = true
		return &pccFlow{id: len(w.seen) + w.stats.reused, pkt: old.pkt, key: old.key, hash: old.hash, holder: -1, after: w.event, late: w.late, reuses: old,
			history: []string{fmt.Sprintf("reuses the 5-tuple of f%d, which %s held", old.id, w.name(old.holder))}}
	}
	for {
		p := xdptest.Packet{SrcMAC: clientMAC, Proto: xdptest.TCP, Dst: vip4,
			SPort: uint16(1024 + w.rng.IntN(64512)), DPort: []uint16{80, 443, 8443}[w.rng.IntN(3)]}
		if w.rng.IntN(3) == 0 {
			a := client6.As16()
			a[12], a[13], a[14], a[15] = byte(w.rng.IntN(256)), byte(w.rng.IntN(256)), byte(w.rng.IntN(256)), byte(w.rng.IntN(256))
			p.Src, p.Dst = netip.AddrFrom16(a), vip6
		} else {
			p.Src = netip.AddrFrom4([4]byte{198, 51, byte(100 + w.rng.IntN(2)), byte(w.rng.IntN(256))})
		}
		key := Flow{Src: p.Src, Dst: p.Dst, SPort: p.SPort, DPort: p.DPort, Protocol: xdptest.TCP}.key()
		if w.seen[key] {
			continue
		}
		w.seen[key] = true
		return &pccFlow{id: len(w.seen), pkt: p, key: key, hash: pccRouterHash(key), holder: -1, after: w.event, late: w.late}
	}
}

// pccRouterHash is the router's ECMP hash of a flow (FNV-1a over the 5-tuple).
func pccRouterHash(k lbFlowKey) uint32 {
	h := uint32(2166136261)
	for _, b := range slices.Concat(k.Src[:], k.Dst[:], []byte{byte(k.Sport), byte(k.Sport >> 8), byte(k.Dport), byte(k.Dport >> 8), k.Proto}) {
		h = (h ^ uint32(b)) * 16777619
	}
	return h
}

// check sends a packet of an open connection: it must reach its holder's stack
// as the client sent it.
func (w *pccWorld) check(f *pccFlow, what string) *pccFailure {
	if f.udp {
		return w.checkUDP(f, what)
	}
	flags := uint8(xdptest.ACK | xdptest.PSH)
	payload := []byte(fmt.Sprintf("f%d #%d", f.id, f.sent))
	switch {
	case f.sent == 0:
		flags, payload = xdptest.ACK, nil
	case f.closing:
		flags, payload = xdptest.ACK|xdptest.FIN, nil
	}
	f.sent++
	// The director's pin as the packet finds it: a FIN that follows it
	// deletes it.
	pinned := w.pinnedAt(w.director(f), f)
	trip := w.send(f, flags, payload)
	w.stats.packets++
	lag := ""
	if w.late >= 0 {
		lag = fmt.Sprintf(" (%s lagging)", w.name(w.late))
	}
	f.history = append(f.history, fmt.Sprintf("%s%s: %s", what, lag, trip))
	class := ""
	most, pinWalk := trip.mostForwards(w.director(f), pinned)
	// While the edges' verdicts differ, one that calls a replica down
	// places it in the walk's second class, and one that does not in the
	// first: positions still rise at every hop (no loop), but an edge may
	// stand once in each class (bpf/README.md, "Verdicts that differ").
	skewTwice := most == 2 && w.verdictsDiffer()
	switch {
	case skewTwice:
		w.stats.twiceSkew++
	case most > 1:
		w.stats.twice++
	case pinWalk:
		w.stats.pinWalks++
	}
	switch {
	case most > 1 && !skewTwice:
		// Along the walk an edge sends a packet on once; the director's tag
		// keeps the walk from coming back to it (bpf/README.md). The one
		// exception is the replica a director's pin named, when its stack
		// does not have the connection (pinWalk).
		class = "forwarded-twice"
	case (trip.end == pccDropped || trip.end == pccLost) && w.late >= 0 && what != "last packet":
		// Sent while one node had not applied a change: its rings differ
		// from the others' for that moment, and a packet may be dropped
		// or sent to a node it does not know is dead (TCP sends it again;
		// the connection's next packets, after it applied, must arrive),
		// never reset.
		w.stats.lagLost++
	case trip.end == pccLost && w.stalePin(f, trip, pinned):
		// The limit of pins (bpf/README.md): a director pinned the 5-tuple's
		// ended connection and never saw it end (its FIN went through another
		// director), and the client reused the port; the old holder is dead.
		// A director's own pin to a replica called down asks the ring's
		// replica first (LB_MARK_DOWNPIN); what is left goes through hand-off
		// pins that lead to the dead node. TCP sends the packet again, and
		// that must arrive: a pin that keeps taking the connection's packets
		// to the dead node hangs it. (Unless its holder is called down
		// wrongly: then its packets may go to a dead replica called down
		// first while the verdict holds, below.)
		w.stats.stalePinLost++
		if w.wronglyDown(f.holder) {
			break
		}
		again := w.send(f, flags, payload)
		f.history = append(f.history, fmt.Sprintf("%s, sent again: %s", what, again))
		if again.end != pccPassed || again.at != f.holder {
			return w.failure("hang", f, what+", sent again", again)
		}
	case trip.end == pccLost && w.wronglyDown(f.holder):
		// Its holder is called dead wrongly, and the packet went to a node
		// that is: lost while the verdict holds (TCP sends it again), but
		// every packet after the verdict cleared must arrive.
		w.stats.downLost++
	case trip.end == pccPassed && trip.at != f.holder:
		class = "reset"
	case trip.end == pccPassed && !trip.intact:
		class = "altered"
	case trip.end == pccLost:
		class = "hang"
	case trip.end != pccPassed:
		class = trip.end.String()
	}
	if class != "" {
		return w.failure(class, f, what, trip)
	}
	return nil
}

// wronglyDown: live replica h is called down, by every edge or by one alone.
func (w *pccWorld) wronglyDown(h int) bool {
	if w.dead[h] {
		return false
	}
	if w.down[h] {
		return true
	}
	for k, v := range w.skew {
		if k[1] == h && v > 0 && !w.dead[k[0]] {
			return true
		}
	}
	return false
}

// checkUDP sends a datagram of an open UDP flow: it must reach its holder.
func (w *pccWorld) checkUDP(f *pccFlow, what string) *pccFailure {
	f.sent++
	trip := w.send(f, 0, []byte(fmt.Sprintf("f%d #%d", f.id, f.sent)))
	w.stats.packets++
	lag := ""
	if w.late >= 0 {
		lag = fmt.Sprintf(" (%s lagging)", w.name(w.late))
	}
	f.history = append(f.history, fmt.Sprintf("%s%s: %s", what, lag, trip))
	if most, _ := trip.mostForwards(w.director(f), -1); most > 1 {
		return w.failure("udp-forwarded-twice", f, what, trip)
	}
	switch {
	case trip.end == pccPassed && trip.at == f.holder && trip.intact:
		return nil
	case trip.end == pccLost && w.late >= 0 && what != "last packet":
		w.stats.lagLost++
		return nil
	case trip.end == pccPassed && trip.at != f.holder && (w.late >= 0 || f.late >= 0):
		// An edge that has not applied a change (now, or when the flow
		// began) steers by rings the others left (bpf/README.md,
		// "Limits"): the flow's session there is new.
		w.stats.udpLagMoved++
		w.flows = slices.DeleteFunc(w.flows, func(g *pccFlow) bool { return g == f })
		return nil
	case trip.end == pccPassed && trip.at != f.holder && !f.reported && w.wronglyDown(f.holder):
		// A UDP walk asks no replica called down (a dead one would take
		// every new flow's datagrams), so one called down wrongly keeps
		// only the flows its holder's report pinned (bpf/README.md, "UDP").
		w.stats.udpDownMoved++
		w.flows = slices.DeleteFunc(w.flows, func(g *pccFlow) bool { return g == f })
		return nil
	case trip.end == pccPassed && trip.at != f.holder:
		return w.failure("udp-moved", f, what, trip)
	case trip.end == pccPassed:
		return w.failure("udp-altered", f, what, trip)
	}
	return w.failure("udp-"+trip.end.String(), f, what, trip)
}

func (w *pccWorld) failure(class string, f *pccFlow, what string, trip pccTrip) *pccFailure {
	return &pccFailure{class: class, flow: f, what: what, trip: trip, late: w.late}
}

// send makes the router deliver one segment of f to a director, and follows it.
func (w *pccWorld) send(f *pccFlow, flags uint8, payload []byte) pccTrip {
	to := w.director(f)
	p := f.pkt
	p.DstMAC, p.Flags, p.Payload = w.nodes[to].mac, flags, payload
	frame := p.Bytes()
	trip := w.deliver(frame, to)
	trip.in = frame
	if trip.end == pccPassed {
		trip.intact = pccIntact(trip.frame, frame)
	}
	return trip
}

// pccIntact reports whether got is the frame the client sent, MACs aside and
// but for where a walk carries its director's tag (the IPv4 identification,
// with the header checksum, which must be right; the IPv6 flow label's low 16
// bits) and, for UDP over IPv6, its mark (the flow label's top 4 bits).
func pccIntact(got, sent []byte) bool {
	if len(got) != len(sent) || len(got) < 14+20 || got[14]>>4 == 6 && len(got) < 14+40 {
		return false
	}
	a, b := slices.Clone(got[12:]), slices.Clone(sent[12:])
	var skip []int // offsets in a and b
	switch binary.BigEndian.Uint16(a) {
	case 0x0800:
		if ipv4Checksum(got[14:34]) != 0 {
			return false
		}
		skip = []int{2 + 4, 2 + 5, 2 + 10, 2 + 11}
	case 0x86dd:
		skip = []int{2 + 2, 2 + 3}
		if a[2+6] == xdptest.UDP { // and the top 4 bits a UDP walk's mark took (encap.h)
			a[2+1] &^= 0x0f
			b[2+1] &^= 0x0f
		}
	}
	for _, i := range skip {
		a[i], b[i] = 0, 0
	}
	return slices.Equal(a, b)
}

// stalePin reports whether trip, of f, was lost at the dead node that held a
// connection f reuses the 5-tuple of (the last one, or one before it: a
// director that saw none of the later ones still pins it), sent there by its
// director's pin of that connection (pinned: the node the director's pin named
// when the packet came, -1 for none).
func (w *pccWorld) stalePin(f *pccFlow, trip pccTrip, pinned int) bool {
	if !w.dead[trip.at] || len(trip.hops) == 0 {
		return false
	}
	held := false
	for r := f.reuses; r != nil && !held; r = r.reuses {
		held = r.holder == trip.at
	}
	return held && pinned == trip.at && trip.hops[0].node == w.director(f)
}

// pinnedAt is the node that node's pin of f (in flows) names, -1 for none.
func (w *pccWorld) pinnedAt(node int, f *pccFlow) int {
	d := w.nodes[node].d
	var fv lbFlowVal
	if d.objs.Flows.Lookup(&f.key, &fv) != nil {
		return -1
	}
	return w.nodeAt(d.st.backends[fv.BackendId].Addr)
}

// director is the node the router sends a flow's frames to.
func (w *pccWorld) director(f *pccFlow) int {
	if !w.ecmp {
		return w.owner
	}
	var live []int
	for _, i := range w.pool {
		if w.on[i] && w.canDirect(i) {
			live = append(live, i)
		}
	}
	return live[f.hash%uint32(len(live))]
}

type pccEnd int

const (
	pccPassed pccEnd = iota
	pccLost          // sent to a dead node
	pccDropped
	pccLoop
	pccStray // sent to a MAC that is no node's
	pccOther // a verdict xdp_lb never gives
)

func (e pccEnd) String() string {
	return [...]string{"passed", "hang", "drop", "loop", "stray", "verdict"}[e]
}

type pccHop struct {
	node    int
	verdict uint32
	reasons []Reason
}

// pccTrip is the way of one frame: the nodes it went through, and its end.
type pccTrip struct {
	w      *pccWorld
	hops   []pccHop
	end    pccEnd
	at     int    // where it ended (passed, or the dead node it went to)
	in     []byte // the client's frame
	frame  []byte // the frame at its end
	intact bool   // passed as the client sent it, MACs aside
}

func (tr pccTrip) String() string {
	var b strings.Builder
	for _, h := range tr.hops {
		var rs []string
		for _, r := range h.reasons {
			rs = append(rs, ReasonName(r))
		}
		fmt.Fprintf(&b, "%s %s(%s) > ", tr.w.name(h.node), strings.TrimPrefix(xdptest.VerdictName(h.verdict), "XDP_"), strings.Join(rs, ","))
	}
	switch tr.end {
	case pccPassed:
		s := strings.TrimSuffix(b.String(), " > ")
		if !tr.intact {
			s += " [frame altered]"
		}
		return s
	case pccLost:
		return b.String() + tr.w.name(tr.at) + " (dead)"
	case pccStray:
		return b.String() + net.HardwareAddr(tr.frame[0:6]).String()
	}
	return strings.TrimSuffix(b.String(), " > ") + " [" + tr.end.String() + "]"
}

// mostForwards is how many times the node that sent the frame on most often
// did (XDP_TX), director included; but for the replica the director's pin named
// (pinned, -1 for none), the frame's second hop, whose first sending on is not
// counted: its stack did not have the connection (the pin outlived one that
// ended there, and the client reused the port), and a pin gives no place in the
// walk's order, so it walked the frame from the chain's start, and the walk may
// bring it back once (bpf/README.md, "Limits"). pinWalk says it did.
func (tr pccTrip) mostForwards(director, pinned int) (most int, pinWalk bool) {
	restart := len(tr.hops) > 1 && tr.hops[0].node == director && tr.hops[1].node == pinned
	sent := map[int]int{}
	for i, h := range tr.hops {
		if h.verdict != xdptest.TX || restart && i == 1 {
			continue
		}
		sent[h.node]++
		most = max(most, sent[h.node])
	}
	return most, restart && tr.hops[1].verdict == xdptest.TX && sent[pinned] > 0
}

// deliver runs a frame through node to's xdp_lb and on through every node it
// is sent to.
func (w *pccWorld) deliver(frame []byte, to int) pccTrip {
	trip := pccTrip{w: w}
	for range pccMaxHops {
		if w.dead[to] {
			trip.end, trip.at, trip.frame = pccLost, to, frame
			return trip
		}
		n := w.nodes[to]
		verdict, out, err := xdptest.Run(n.d.Program(), frame)
		if err != nil {
			w.t.Fatalf("run on n%d: %v", n.id, err)
		}
		reasons, err := n.newReasons()
		if err != nil {
			w.t.Fatalf("read reasons of n%d: %v", n.id, err)
		}
		if slices.Contains(reasons, lbReasonREASON_HANDOFF) {
			w.stats.handoffs++
		}
		if slices.Contains(reasons, lbReasonREASON_HANDOFF_RESCUE) {
			w.stats.rescues++
		}
		trip.hops = append(trip.hops, pccHop{node: to, verdict: verdict, reasons: reasons})
		trip.frame, trip.at = out, to
		switch verdict {
		case xdptest.Pass:
			trip.end = pccPassed
			return trip
		case xdptest.Drop:
			trip.end = pccDropped
			return trip
		case xdptest.TX:
			next := slices.IndexFunc(w.nodes, func(m *pccNode) bool { return slices.Equal(m.mac, out[0:6]) })
			if next < 0 {
				trip.end = pccStray
				return trip
			}
			frame, to = out, next
		default:
			trip.end = pccOther
			return trip
		}
	}
	trip.end = pccLoop
	return trip
}
