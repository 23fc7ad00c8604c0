package dataplane

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/portico-edge/portico/dataplane/bpftest"
	"github.com/portico-edge/portico/dataplane/xdptest"
)

var (
	pccSeed      = flag.Uint64("pcc.seed", 0, "TestPCCModel: the seed of the sequences (0: a random one)")
	pccSequences = flag.Int("pcc.sequences", 1000, "TestPCCModel: how many sequences to run")
	pccSequence  = flag.Int("pcc.sequence", -1, "TestPCCModel: run only this sequence of the seed (a replay)")
	pccSelfView  = flag.String("pcc.selfview", "learns", "TestPCCModel: how a node comes to call itself down: 'learns' (the agent: from the other edges' answers to its probes, a moment after they decided, and by a cycle when its agent restarts), 'never' (its checks of itself are local only: the open class before it learned), 'at-once' (with the others)")
	pccAll       = flag.Bool("pcc.all", false, "TestPCCModel: run every sequence and count the failing ones by class, instead of stopping at the first")
)

const (
	pccMaxNodes = 8
	pccMaxHops  = 16
)

// TestPCCModel checks per-connection consistency: a packet of an established TCP
// connection reaches the node whose stack accepted its SYN, whatever happened
// since the connection opened: replicas added, removed, draining, called down by
// the liveness checks (a node that really died, or a false positive), the VRRP
// owner or the ECMP set of directors changing, one node applying a change later
// than the others.
//
// Each sequence is a random world of 3-8 edge nodes, 2-5 of them directors (one
// VIP owner, or all behind a router's ECMP hash; a director is an edge with a
// replica), and 3-14 events (within the 16 rings a transition holds) with new
// connections and packets of open ones between them. Every frame goes through
// the real xdp_lb of each node it reaches (BPF_PROG_TEST_RUN), following XDP_TX
// from node to node by MAC; a node's sockets are its sock_model map. A packet of
// an open connection fails when a node that is not its holder passes it (its
// stack would reset it), when it is sent to a dead node, dropped, or loops, or
// when the holder's stack gets other bytes than the client sent (MACs aside).
// Two losses TCP recovers from by sending the packet again are counted, not
// failed: a packet sent while one edge had not applied a change yet, dropped or
// sent to a node it does not know is dead, and one of a replica called down
// wrongly that went to a dead one. The connection's next packets must arrive
// (the wrong verdicts clear before the last ones), and its last packet counts
// strictly.
//
// -pcc.seed=S -pcc.sequence=K replays one sequence; -pcc.sequences sets how many
// run; -pcc.all runs them all and counts the failing ones by class. With -v each
// sequence logs its counts. The test runs on one CPU (the flow cache and the
// memos are per CPU, so the outcome depends on the seed alone) and turns on
// expedited RCU while it runs (/sys/kernel/rcu_expedited): every ring swap waits
// for a grace period, 10 ms or more on a small VM, where a thousand sequences
// would take most of an hour.
func TestPCCModel(t *testing.T) {
	if !slices.Contains([]string{"learns", "never", "at-once"}, *pccSelfView) {
		t.Fatalf("-pcc.selfview=%q: want learns, never or at-once", *pccSelfView)
	}
	bpftest.Require(t)
	defer onOneCPU(t)()
	expediteRCU(t)
	start := time.Now()
	nodes := loadPCCNodes(t)
	t.Logf("loaded %d nodes in %v", len(nodes), time.Since(start).Round(time.Millisecond))

	seed := *pccSeed
	if seed == 0 {
		seed = rand.Uint64N(1<<53) + 1
	}
	first, last := 0, *pccSequences
	if *pccSequence >= 0 {
		first, last = *pccSequence, *pccSequence+1
	}
	t.Logf("seed %d, sequences %d to %d", seed, first, last-1)
	var total pccStats
	failed := map[string]int{}
	examples := map[string]string{}
	start = time.Now()
	for seq := first; seq < last; seq++ {
		w := newPCCWorld(t, nodes, seed, seq)
		fail := w.run()
		total.add(w.stats)
		if testing.Verbose() {
			t.Logf("sequence %d: %s", seq, w.summary())
		}
		if fail != nil {
			if !*pccAll {
				t.Fatalf("%s", w.report(fail))
			}
			failed[fail.class]++
			if _, ok := examples[fail.class]; !ok {
				examples[fail.class] = w.report(fail)
			}
			t.Logf("sequence %d FAILS: %s", seq, w.brief(fail))
		}
		for _, n := range w.nodes {
			if err := n.reset(); err != nil {
				t.Fatalf("seed %d, sequence %d: reset n%d: %v", seed, seq, n.id, err)
			}
		}
	}
	t.Logf("seed %d: %d sequences in %v: %s", seed, last-first, time.Since(start).Round(time.Millisecond), total)
	if len(failed) > 0 {
		var b strings.Builder
		fmt.Fprintf(&b, "seed %d: failing sequences by class (of %d):", seed, last-first)
		for _, class := range sortedKeys(failed) {
			fmt.Fprintf(&b, " %s %d;", class, failed[class])
		}
		for _, class := range sortedKeys(examples) {
			fmt.Fprintf(&b, "\n\nfirst %s:\n%s", class, examples[class])
		}
		t.Error(b.String())
	}
}

func sortedKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// expediteRCU turns expedited RCU grace periods on for the test, and back off
// when it ends: every ring swap (a map-in-map update) waits for a grace period.
func expediteRCU(t *testing.T) {
	const knob = "/sys/kernel/rcu_expedited"
	was, err := os.ReadFile(knob)
	if err != nil || strings.TrimSpace(string(was)) != "0" {
		return
	}
	if err := os.WriteFile(knob, []byte("1"), 0o644); err != nil {
		t.Logf("expedited RCU not available (%v): ring swaps will be slow", err)
		return
	}
	t.Cleanup(func() {
		if err := os.WriteFile(knob, was, 0o644); err != nil {
			t.Errorf("restore %s: %v", knob, err)
		}
	})
}

// pccNode is one simulated edge node: its own xdp_lb and maps. Node id i has MAC
// 02:00:00:00:0a:<i> and address 10.0.1.<i>.
type pccNode struct {
	id      int
	mac     net.HardwareAddr
	addr    netip.Addr
	d       *Dataplane
	reasons []uint64 // reason_stats as last read
}

// loadPCCNodes loads the most nodes a sequence uses, once for the whole test.
func loadPCCNodes(t *testing.T) []*pccNode {
	t.Helper()
	var nodes []*pccNode
	for id := 1; id <= pccMaxNodes; id++ {
		pin := testPinPath()
		d, err := Load(Options{PinPath: pin, RingSize: testRing, FlowEntries: 4096, Transition: time.Hour, sockModel: 1 << 16})
		if err != nil {
			t.Fatalf("load node %d: %v", id, err)
		}
		t.Cleanup(func() {
			d.Close()
			if err := Uninstall(pin); err != nil {
				t.Errorf("uninstall: %v", err)
			}
		})
		n := &pccNode{id: id, mac: mustMAC(fmt.Sprintf("02:00:00:00:0a:%02x", id)),
			addr: netip.AddrFrom4([4]byte{10, 0, 1, byte(id)}), d: d}
		if err := d.SetMAC(n.mac); err != nil {
			t.Fatal(err)
		}
		if err := n.checkFresh(); err != nil {
			t.Fatalf("node %d fresh from Load: %v", id, err)
		}
		nodes = append(nodes, n)
	}
	return nodes
}

// reset empties a node for the next sequence, as a fresh Load leaves it: no VIP,
// ring, transition, backend, peer, pin or socket, and no cached answer.
func (n *pccNode) reset() error {
	d := n.d
	if _, err := d.Apply(Desired{}); err != nil {
		return err
	}
	for vip := range d.st.prevUntil {
		if err := d.endTransition(vip); err != nil {
			return err
		}
	}
	if err := d.ClearFlows(); err != nil { // also retires every cached entry and memo
		return err
	}
	var k lbFlowKey
	for d.objs.SockModel.NextKey(nil, &k) == nil {
		if err := d.objs.SockModel.Delete(&k); err != nil {
			return fmt.Errorf("delete from sock_model: %w", err)
		}
	}
	if err := d.objs.PinClock.Put(uint32(0), uint64(0)); err != nil {
		return err
	}
	d.st.nextID = 1
	return n.checkFresh()
}

