package dataplane

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/portico-edge/portico/dataplane/xdptest"
)

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
	// skew is where one edge's verdict on a live replica differs from the
	// others' (-pcc.skew): +1 it alone calls the replica down (its probes
	// failed, theirs did not: a stalled host, a lossy link), -1 it alone
	// still calls it up while they call it down. Per-edge verdicts differ
	// so for as long as their probes' answers do, longer than LB_SETTLE_MS.
	skew map[[2]int]int
	// reported is what each holder reported off the ring at the last
	// syncHeld (-pcc.held): what it stops reporting is unpinned.
	reported map[int][]Held
	pool     []int // the directors
	ecmp     bool
	owner    int    // VRRP: the VIP owner
	on       []bool // ECMP: announcing
	late     int    // a node that has not applied the last change yet, or -1
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
	id       int
	pkt      xdptest.Packet
	key      lbFlowKey
	hash     uint32 // the router's ECMP hash
	holder   int
	via      int      // the director its SYN went to
	after    int      // the event it was opened after (0: before the first)
	closing  bool     // its next packet is the client's FIN
	udp      bool     // a UDP flow (-pcc.udp): its holder is where its first datagram went
	reported bool     // a UDP flow its holder has reported (syncHeld) since its first datagram
	reuses   *pccFlow // the ended connection whose 5-tuple it reuses, if any
	late     int      // the node that lagged then, or -1
	sent     int
	history  []string
}

type pccStats struct {
	events, skewed, restarts, rolls, flows, ended, reused, inTransition, packets, handoffs, synLost, synRefused, downLost, lagLost, stalePinLost int
	twice                                                                                                                                        int // packets one edge sent on twice
	twiceSkew                                                                                                                                    int // the same while verdicts differed (once per class)
	skews, rescues                                                                                                                               int // verdicts one edge saw alone (-pcc.skew); packets a chain's end handed on once more (REASON_HANDOFF_RESCUE)
	udpFlows                                                                                                                                     int // UDP flows opened (-pcc.udp)
	udpLagMoved, udpDownMoved                                                                                                                    int // UDP flows moved: while an edge lagged; before their report, from a replica called down wrongly (bpf/README.md)
	pinWalks                                                                                                                                     int // packets the replica a director's pin named sent on twice (bpf/README.md)
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
	s.twiceSkew += o.twiceSkew
	s.skews += o.skews
	s.rescues += o.rescues
	s.udpFlows += o.udpFlows
	s.udpLagMoved += o.udpLagMoved
	s.udpDownMoved += o.udpDownMoved
	s.pinWalks += o.pinWalks
	s.reused += o.reused
	s.synLost += o.synLost
	s.synRefused += o.synRefused
	s.downLost += o.downLost
	s.lagLost += o.lagLost
}

func (s pccStats) String() string {
	return fmt.Sprintf("%d events (%d skewed, %d agent restarts, %d pods replaced), %d connections opened (%d in a transition; %d ended, %d reused a 5-tuple), %d UDP flows (moved: %d while an edge lagged, %d before their report from a replica called down wrongly), %d packets checked (%d sent on twice by one edge: none may be, but for %d by the replica a director's stale pin named, which walked them from the chain's start, and %d while verdicts differed, once in each class of the walk), %d hand-offs (%d rescues at a chain's end, %d verdicts one edge saw alone), SYNs lost %d, refused %d; packets lost (sent again by TCP) while an edge lagged %d, of a replica called down wrongly %d, by a stale pin to a dead node %d",
		s.events, s.skewed, s.restarts, s.rolls, s.flows, s.inTransition, s.ended, s.reused, s.udpFlows, s.udpLagMoved, s.udpDownMoved, s.packets, s.twice, s.pinWalks, s.twiceSkew, s.handoffs, s.rescues, s.skews, s.synLost, s.synRefused, s.lagLost, s.downLost, s.stalePinLost)
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
		down: make([]bool, n), self: make([]bool, n), dead: make([]bool, n), on: make([]bool, n), late: -1, learner: -1, restart: -1, roll: -1, seen: map[lbFlowKey]bool{}, skew: map[[2]int]int{}}
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
		if *pccHeld {
			w.syncHeld()
		}
	}
	// The wrong verdicts clear; then every connection still open must answer.
	cleared := len(w.skew) > 0
	clear(w.skew)
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

// verdictsDiffer: some live edge's verdict on a live replica differs from the
// others' (-pcc.skew).
func (w *pccWorld) verdictsDiffer() bool {
	for k, v := range w.skew {
		if v != 0 && !w.dead[k[0]] && !w.dead[k[1]] {
			return true
		}
	}
	return false
}

// syncHeld plays the holders' reports (-pcc.held): every live edge lists the
// connections its stack holds off the current ring, every live edge pins
// them to it, and unpins what a live holder reported last time and no longer
// does (a dead holder's last report stands).
func (w *pccWorld) syncHeld() {
	if w.reported == nil {
		w.reported = map[int][]Held{}
	}
	var held, gone []Held
	for i, n := range w.nodes {
		if w.dead[i] {
			held = append(held, w.reported[i]...)
			continue
		}
		var mine []Flow
		for _, f := range w.flows {
			if f.holder == i && !f.udp {
				mine = append(mine, flowFromKey(f.key))
			}
		}
		// While the edges' verdicts differ, their rings do, and what is on
		// this node's ring may be off another's: a holder whose peers'
		// verdicts differ from its own (liveness.Checker.Differ) lists
		// every connection it has.
		off := n.d.OffRing(n.addr, mine, w.verdictsDiffer())
		// UDP: every flow its xdp_lb saw its stack serve (udp_seen), on
		// the ring or off it, as the agent lists them (Dataplane.OwnUDP).
		udp, err := n.d.OwnUDP(0, 1<<62)
		if err != nil {
			w.t.Fatalf("list the UDP flows of %s: %v", w.name(i), err)
		}
		off = append(off, udp...)
		for _, f := range w.flows {
			f.reported = f.reported || f.udp && f.holder == i
		}
		var now []Held
		for _, f := range off {
			now = append(now, Held{Flow: f, Holder: n.addr})
		}
		for _, h := range w.reported[i] {
			if !slices.Contains(now, h) {
				gone = append(gone, h)
			}
		}
		w.reported[i] = now
		held = append(held, now...)
	}
	for i, n := range w.nodes {
		if w.dead[i] {
			continue
		}
		if _, err := n.d.UnpinHeld(gone); err != nil {
			w.t.Fatalf("unpin connections no longer held on %s: %v", w.name(i), err)
		}
		if _, err := n.d.PinHeld(held); err != nil {
			w.t.Fatalf("pin held connections on %s: %v", w.name(i), err)
		}
	}
}
