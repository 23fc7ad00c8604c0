package dataplane

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// desired is node i's view of the model.
func (w *pccWorld) desired(i int) Desired {
	var bs []Backend
	for j, n := range w.nodes {
		if w.role[j] == pccNone {
			continue
		}
		b := Backend{Addr: n.addr, Draining: w.role[j] == pccDraining}
		// The agent's rule: a draining replica called dead is down too. With
		// -pcc.selfview a node checks its own nginx locally, as the agent does:
		// the network fault that makes the others call it down wrongly leaves
		// its own verdict alone, and its rings differ from theirs.
		b.Down = w.downAt(i, j, w.skewServes(i))
		if j == i {
			b.Local = true
		} else {
			b.MAC = n.mac
		}
		bs = append(bs, b)
	}
	return Desired{Seed: testSeed, Groups: []Group{{Name: "edge/pcc", VIPs: []netip.Addr{vip4, vip6}, Backends: bs}}, Differ: w.differs(i)}
}

// differs is liveness.Checker.Differ at node i: the verdicts of another
// replica it calls live (its answers to i's probes) differ from i's own.
func (w *pccWorld) differs(i int) bool {
	mine := w.verdicts(i)
	for k := range w.nodes {
		if k != i && !w.dead[k] && w.role[k] != pccNone && !w.downAt(i, k, w.skewServes(i)) && !slices.Equal(w.verdicts(k), mine) {
			return true
		}
	}
	return false
}

// verdicts are the replicas node i calls down.
func (w *pccWorld) verdicts(i int) []int {
	var out []int
	for j := range w.nodes {
		if w.role[j] != pccNone && w.downAt(i, j, w.skewServes(i)) {
			out = append(out, j)
		}
	}
	return out
}

// skewServes: with its own verdicts, node i still has a replica that takes
// new flows. Liveness never empties a group (agent's desiredFor: the last
// burst of verdicts is overruled), so where they would, the others' hold.
func (w *pccWorld) skewServes(i int) bool {
	for j := range w.nodes {
		if w.role[j] != pccNone && !w.downAt(i, j, true) {
			return true
		}
	}
	return false
}

// downAt is node i's verdict on replica j: the others' (down), its own where
// it alone sees another (skew, when skewed), and, for itself, what it has
// learned (-pcc.selfview).
func (w *pccWorld) downAt(i, j int, skewed bool) bool {
	down := w.down[j]
	if k := w.skew[[2]int{i, j}]; skewed && k != 0 && !w.dead[j] {
		down = k > 0
	}
	if j == i && !w.dead[j] && *pccSelfView != "at-once" {
		down = w.self[j]
	}
	return down
}

// applyAll applies the model to every live node but one (-1: none).
func (w *pccWorld) applyAll(except int) {
	for i := range w.nodes {
		if i != except && !w.dead[i] {
			w.apply(i)
		}
	}
}

func (w *pccWorld) apply(i int) {
	if _, err := w.nodes[i].d.Apply(w.desired(i)); err != nil {
		w.t.Fatalf("apply on %s: %v", w.name(i), err)
	}
}

// recordRing notes the current ring, as a node but late has applied it (vip6's
// ring has the same slots as vip4's).
func (w *pccWorld) recordRing(late int) {
	from := 0
	for w.dead[from] || from == late {
		from++
	}
	d := w.nodes[from].d
	ids := d.st.rings[d.st.vipIDs[vip4]]
	slots := make([]int, len(ids))
	for s, id := range ids {
		slots[s] = w.nodeAt(d.st.backends[id].Addr)
	}
	w.rings = append(w.rings, pccRingAt{w.event, slots})
}

// nodeAt is the index of the node with an address, as the maps hold it, or -1.
func (w *pccWorld) nodeAt(a [16]byte) int {
	return slices.IndexFunc(w.nodes, func(n *pccNode) bool { return n.addr == addrFrom16(a) })
}

