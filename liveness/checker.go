package liveness

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Config says what to probe and how.
type Config struct {
	// Port is the liveness port of every replica's nginx (it answers Path).
	Port uint16
	// Iface is the edge interface: probes of remote replicas leave through it.
	Iface string
	Timing
	// Tick is how often verdicts are re-evaluated (default 10 ms).
	Tick time.Duration
	// Stall is how long the evaluation loop may go silent before every
	// verdict falls back to Kubernetes' view (default 1 s).
	Stall      time.Duration
	Logger     *zap.Logger
	Registerer prometheus.Registerer
	// Now is the clock (tests); time.Now by default.
	Now func() time.Time

	dial func(iface string, local bool) func(ctx context.Context, network, addr string) (net.Conn, error) // tests
}

// Checker probes every replica of the node's group and keeps a damped
// live/dead verdict on each. It never decides membership: replicas come from
// Kubernetes through SetTargets, and a replica it knows nothing of, or whose
// checks it could not run, is live.
type Checker struct {
	cfg Config
	log *zap.Logger
	met *metrics

	mu      sync.Mutex
	targets map[netip.Addr]*targetState
	run     context.Context // set by Run; probers start under it
	wake    chan struct{}   // a verdict changed or the checker failed/recovered

	beat    atomic.Int64 // unix nanoseconds of the last evaluation
	stalled atomic.Bool  // the last Verdicts saw a stalled loop
	// stale is the beat a reader last found older than Stall, and when it
	// first did (unix nanoseconds): see healthy.
	staleMu          sync.Mutex
	staleBeat, since int64

	// called is this node's own replicas that most other edges call down,
	// sorted: what it learned from their answers (see calledLocked).
	called []netip.Addr
}

type targetState struct {
	rep    *replica
	local  bool
	fault  error // the checker could not probe it: Kubernetes' view holds
	cancel context.CancelFunc
	// report is which replicas its node calls down, from its last good
	// answer (a remote replica's; nil for none).
	report []netip.Addr
	// held: a probe waits on a replica that ended its connection itself and
	// accepted a new one (prober.probe); its silence does not count meanwhile.
	held bool
}

// Replica is one replica as the checker sees it, for status and logs.
type Replica struct {
	Addr  netip.Addr
	Live  bool
	Since time.Time
	// Fallback is set when the checker could not probe it (or as a whole has
	// stalled): it counts as live because Kubernetes says so.
	Fallback string
	// CalledDown: this node's own replica, which most other edges call down
	// (Dead lists it, though its own checks find it serving).
	CalledDown bool
}

