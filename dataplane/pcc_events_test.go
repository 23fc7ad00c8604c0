package dataplane

import (
	"fmt"
	"slices"
)

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
			w.unskew(i) // every edge's probes fail now
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
	if *pccSkew {
		changes = append(changes,
			pccChange{2, func(i int) bool { return alive(i) && w.skewable(i) >= 0 }, func(i int) string {
				j := w.skewable(i)
				w.stats.skews++
				if w.down[j] {
					w.skew[[2]int{i, j}] = -1
					return w.name(i) + " alone still calls " + w.name(j) + " up (its probes pass, the others' failed)"
				}
				w.skew[[2]int{i, j}] = 1
				return w.name(i) + " alone calls " + w.name(j) + " down (its probes failed, the others' passed)"
			}, true},
			pccChange{2, func(i int) bool { return w.skewed(i) >= 0 }, func(i int) string {
				j := w.skewed(i)
				delete(w.skew, [2]int{i, j})
				return w.name(i) + "'s verdict on " + w.name(j) + " agrees with the others' again"
			}, true})
	}
	if *pccExpire {
		changes = append(changes, pccChange{2, func(i int) bool { return alive(i) && w.inTransition() }, func(int) string {
			return w.endTransitions()
		}, false})
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

// skewable is a live replica whose verdict node i may come to see alone
// (-pcc.skew), one it does not already; -1 for none. The pick is random.
func (w *pccWorld) skewable(i int) int {
	var can []int
	for j := range w.nodes {
		if j != i && !w.dead[j] && w.role[j] != pccNone && w.skew[[2]int{i, j}] == 0 {
			can = append(can, j)
		}
	}
	if len(can) == 0 {
		return -1
	}
	return can[w.rng.IntN(len(can))]
}

// skewed is a replica node i sees a verdict on alone, -1 for none.
func (w *pccWorld) skewed(i int) int {
	for j := range w.nodes {
		if w.skew[[2]int{i, j}] != 0 {
			return j
		}
	}
	return -1
}

// unskew: every edge's verdict on replica j agrees (it died: every probe
// fails).
func (w *pccWorld) unskew(j int) {
	for k := range w.skew {
		if k[1] == j {
			delete(w.skew, k)
		}
	}
}

// freshChecks: node i's agent restarts, and its new liveness checks start
// with every replica live (liveness.Checker.SetTargets): what it alone called
// down it calls up now, and what it alone still called up it calls as the
// others do. Its nginx stops too, which every edge's probes see.
func (w *pccWorld) freshChecks(i int) {
	for k := range w.skew {
		if k[0] == i {
			delete(w.skew, k)
		}
	}
	w.unskew(i) // and its nginx stops: every edge's probes of it fail
}

// endTransitions plays minutes without a change (-pcc.expire): every live
// node's transition leases pass, and Expire ends them.
func (w *pccWorld) endTransitions() string {
	for i, n := range w.nodes {
		if w.dead[i] {
			continue
		}
		for vip := range n.d.st.prevUntil {
			n.d.st.prevUntil[vip] = 1 // its lease has passed
		}
		if err := n.d.Expire(); err != nil {
			w.t.Fatalf("expire the transitions on %s: %v", w.name(i), err)
		}
	}
	return "every transition ends (minutes pass without a change)"
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
	w.freshChecks(i)
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
	w.freshChecks(i)
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
		if f.udp { // its nginx session ends
			n++
			return true
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