// ringHistory says which node the current ring named for a flow, from the
// start (the previous ring of the whole sequence's transition) to now.
func (w *pccWorld) ringHistory(f *pccFlow) string {
	slot := int(FlowHash(flowFromKey(f.key), testSeed) % testRing)
	var out []string
	last := -2
	for _, r := range w.rings {
		at := -1 // no ring: no replica took new flows
		if len(r.slots) > 0 {
			at = r.slots[slot]
		}
		if at == last {
			continue
		}
		last = at
		when := fmt.Sprintf("from e%d", r.event)
		if r.event == 0 {
			when = "at the start (the previous ring throughout)"
		}
		name := "no ring"
		if at >= 0 {
			name = w.name(at)
		}
		out = append(out, fmt.Sprintf("%s %s", when, name))
	}
	return strings.Join(out, ", ")
}

// views says, for every live node, what its rings name for a flow, where it
// pinned it, and whether it has its socket.
func (w *pccWorld) views(f *pccFlow) string {
	slot := FlowHash(flowFromKey(f.key), testSeed) % testRing
	var b strings.Builder
	for i, n := range w.nodes {
		if w.dead[i] {
			continue
		}
		d := n.d
		vip := d.st.vipIDs[f.pkt.Dst]
		fmt.Fprintf(&b, "  %s: current ring %s", w.name(i), w.backendAt(d, d.st.rings[vip], slot))
		if _, ok := d.st.prevUntil[vip]; ok {
			prev, err := maps{rings: d.objs.PrevRings}.ring(vip, testRing)
			if err != nil {
				w.t.Fatal(err)
			}
			fmt.Fprintf(&b, ", previous ring %s", w.backendAt(d, prev, slot))
		}
		var fv lbFlowVal
		if d.objs.NewPins.Lookup(&f.key, &fv) == nil {
			fmt.Fprintf(&b, ", new pin %s", w.backendName(d, fv.BackendId))
		}
		if d.objs.Flows.Lookup(&f.key, &fv) == nil {
			fmt.Fprintf(&b, ", pinned %s", w.backendName(d, fv.BackendId))
		}
		var v uint32
		if d.objs.SockModel.Lookup(&f.key, &v) == nil {
			b.WriteString(map[uint32]string{uint32(lbLbLimitsLB_SOCK_LIVE): ", has the socket", uint32(lbLbLimitsLB_SOCK_ENDED): ", has its socket in TIME_WAIT"}[v])
		}
		b.WriteString("\n")
	}
	return b.String()
}

func (w *pccWorld) backendAt(d *Dataplane, ring []uint32, slot uint32) string {
	if int(slot) >= len(ring) {
		return "none"
	}
	return w.backendName(d, ring[slot])
}

// backendName names the node of a backend id in d's maps, with its flags.
func (w *pccWorld) backendName(d *Dataplane, id uint32) string {
	be, ok := d.st.backends[id]
	if !ok {
		return fmt.Sprintf("cleared id %d", id)
	}
	s := "?"
	if i := w.nodeAt(be.Addr); i >= 0 {
		s = w.name(i)
	}
	if be.Flags&uint16(lbBackendFlagsBACKEND_F_DOWN) != 0 {
		s += "(down)"
	} else if be.Flags&uint16(lbBackendFlagsBACKEND_F_DRAINING) != 0 {
		s += "(draining)"
	}
	return s
}

func (w *pccWorld) inTransition() bool {
	for i, n := range w.nodes {
		if !w.dead[i] && len(n.d.st.prevUntil) > 0 {
			return true
		}
	}
	return false
}

// serving counts the replicas that take new connections, but for node skip:
// the ready ones, or, when none is, the draining ones (Apply's rule, as
// kube-proxy's for terminating endpoints). Neither counts one called down.
func (w *pccWorld) serving(skip int) int {
	ready, draining := 0, 0
	for i := range w.nodes {
		if i == skip || w.dead[i] || w.down[i] {
			continue
		}
		switch w.role[i] {
		case pccReady:
			ready++
		case pccDraining:
			draining++
		}
	}
	if ready > 0 {
		return ready
	}
	return draining
}

func (w *pccWorld) live(skip int) (nodes, directors int) {
	for i := range w.nodes {
		if i != skip && !w.dead[i] {
			nodes++
			if slices.Contains(w.pool, i) {
				directors++
			}
		}
	}
	return nodes, directors
}

func (w *pccWorld) randomLive() int {
	for {
		if i := w.rng.IntN(len(w.nodes)); !w.dead[i] {
			return i
		}
	}
}