// New checks the configuration; Run starts the probes.
func New(cfg Config) (*Checker, error) {
	if cfg.Timing == (Timing{}) {
		cfg.Timing = DefaultTiming
	}
	if cfg.Port == 0 {
		return nil, fmt.Errorf("liveness: no port")
	}
	if cfg.Interval <= 0 || cfg.DeadAfter <= 0 || cfg.Rise < 1 {
		return nil, fmt.Errorf("liveness: interval, dead-after and rise must be positive (got %v, %v, %d)", cfg.Interval, cfg.DeadAfter, cfg.Rise)
	}
	if cfg.Tick <= 0 {
		cfg.Tick = 10 * time.Millisecond
	}
	if cfg.Stall <= 0 {
		cfg.Stall = time.Second
	}
	if cfg.dial == nil {
		cfg.dial = dialer
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	met, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	c := &Checker{cfg: cfg, log: cfg.Logger, met: met, targets: map[netip.Addr]*targetState{}, wake: make(chan struct{}, 1)}
	c.beat.Store(cfg.Now().UnixNano())
	return c, nil
}

// Changed is signalled (without blocking, coalesced) whenever a verdict, or
// another edge's verdicts (Differ), may have changed. Readers also call Dead now and then: a stalled checker cannot
// signal.
func (c *Checker) Changed() <-chan struct{} { return c.wake }

// SetTargets makes addrs the replicas to check; local tells which are this
// node. New ones start live; ones no longer listed are forgotten. It never
// blocks on I/O.
func (c *Checker) SetTargets(addrs []netip.Addr, local func(netip.Addr) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	want := map[netip.Addr]bool{}
	for _, a := range addrs {
		a = a.Unmap()
		want[a] = true
		if t, ok := c.targets[a]; ok {
			if t.local == local(a) {
				continue
			}
			t.cancel() // its path changed: probe it anew
		}
		t := &targetState{rep: newReplica(c.cfg.Now()), local: local(a), cancel: func() {}}
		c.targets[a] = t
		c.startLocked(a, t)
	}
	for a, t := range c.targets {
		if !want[a] {
			t.cancel()
			delete(c.targets, a)
		}
	}
	c.gaugesLocked()
}

func (c *Checker) startLocked(a netip.Addr, t *targetState) {
	if c.run == nil {
		return // Run starts it
	}
	ctx, cancel := context.WithCancel(c.run)
	t.cancel = cancel
	go c.probeLoop(ctx, a, t)
}

// Run evaluates verdicts every Tick until ctx ends. A panic in its loop is
// logged, counted and survived.
func (c *Checker) Run(ctx context.Context) error {
	c.mu.Lock()
	c.run = ctx
	for a, t := range c.targets {
		c.startLocked(a, t)
	}
	c.mu.Unlock()
	for ctx.Err() == nil {
		c.evaluate(ctx)
	}
	return nil
}

func (c *Checker) evaluate(ctx context.Context) {
	defer c.survive("evaluation loop", nil)
	tick := time.NewTicker(c.cfg.Tick)
	defer tick.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := c.cfg.Now()
		if c.step(now, last) {
			c.notify()
		}
		last = now
	}
}

// step is one evaluation at now (the previous one was at last, zero for the
// first): replicas silent for DeadAfter go dead. It reports whether a verdict
// changed.
func (c *Checker) step(now, last time.Time) bool {
	c.beat.Store(now.UnixNano())
	c.mu.Lock()
	defer c.mu.Unlock()
	// This loop itself ran late (the node starved the agent of CPU): the
	// replicas had no chance to be heard meanwhile, so the silence does not
	// count against them.
	if stall := now.Sub(last) - c.cfg.Tick; !last.IsZero() && stall > 2*c.cfg.Tick {
		c.excuseLocked(stall)
	}
	changed := false
	for a, t := range c.targets {
		if t.fault == nil && !t.held && t.rep.expire(c.cfg.Timing, now) {
			c.transitionLocked(a, t, "no answer for "+now.Sub(t.rep.lastOK).Round(time.Millisecond).String())
			changed = true
		}
	}
	if changed && c.learnLocked() { // a replica that went dead has no say now
		changed = true
	}
	return changed
}

// excuseLocked moves every replica's last answer later by a stall of the
// checker's own.
func (c *Checker) excuseLocked(stall time.Duration) {
	c.met.stalls.Inc()
	for _, t := range c.targets {
		t.rep.lastOK = t.rep.lastOK.Add(stall)
	}
}