// checkFresh says what a node holds that a freshly loaded one does not.
func (n *pccNode) checkFresh() error {
	d := n.d
	for _, m := range []*ebpf.Map{d.objs.Vips, d.objs.Flows, d.objs.NewPins, d.objs.SockModel, d.objs.Peers} {
		k, err := m.NextKeyBytes(nil)
		if err != nil {
			return err
		}
		if k != nil {
			return fmt.Errorf("map %v not empty", m)
		}
	}
	for vip := range uint32(4) {
		for _, outer := range []*ebpf.Map{d.objs.Rings, d.objs.PrevRings} {
			var inner *ebpf.Map
			err := outer.Lookup(vip, &inner)
			if err == nil {
				inner.Close()
				return fmt.Errorf("%v holds a ring for vip id %d", outer, vip)
			}
			if !errors.Is(err, ebpf.ErrKeyNotExist) {
				return err
			}
		}
		var m lbRingMeta
		if err := d.objs.RingsMeta.Lookup(vip, &m); err != nil {
			return err
		}
		if m != (lbRingMeta{}) {
			return fmt.Errorf("vip id %d in a transition", vip)
		}
	}
	var clock uint64
	if err := d.objs.PinClock.Lookup(uint32(0), &clock); err != nil {
		return err
	}
	st, err := d.maps().read()
	if err != nil {
		return err
	}
	switch {
	case clock != 0:
		return fmt.Errorf("pin_clock %d", clock)
	case len(st.backends) > 0:
		return fmt.Errorf("%d backends", len(st.backends))
	case len(d.st.vipIDs)+len(d.st.vipKeys)+len(d.st.backends)+len(d.st.backendIDs)+len(d.st.rings)+
		len(d.st.prevUntil)+len(d.st.peers)+len(d.st.handing) > 0 || d.st.nextID != 1:
		return fmt.Errorf("applied state left: %+v", d.st)
	}
	n.reasons, err = n.countReasons()
	return err
}

// countReasons reads reason_stats, summed over CPUs.
func (n *pccNode) countReasons() ([]uint64, error) {
	cpus := ebpf.MustPossibleCPU()
	keys := make([]uint32, lbLbLimitsLB_MAX_REASONS)
	vals := make([]uint64, len(keys)*cpus)
	var cursor ebpf.MapBatchCursor
	got, err := n.d.objs.ReasonStats.BatchLookup(&cursor, keys, vals, nil)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil, err
	}
	out := make([]uint64, ReasonCount)
	for i := range got {
		if int(keys[i]) < ReasonCount {
			for c := range cpus {
				out[keys[i]] += vals[i*cpus+c]
			}
		}
	}
	return out, nil
}

// newReasons returns the reasons counted since the last call.
func (n *pccNode) newReasons() ([]Reason, error) {
	now, err := n.countReasons()
	if err != nil {
		return nil, err
	}
	var out []Reason
	for r := range now {
		if now[r] != n.reasons[r] {
			out = append(out, Reason(r))
		}
	}
	n.reasons = now
	return out, nil
}

type pccRole int

const (
	pccNone pccRole = iota
	pccReady
	pccDraining
)

// pccWorld is one sequence: the model's nodes and what it knows of them, the
// open connections, and the log of what happened.
type pccWorld struct {
	t     *testing.T
	rng   *rand.Rand
	seed  uint64
	seq   int
	nodes []*pccNode
	role  []pccRole // Kubernetes' view
	down  []bool    // the liveness checks' verdict
	self  []bool    // the verdict each node has learned about itself (-pcc.selfview)
	dead  []bool
	pool  []int // the directors
	ecmp  bool
	owner int    // VRRP: the VIP owner
	on    []bool // ECMP: announcing
	late  int    // a node that has not applied the last change yet, or -1
	// learner is the node whose verdict the last event changed (it learns it
	// late, -pcc.selfview=learns), restart the node whose agent it restarted;
	// -1 for none.
	learner, restart int
	roll             int // the node whose pod the last event replaced, or -1
	event            int
	flows            []*pccFlow // open connections
	seen             map[lbFlowKey]bool
	// ended are connections that ended (their holder's socket in TIME_WAIT):
	// a client reuses such a 5-tuple for a new connection now and then.
	ended []*pccFlow
	log   []string
	rings []pccRingAt
	stats pccStats
}

// pccRingAt is the current ring from an event on: the node of each slot.
type pccRingAt struct {
	event int
	slots []int
}

// pccFlow is one client connection.
type pccFlow struct {
	id      int
	pkt     xdptest.Packet
	key     lbFlowKey
	hash    uint32 // the router's ECMP hash
	holder  int
	via     int      // the director its SYN went to
	after   int      // the event it was opened after (0: before the first)
	closing bool     // its next packet is the client's FIN
	reuses  *pccFlow // the ended connection whose 5-tuple it reuses, if any
	late    int      // the node that lagged then, or -1
	sent    int
	history []string
}

type pccStats struct {
	events, skewed, restarts, rolls, flows, ended, reused, inTransition, packets, handoffs, synLost, synRefused, downLost, lagLost, stalePinLost int
	twice                                                                                                                                        int // packets one edge sent on twice
}