// probeLoop probes one replica every Interval until ctx ends. A panic stops
// this replica's checks for a second (it counts as live meanwhile), then they
// start again.
func (c *Checker) probeLoop(ctx context.Context, a netip.Addr, t *targetState) {
	for ctx.Err() == nil {
		c.probeReplica(ctx, a, t)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (c *Checker) probeReplica(ctx context.Context, a netip.Addr, t *targetState) {
	defer c.survive("probe of "+a.String(), func(err error) { c.record(a, t, Fault, err, nil) })
	p := &prober{addr: target(a, c.cfg.Port), dial: c.cfg.dial(c.cfg.Iface, t.local),
		grace: c.cfg.ReloadGrace, hold: func() { c.hold(t) }}
	defer p.close()
	tick := time.NewTicker(c.cfg.Interval)
	defer tick.Stop()
	for {
		res, err := p.probe(ctx, time.Now().Add(c.cfg.DeadAfter))
		if ctx.Err() != nil {
			return
		}
		c.record(a, t, res, err, p.report)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// hold keeps the verdict on a replica whose probe waits for a restarted
// nginx to answer, until record has the probe's result.
func (c *Checker) hold(t *targetState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.met.holds.Inc()
	t.held = true
}

// record feeds one probe result to the replica's verdict; report is what a
// good answer said its node calls down.
func (c *Checker) record(a netip.Addr, t *targetState, res Result, err error, report []netip.Addr) {
	c.met.probes.WithLabelValues(string(res)).Inc()
	now := c.cfg.Now()
	c.mu.Lock()
	if c.targets[a] != t {
		c.mu.Unlock()
		return // forgotten or replaced meanwhile
	}
	t.held = false
	changed := false
	switch {
	case res == Fault:
		if t.fault == nil {
			c.met.faults.Inc()
			c.log.Error("liveness check failed: using Kubernetes' view of this replica", zap.Stringer("backend", a), zap.Error(err))
			changed = !t.rep.live
			c.gaugesLocked()
			t.fault = err
			if c.learnLocked() { // a replica it cannot probe has no say
				changed = true
			}
		}
		t.fault = err
	default:
		if t.fault != nil {
			c.log.Warn("liveness check works again", zap.Stringer("backend", a))
			t.fault = nil
			t.rep.lastOK = now // no verdict from the time it could not look
			changed = !t.rep.live
		}
		// What the others call this node is counted again only when a
		// report or a verdict changed: not on every probe (50 a second per
		// replica, and the count is over every pair).
		relearn := false
		if res == OK && !t.local && !slices.Equal(t.report, report) {
			// Differ may have changed too: the agent pins every new
			// connection while it holds.
			t.report, relearn, changed = report, true, true
		}
		if t.rep.answer(c.cfg.Timing, now, res == OK) {
			why := string(res)
			if err != nil {
				why += ": " + err.Error()
			}
			c.transitionLocked(a, t, why)
			changed, relearn = true, true
		}
		if relearn && c.learnLocked() {
			changed = true
		}
	}
	c.mu.Unlock()
	if changed {
		c.notify()
	}
}

func (c *Checker) transitionLocked(a netip.Addr, t *targetState, why string) {
	from, to := "live", "dead"
	if t.rep.live {
		from, to = to, from
	}
	c.met.transitions.WithLabelValues(to).Inc()
	c.log.Info("replica liveness changed", zap.Stringer("backend", a), zap.String("from", from), zap.String("to", to),
		zap.String("reason", why), zap.Int("rise", t.rep.rise(c.cfg.Timing)))
	c.gaugesLocked()
}

func (c *Checker) gaugesLocked() {
	var live, dead, fallback float64
	for _, t := range c.targets {
		switch {
		case t.fault != nil:
			fallback++
		case t.rep.live:
			live++
		default:
			dead++
		}
	}
	c.met.replicas.WithLabelValues("live").Set(live)
	c.met.replicas.WithLabelValues("dead").Set(dead)
	c.met.replicas.WithLabelValues("fallback").Set(fallback)
}

// calledLocked lists this node's own replicas (local targets) that a strict
// majority of the other edges call down, sorted. An edge's vote is the report
// in its last good answer, and counts only while this node calls it live: one
// it cannot hear has no say (its report is stale, and it is likely the one cut
// off). A replica whose own checks find it serving keeps its verdict local, so
// without this it would keep its place in its own rings while its peers give
// its slots to others: the rings differ, and connections opened meanwhile are
// lost when this node directs them, or walks them, later (bpf/README.md).
func (c *Checker) calledLocked() []netip.Addr {
	var out []netip.Addr
	for a, t := range c.targets {
		if !t.local {
			continue
		}
		voters, votes := 0, 0
		for _, o := range c.targets {
			if o.local || o.fault != nil || !o.rep.live {
				continue
			}
			voters++
			if slices.Contains(o.report, a) {
				votes++
			}
		}
		if voters > 0 && 2*votes > voters {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// learnLocked updates what the other edges call this node's replica, and
// reports whether that changed.
func (c *Checker) learnLocked() bool {
	called := c.calledLocked()
	if slices.Equal(called, c.called) {
		return false
	}
	c.log.Info("the other edges' verdict on this node's replica changed: its rings follow theirs",
		zap.Stringers("called down", called), zap.Stringers("was", c.called))
	c.called = called
	c.met.learned.Inc()
	if len(called) > 0 {
		c.met.calledDown.Set(1)
	} else {
		c.met.calledDown.Set(0)
	}
	return true
}

// survive turns a panic into a logged, counted fault.
func (c *Checker) survive(what string, then func(error)) {
	r := recover()
	if r == nil {
		return
	}
	err := fmt.Errorf("panic in %s: %v", what, r)
	c.met.faults.Inc()
	c.log.Error("liveness checker failed: falling back to Kubernetes' view", zap.Error(err))
	if then != nil {
		then(err)
	}
	c.notify()
}

func (c *Checker) notify() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// healthy reports whether the evaluation loop ran recently, and says so
// loudly when that changes. A beat older than Stall counts only once readers
// have found that same beat stale for Stall/2 more: when the node starves the
// whole agent of CPU, the loop and its readers pause alike, and the first
// reader to run again finds the beat stale though the loop is about to run
// too (and to excuse the pause, excuseLocked). Taking that for a stalled
// checker puts every replica Kubernetes lists back into the rings, a dead one
// too, until a reader asks again (the L4 sink: within a second), and new
// connections in the dead one's slots are lost meanwhile.
func (c *Checker) healthy() bool {
	now := c.cfg.Now().UnixNano()
	beat := c.beat.Load()
	ok := now-beat < int64(c.cfg.Stall)
	if !ok {
		c.staleMu.Lock()
		if c.staleBeat != beat {
			c.staleBeat, c.since = beat, now
		}
		ok = now-c.since < int64(c.cfg.Stall/2)
		c.staleMu.Unlock()
	}
	if c.stalled.Swap(!ok) == ok { // changed
		if ok {
			c.log.Warn("liveness checker running again")
			c.met.fallback.Set(0)
		} else {
			c.met.faults.Inc()
			c.met.fallback.Set(1)
			c.log.Error("liveness checker stalled: every replica Kubernetes lists is used", zap.Duration("stall", c.cfg.Stall))
		}
	}
	return ok
}

// Dead returns the replicas that must get no new flows now, sorted. It is
// empty when the checker as a whole is not working: a broken checker falls
// back to Kubernetes' view and never empties a ring.
func (c *Checker) Dead() []netip.Addr {
	if !c.healthy() {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var dead []netip.Addr
	for a, t := range c.targets {
		if t.fault == nil && (!t.rep.live || slices.Contains(c.called, a)) {
			dead = append(dead, a)
		}
	}
	slices.SortFunc(dead, netip.Addr.Compare)
	return dead
}

// Differ reports whether an edge this node hears (a live replica's node, by
// its last good answer) calls another set of replicas down than this node
// does (Dead). Their rings differ meanwhile: a connection this node's ring
// gives to a replica may be off that edge's ring, and the reverse
// (bpf/README.md, "Verdicts that differ"), so the agent's held reports list
// every connection while it lasts, and its data plane pins every new
// connection it directs (dataplane.Desired.Differ).
func (c *Checker) Differ() bool {
	mine := c.Dead()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range c.targets {
		if t.local || t.fault != nil || !t.rep.live {
			continue
		}
		theirs := slices.Clone(t.report)
		slices.SortFunc(theirs, netip.Addr.Compare)
		if !slices.Equal(slices.Compact(theirs), mine) {
			return true
		}
	}
	return false
}

// View lists every replica checked, sorted by address.
func (c *Checker) View() []Replica {
	stalled := !c.healthy()
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Replica, 0, len(c.targets))
	for a, t := range c.targets {
		r := Replica{Addr: a, Live: t.rep.live, Since: t.rep.since, CalledDown: slices.Contains(c.called, a)}
		switch {
		case stalled:
			r.Fallback = "checker stalled"
		case t.fault != nil:
			r.Fallback = t.fault.Error()
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(x, y Replica) int { return x.Addr.Compare(y.Addr) })
	return out
}