func (s *pccStats) add(o pccStats) {
	s.events += o.events
	s.skewed += o.skewed
	s.restarts += o.restarts
	s.flows += o.flows
	s.inTransition += o.inTransition
	s.packets += o.packets
	s.handoffs += o.handoffs
	s.rolls += o.rolls
	s.ended += o.ended
	s.stalePinLost += o.stalePinLost
	s.twice += o.twice
	s.reused += o.reused
	s.synLost += o.synLost
	s.synRefused += o.synRefused
	s.downLost += o.downLost
	s.lagLost += o.lagLost
}

func (s pccStats) String() string {
	return fmt.Sprintf("%d events (%d skewed, %d agent restarts, %d pods replaced), %d connections opened (%d in a transition; %d ended, %d reused a 5-tuple), %d packets checked (%d sent on twice by one edge: none may be), %d hand-offs, SYNs lost %d, refused %d; packets lost (sent again by TCP) while an edge lagged %d, of a replica called down wrongly %d, by a stale pin to a dead node %d",
		s.events, s.skewed, s.restarts, s.rolls, s.flows, s.inTransition, s.ended, s.reused, s.packets, s.twice, s.handoffs, s.synLost, s.synRefused, s.lagLost, s.downLost, s.stalePinLost)
}

// pccFailure is a packet that broke its connection.
type pccFailure struct {
	class string
	flow  *pccFlow
	what  string
	trip  pccTrip
	late  int // the node that had not applied the last change, or -1
}

func newPCCWorld(t *testing.T, all []*pccNode, seed uint64, seq int) *pccWorld {
	rng := rand.New(rand.NewPCG(seed, uint64(seq)))
	n := 3 + rng.IntN(pccMaxNodes-2)
	w := &pccWorld{t: t, rng: rng, seed: seed, seq: seq, nodes: all[:n], role: make([]pccRole, n),
		down: make([]bool, n), self: make([]bool, n), dead: make([]bool, n), on: make([]bool, n), late: -1, learner: -1, restart: -1, roll: -1, seen: map[lbFlowKey]bool{}}
	for _, i := range rng.Perm(n)[:2+rng.IntN(n-1)] {
		w.role[i] = pccReady
	}
	// Directors are edges with a replica (an agent whose replica is removed
	// stops announcing: see removed below).
	var reps []int
	for i := range n {
		if w.role[i] == pccReady {
			reps = append(reps, i)
		}
	}
	rng.Shuffle(len(reps), func(a, b int) { reps[a], reps[b] = reps[b], reps[a] })
	w.pool = slices.Sorted(slices.Values(reps[:min(len(reps), 2+rng.IntN(min(5, n)-1))]))
	w.ecmp = rng.IntN(2) == 0
	w.owner = w.pool[rng.IntN(len(w.pool))]
	for _, i := range w.pool {
		w.on[i] = true
	}
	return w
}

func (w *pccWorld) name(i int) string { return fmt.Sprintf("n%d", w.nodes[i].id) }

// run plays the sequence and returns its first failure, if any.
func (w *pccWorld) run() *pccFailure {
	w.applyAll(-1)
	w.recordRing(-1)
	w.log = append(w.log, "start: "+w.state())
	if f := w.traffic(); f != nil {
		return f
	}
	events := 3 + w.rng.IntN(12)
	for w.event = 1; w.event <= events; w.event++ {
		w.stats.events++
		w.learner, w.restart, w.roll = -1, -1, -1
		what, changes := w.randomEvent()
		line := fmt.Sprintf("e%d: %s", w.event, what)
		if w.restart >= 0 {
			w.log = append(w.log, line+" ["+w.state()+"]")
			if f := w.restartAgent(w.restart); f != nil {
				return f
			}
		} else if w.roll >= 0 {
			w.log = append(w.log, line+" ["+w.state()+"]")
			if f := w.rollPod(w.roll); f != nil {
				return f
			}
		} else if !changes {
			w.log = append(w.log, line+" ["+w.state()+"]")
		} else {
			late := -1
			if w.learner >= 0 && *pccSelfView == "learns" {
				// The others decided; it learns their verdict from
				// their next answers to its probes, a moment later.
				late = w.learner
				line += fmt.Sprintf(", %s learns it late", w.name(late))
				w.stats.skewed++
			} else if w.rng.IntN(4) == 0 {
				late = w.randomLive()
				line += fmt.Sprintf(", %s applies it late", w.name(late))
				w.stats.skewed++
			}
			w.log = append(w.log, line+" ["+w.state()+"]")
			w.applyAll(late)
			w.recordRing(late)
			if late >= 0 {
				w.late = late
				f := w.traffic()
				w.late = -1
				if f != nil {
					return f
				}
				if late == w.learner {
					w.self[late] = w.down[late]
				}
				w.apply(late)
				w.log = append(w.log, fmt.Sprintf("e%d: %s has applied it", w.event, w.name(late)))
			}
		}
		if f := w.traffic(); f != nil {
			return f
		}
	}
	// The wrong verdicts clear; then every connection still open must answer.
	cleared := false
	for i := range w.nodes {
		if w.down[i] && !w.dead[i] {
			w.down[i], w.self[i], cleared = false, false, true
		}
	}
	if cleared {
		w.applyAll(-1)
		w.recordRing(-1)
		w.log = append(w.log, "end: the wrong verdicts clear ["+w.state()+"]")
	}
	w.event = events + 1
	for _, f := range slices.Clone(w.flows) {
		if fail := w.check(f, "last packet"); fail != nil {
			return fail
		}
	}
	return nil
}

// traffic opens a few connections and sends a packet of about a third of the
// open ones.
func (w *pccWorld) traffic() *pccFailure {
	for range 1 + w.rng.IntN(3) {
		if f := w.open(); f != nil {
			return f
		}
	}
	// Now and then a connection ends: its holder closed it first, so its
	// socket waits in TIME_WAIT, and the client may reuse its port.
	if len(w.flows) > 0 && w.rng.IntN(4) == 0 {
		i := w.rng.IntN(len(w.flows))
		f := w.flows[i]
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
	for _, f := range slices.Clone(w.flows) {
		if w.rng.IntN(3) == 0 {
			if fail := w.check(f, fmt.Sprintf("data after e%d", w.event)); fail != nil {
				return fail
			}
		}
	}
	return nil
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
	most := trip.mostForwards()
	if most > 1 {
		w.stats.twice++
	}
	switch {
	case most > 1:
		// Along the walk an edge sends a packet on once; the director's tag
		// keeps the walk from coming back to it (bpf/README.md).
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
		if w.down[f.holder] && !w.dead[f.holder] {
			break
		}
		again := w.send(f, flags, payload)
		f.history = append(f.history, fmt.Sprintf("%s, sent again: %s", what, again))
		if again.end != pccPassed || again.at != f.holder {
			return w.failure("hang", f, what+", sent again", again)
		}
	case trip.end == pccLost && w.down[f.holder] && !w.dead[f.holder]:
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
// bits).
func pccIntact(got, sent []byte) bool {
	if len(got) != len(sent) || len(got) < 14+40 {
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
// did (XDP_TX), director included.
func (tr pccTrip) mostForwards() int {
	sent := map[int]int{}
	most := 0
	for _, h := range tr.hops {
		if h.verdict == xdptest.TX {
			sent[h.node]++
			most = max(most, sent[h.node])
		}
	}
	return most
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
		b.Down = w.down[j]
		if j == i && !w.dead[j] && *pccSelfView != "at-once" {
			b.Down = w.self[j]
		}
		if j == i {
			b.Local = true
		} else {
			b.MAC = n.mac
		}
		bs = append(bs, b)
	}
	return Desired{Seed: testSeed, Groups: []Group{{Name: "edge/pcc", VIPs: []netip.Addr{vip4, vip6}, Backends: bs}}}
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
		if r.slots[slot] == last {
			continue
		}
		last = r.slots[slot]
		when := fmt.Sprintf("from e%d", r.event)
		if r.event == 0 {
			when = "at the start (the previous ring throughout)"
		}
		out = append(out, fmt.Sprintf("%s %s", when, w.name(last)))
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

// serving counts the replicas that take new connections, but for node skip.
func (w *pccWorld) serving(skip int) int {
	c := 0
	for i := range w.nodes {
		if i != skip && w.role[i] == pccReady && !w.dead[i] && !w.down[i] {
			c++
		}
	}
	return c
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

// pccChange is a kind of event: which nodes it may happen to, and what it does.
type pccChange struct {
	weight int
	can    func(i int) bool
	do     func(i int) string
	rings  bool // it changes what the nodes apply
}

// randomEvent picks a change that may happen and a node it happens to, and
// makes it happen in the model. It says what happened, and whether the nodes
// have something to apply.
func (w *pccWorld) randomEvent() (string, bool) {
	alive := func(i int) bool { return !w.dead[i] }
	changes := []pccChange{
		{3, func(i int) bool { return alive(i) && w.role[i] == pccNone }, func(i int) string {
			w.role[i], w.down[i], w.self[i] = pccReady, false, false
			return w.name(i) + " added"
		}, true},
		{2, func(i int) bool { return w.role[i] != pccNone && w.serving(i) > 0 && w.otherDirector(i) }, func(i int) string {
			w.role[i] = pccNone
			if alive(i) {
				w.down[i], w.self[i] = false, false
			}
			w.on[i] = false // its agent stops announcing
			return w.name(i) + " removed" + w.close(i) + w.keepDirectors()
		}, true},
		{2, func(i int) bool { return alive(i) && w.role[i] == pccReady && w.serving(i) > 0 }, func(i int) string {
			w.role[i] = pccDraining
			return w.name(i) + " drain starts"
		}, true},
		{2, func(i int) bool { return alive(i) && w.role[i] == pccDraining }, func(i int) string {
			w.role[i] = pccReady
			return w.name(i) + " drain ends"
		}, true},
		{2, func(i int) bool {
			nodes, directors := w.live(i)
			return alive(i) && nodes >= 2 && directors >= 1 && w.serving(i) > 0 && w.otherDirector(i)
		}, func(i int) string {
			w.dead[i], w.down[i], w.on[i] = true, true, false
			return w.name(i) + " dies (liveness: down)" + w.close(i) + w.keepDirectors()
		}, true},
		{2, func(i int) bool { return alive(i) && w.role[i] == pccReady && !w.down[i] && w.serving(i) > 0 }, func(i int) string {
			w.down[i], w.learner = true, i
			return w.name(i) + " falsely down (liveness: down, it runs on)"
		}, true},
		{2, func(i int) bool { return alive(i) && w.down[i] }, func(i int) string {
			w.down[i], w.learner = false, i
			return w.name(i) + " up again (liveness)"
		}, true},
		{2, func(i int) bool {
			return alive(i) && w.role[i] == pccReady && !w.down[i] && w.serving(i) > 0 && !w.directing(i)
		}, func(i int) string {
			w.restart = i
			return w.name(i) + " restarts (agent and nginx: its connections close, the others call it down, then up)" + w.close(i)
		}, true},
		{2, func(i int) bool {
			return alive(i) && w.role[i] == pccReady && !w.down[i] && w.serving(i) > 0 && !w.directing(i)
		}, func(i int) string {
			w.roll = i
			return w.name(i) + "'s pod is replaced (a rolling update: it drains, its agent and nginx stop, it is removed, a new agent starts, it is ready again)"
		}, true},
		{3, func(i int) bool { return alive(i) && slices.Contains(w.pool, i) && w.switchable(i) }, func(i int) string {
			return w.switchDirector(i)
		}, false},
	}
	total := 0
	var can [][]int
	for _, c := range changes {
		var nodes []int
		for i := range w.nodes {
			if c.can(i) {
				nodes = append(nodes, i)
			}
		}
		can = append(can, nodes)
		if len(nodes) > 0 {
			total += c.weight
		}
	}
	if total == 0 {
		return "nothing can happen", false
	}
	pick := w.rng.IntN(total)
	for k, c := range changes {
		if len(can[k]) == 0 {
			continue
		}
		if pick -= c.weight; pick < 0 {
			return c.do(can[k][w.rng.IntN(len(can[k]))]), c.rings
		}
	}
	panic("no change picked")
}

// directing: node i receives the VIP's traffic from the router now.
func (w *pccWorld) directing(i int) bool {
	if w.ecmp {
		return w.on[i]
	}
	return w.owner == i
}

// restartAgent plays node i's restart: its maps stand still while the others
// call it down and up again. Its new agent either starts while they still call
// it down (and learns that from their answers) or after (and then replays the
// down it missed: the agent's restart cycle).
func (w *pccWorld) restartAgent(i int) *pccFailure {
	learns := *pccSelfView != "never"
	w.stats.restarts++
	w.down[i] = true
	w.applyAll(i)
	w.recordRing(i)
	w.late = i
	if f := w.traffic(); f != nil {
		return f
	}
	if w.rng.IntN(2) == 0 {
		w.late = -1
		w.self[i] = learns
		w.newAgent(i, learns) // Options.Rejoin: its own replica is Down already
		w.apply(i)
		w.log = append(w.log, fmt.Sprintf("e%d: %s's new agent starts and learns the others call it down", w.event, w.name(i)))
		if f := w.traffic(); f != nil {
			return f
		}
		w.down[i] = false
		w.applyAll(i)
		w.recordRing(i)
		w.log = append(w.log, fmt.Sprintf("e%d: the others call %s up again, it learns that late ["+w.state()+"]", w.event, w.name(i)))
		w.late = i
		if f := w.traffic(); f != nil {
			return f
		}
		w.self[i] = false
		w.apply(i)
	} else {
		w.down[i] = false
		w.applyAll(i)
		w.recordRing(i)
		w.log = append(w.log, fmt.Sprintf("e%d: the others call %s up again ["+w.state()+"]", w.event, w.name(i)))
		if f := w.traffic(); f != nil {
			return f
		}
		w.newAgent(i, learns) // Options.Rejoin: the first Apply replays its down
		w.apply(i)
		w.log = append(w.log, fmt.Sprintf("e%d: %s's new agent starts (Options.Rejoin: it replays its down)", w.event, w.name(i)))
	}
	w.late = -1
	return nil
}

// newAgent plays node i's new agent process: what it knows of the maps is what
// their pins say (Load's recover), nothing of its predecessor's memory.
func (w *pccWorld) newAgent(i int, rejoin bool) {
	d := w.nodes[i].d
	if err := d.recover(); err != nil {
		w.t.Fatalf("%s: recover from the pins: %v", w.name(i), err)
	}
	d.rejoining = rejoin
}

// rollPod plays a rolling update of node i's pod, as Kubernetes does it: the
// old pod is terminating (its replica drains, every edge applies that), then
// its agent and nginx stop (its connections close, its maps stand still, the
// others call it down), the pod is deleted (every other edge removes the
// replica), a new agent starts from the pins before its pod is ready (its own
// replica is not in the group yet), and the new pod turns ready.
func (w *pccWorld) rollPod(i int) *pccFailure {
	w.stats.rolls++
	step := func(what string, except int) *pccFailure {
		w.applyAll(except)
		w.recordRing(except)
		w.log = append(w.log, fmt.Sprintf("e%d: %s [%s]", w.event, what, w.state()))
		w.late = except
		f := w.traffic()
		w.late = -1
		return f
	}
	w.role[i] = pccDraining
	if f := step(w.name(i)+" drains (terminating)", -1); f != nil {
		return f
	}
	w.down[i] = true
	if f := step(w.name(i)+"'s agent and nginx stop"+w.close(i)+"; the others call it down", i); f != nil {
		return f
	}
	w.role[i], w.down[i], w.self[i] = pccNone, false, false
	if f := step(w.name(i)+"'s pod is deleted: removed", i); f != nil {
		return f
	}
	w.newAgent(i, *pccSelfView != "never")
	w.apply(i)
	w.log = append(w.log, fmt.Sprintf("e%d: %s's new agent starts, its replica not ready yet", w.event, w.name(i)))
	if f := w.traffic(); f != nil {
		return f
	}
	w.role[i] = pccReady
	return step(w.name(i)+" is ready again", -1)
}

// canDirect: node i may receive the VIP's traffic (a live edge with a replica).
func (w *pccWorld) canDirect(i int) bool { return !w.dead[i] && w.role[i] != pccNone }

// otherDirector: a director other than node i can take the VIP's traffic.
func (w *pccWorld) otherDirector(i int) bool {
	return slices.ContainsFunc(w.pool, func(j int) bool { return j != i && w.canDirect(j) })
}

// switchable: VRRP, node i may become the owner; ECMP, it may join or leave.
func (w *pccWorld) switchable(i int) bool {
	if !w.canDirect(i) {
		return false
	}
	if !w.ecmp {
		return i != w.owner
	}
	if !w.on[i] {
		return true
	}
	for _, j := range w.pool {
		if j != i && w.on[j] && w.canDirect(j) {
			return true
		}
	}
	return false
}

func (w *pccWorld) switchDirector(i int) string {
	if !w.ecmp {
		was := w.owner
		w.owner = i
		return fmt.Sprintf("VRRP owner %s -> %s", w.name(was), w.name(i))
	}
	w.on[i] = !w.on[i]
	if w.on[i] {
		return w.name(i) + " joins the ECMP set"
	}
	return w.name(i) + " leaves the ECMP set"
}

// keepDirectors moves the VIP off a dead owner, or has a director announce
// when none does.
func (w *pccWorld) keepDirectors() string {
	var live []int
	for _, i := range w.pool {
		if w.canDirect(i) {
			live = append(live, i)
		}
	}
	if !w.ecmp && !w.canDirect(w.owner) {
		w.owner = live[w.rng.IntN(len(live))]
		return ", VRRP owner now " + w.name(w.owner)
	}
	if w.ecmp && !slices.ContainsFunc(live, func(i int) bool { return w.on[i] }) {
		i := live[w.rng.IntN(len(live))]
		w.on[i] = true
		return ", " + w.name(i) + " joins the ECMP set"
	}
	return ""
}

// close ends the connections node i holds: its sockets are gone.
func (w *pccWorld) close(i int) string {
	n := 0
	w.flows = slices.DeleteFunc(w.flows, func(f *pccFlow) bool {
		if f.holder != i {
			return false
		}
		if err := w.nodes[i].d.objs.SockModel.Delete(&f.key); err != nil {
			w.t.Fatalf("delete socket: %v", err)
		}
		n++
		return true
	})
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(", %d connections closed", n)
}

// state describes the model: replicas, verdicts, directors.
func (w *pccWorld) state() string {
	var reps, others []string
	for i := range w.nodes {
		s := w.name(i)
		switch {
		case w.dead[i]:
			s += "(dead)"
		case w.down[i]:
			s += "(down)"
		}
		switch w.role[i] {
		case pccReady:
			reps = append(reps, s)
		case pccDraining:
			reps = append(reps, s+"(draining)")
		default:
			others = append(others, s)
		}
	}
	s := "replicas " + strings.Join(reps, " ")
	if len(others) > 0 {
		s += "; others " + strings.Join(others, " ")
	}
	if !w.ecmp {
		return s + "; VRRP owner " + w.name(w.owner)
	}
	var on []string
	for _, i := range w.pool {
		if w.on[i] && !w.dead[i] {
			on = append(on, w.name(i))
		}
	}
	return s + "; ECMP over " + strings.Join(on, " ")
}

func (w *pccWorld) mode() string {
	var pool []string
	for _, i := range w.pool {
		pool = append(pool, w.name(i))
	}
	m := "VRRP"
	if w.ecmp {
		m = "ECMP"
	}
	return fmt.Sprintf("%s, %d nodes, directors %s", m, len(w.nodes), strings.Join(pool, " "))
}

func (w *pccWorld) summary() string {
	return fmt.Sprintf("%s: %s", w.mode(), w.stats)
}

func (f *pccFlow) String() string {
	return fmt.Sprintf("f%d %s:%d -> %s:%d", f.id, f.pkt.Src, f.pkt.SPort, f.pkt.Dst, f.pkt.DPort)
}

// opened says when a connection was opened, relative to the events.
func (w *pccWorld) opened(f *pccFlow) string {
	s := fmt.Sprintf("after e%d", f.after)
	if f.after == 0 {
		s = "before the first event"
	}
	s += ", SYN via " + w.name(f.via)
	if f.late >= 0 {
		s += fmt.Sprintf(" (while %s had not applied e%d)", w.name(f.late), f.after)
	}
	return s
}

// brief is a failure in one line.
func (w *pccWorld) brief(f *pccFailure) string {
	v := "v4"
	if f.flow.pkt.Src.Is6() {
		v = "v6"
	}
	skew := ""
	if f.late >= 0 {
		skew = fmt.Sprintf(" while %s lags", w.name(f.late))
	}
	return fmt.Sprintf("%s (%s, %s): %s of %s held by %s, opened %s%s: %s", f.class, w.mode(), v, f.what, f.flow, w.holderName(f.flow), w.opened(f.flow), skew, f.trip)
}

func (w *pccWorld) holderName(f *pccFlow) string {
	if f.holder < 0 {
		return "nobody"
	}
	return w.name(f.holder)
}

// report describes a failure: the world, the connection and its packets, and
// the events up to the failure.
func (w *pccWorld) report(f *pccFailure) string {
	var b strings.Builder
	selfview := ""
	if *pccSelfView != "learns" {
		selfview = " -pcc.selfview=" + *pccSelfView
	}
	fmt.Fprintf(&b, "seed %d, sequence %d (replay: go test -count=1 -run TestPCCModel ./dataplane/ -v -args -pcc.seed=%d -pcc.sequence=%d%s)\n",
		w.seed, w.seq, w.seed, w.seq, selfview)
	fmt.Fprintf(&b, "world: %s\n", w.mode())
	fmt.Fprintf(&b, "%s: %s of connection %s, held by %s, opened %s\n", f.class, f.what, f.flow, w.holderName(f.flow), w.opened(f.flow))
	if f.late >= 0 {
		fmt.Fprintf(&b, "sent while %s had not applied e%d\n", w.name(f.late), w.event)
	}
	fmt.Fprintf(&b, "hops: %s\n", f.trip)
	if f.trip.end == pccPassed && !f.trip.intact {
		fmt.Fprintf(&b, "frame passed (from byte 12): % x\nclient's frame (from byte 12): % x\n", f.trip.frame[12:], f.trip.in[12:])
	}
	fmt.Fprintf(&b, "its ring slot: %s\n", w.ringHistory(f.flow))
	fmt.Fprintf(&b, "what the live nodes hold for it now:\n%s", w.views(f.flow))
	fmt.Fprintf(&b, "its packets:\n")
	for _, h := range f.flow.history {
		fmt.Fprintf(&b, "  %s\n", h)
	}
	fmt.Fprintf(&b, "events:\n")
	for _, l := range w.log {
		fmt.Fprintf(&b, "  %s\n", l)
	}
	return b.String()
}
