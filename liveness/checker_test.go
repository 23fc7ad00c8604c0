package liveness

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"

	"github.com/portico-edge/portico/test/testenv"
)

// replicaServer stands in for one replica's nginx: an HTTP server on its own
// loopback address answering Path. It can be stopped (nothing listens), hung
// (connections accepted, no answers: a stopped or wedged nginx) and started again.
type replicaServer struct {
	t    *testing.T
	addr netip.Addr
	port uint16

	mu     sync.Mutex
	srv    *http.Server
	hung   chan struct{} // closed to release hung handlers
	hang   bool
	report string // what follows "live" in its answers (its node's verdicts)
}

func newReplicaServer(t *testing.T, addr string, port uint16) *replicaServer {
	r := &replicaServer{t: t, addr: netip.MustParseAddr(addr), port: port}
	r.start()
	t.Cleanup(r.stop)
	return r
}

func (r *replicaServer) start() {
	ln, err := net.Listen("tcp", netip.AddrPortFrom(r.addr, r.port).String())
	if err != nil {
		r.t.Fatalf("listen: %v", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hung = make(chan struct{})
	hung := r.hung
	r.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		hang, report := r.hang, r.report
		r.mu.Unlock()
		if hang {
			<-hung
			return
		}
		if req.URL.Path != Path {
			http.NotFound(w, req)
			return
		}
		fmt.Fprint(w, "live\n"+report)
	})}
	go r.srv.Serve(ln)
}

func (r *replicaServer) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.srv != nil {
		close(r.hung)
		r.srv.Close()
		r.srv = nil
	}
}

func (r *replicaServer) setReport(report string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.report = report
}

func (r *replicaServer) setHang(h bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hang = h
	if !h {
		close(r.hung)
		r.hung = make(chan struct{})
	}
}

func startChecker(t *testing.T, cfg Config) (*Checker, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Registerer, cfg.Logger = reg, zaptest.NewLogger(t)
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return c, reg
}

// waitDead waits (bounded) until Dead() equals want and returns how long it took.
func waitDead(t *testing.T, c *Checker, want []netip.Addr, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < limit {
		if slices.Equal(c.Dead(), want) {
			return time.Since(start)
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("dead replicas %v after %v, want %v", c.Dead(), limit, want)
	return 0
}

func noneLocal(netip.Addr) bool { return false }

func TestCheckerFollowsReplicas(t *testing.T) {
	port := testenv.Ports(t, 1)[0]
	a := newReplicaServer(t, "127.0.0.2", port)
	b := newReplicaServer(t, "127.0.0.3", port)
	c, reg := startChecker(t, Config{Port: port})
	c.SetTargets([]netip.Addr{a.addr, b.addr}, noneLocal)

	time.Sleep(300 * time.Millisecond) // several rounds of answers
	if d := c.Dead(); len(d) != 0 {
		t.Fatalf("dead %v with both serving", d)
	}

	// Stopped: nothing listens any more.
	a.stop()
	took := waitDead(t, c, []netip.Addr{a.addr}, 3*time.Second)
	t.Logf("stopped replica out after %v", took.Round(time.Millisecond))

	// Hung: connections are accepted and never answered (a stopped or wedged nginx).
	b.setHang(true)
	took = waitDead(t, c, []netip.Addr{a.addr, b.addr}, 3*time.Second)
	t.Logf("hung replica out after %v", took.Round(time.Millisecond))

	// Both answer again: they come back, damped.
	a.start()
	b.setHang(false)
	took = waitDead(t, c, nil, 5*time.Second)
	t.Logf("both back after %v (rise %d × %v)", took.Round(time.Millisecond), DefaultTiming.Rise, DefaultTiming.Interval)

	if got := testutil.ToFloat64(c.met.transitions.WithLabelValues("dead")); got != 2 {
		t.Errorf("dead transitions = %v, want 2", got)
	}
	if got := testutil.ToFloat64(c.met.transitions.WithLabelValues("live")); got != 2 {
		t.Errorf("live transitions = %v, want 2", got)
	}
	if n, err := testutil.GatherAndCount(reg, "portico_liveness_probes_total"); err != nil || n != len(Results) {
		t.Errorf("probe series %d (%v), want %d", n, err, len(Results))
	}
	view := c.View()
	if len(view) != 2 || !view[0].Live || !view[1].Live || view[0].Addr != a.addr {
		t.Errorf("view %+v", view)
	}
}

// A checker that cannot open sockets says nothing of the replicas: they stay
// live (Kubernetes' view), loudly.
func TestCheckerFaultFallsBack(t *testing.T) {
	port := testenv.Ports(t, 1)[0]
	a := newReplicaServer(t, "127.0.0.2", port)
	var mu sync.Mutex
	broken := false
	cfg := Config{Port: port}
	cfg.dial = func(iface string, local bool) func(ctx context.Context, network, addr string) (net.Conn, error) {
		d := dialer(iface, local)
		return func(ctx context.Context, network, addr string) (net.Conn, error) {
			mu.Lock()
			b := broken
			mu.Unlock()
			if b {
				return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.EMFILE}
			}
			return d(ctx, network, addr)
		}
	}
	c, _ := startChecker(t, cfg)
	c.SetTargets([]netip.Addr{a.addr}, noneLocal)
	time.Sleep(100 * time.Millisecond)

	mu.Lock()
	broken = true
	mu.Unlock()
	a.stop() // the replica dies too, but the checker cannot know
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if v := c.View(); v[0].Fallback != "" {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // longer than DeadAfter
	if d := c.Dead(); len(d) != 0 {
		t.Fatalf("dead %v while the checker cannot probe: want Kubernetes' view", d)
	}
	if v := c.View(); v[0].Fallback == "" {
		t.Fatalf("view %+v does not say the checker fell back", v)
	}
	if got := testutil.ToFloat64(c.met.faults); got != 1 {
		t.Errorf("faults = %v, want 1", got)
	}

	// It works again: now it sees the replica is gone.
	mu.Lock()
	broken = false
	mu.Unlock()
	waitDead(t, c, []netip.Addr{a.addr}, 3*time.Second)
}

// idleChecker is a checker on a fake clock with one replica and no probes (it
// does not run): advance moves its clock.
func idleChecker(t *testing.T) (c *Checker, a netip.Addr, advance func(time.Duration)) {
	t.Helper()
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	c, err := New(Config{Port: 1, Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }})
	if err != nil {
		t.Fatal(err)
	}
	a = netip.MustParseAddr("192.0.2.1")
	c.SetTargets([]netip.Addr{a}, noneLocal)
	return c, a, func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
}

// A stalled evaluation loop falls back to Kubernetes' view for every replica:
// one that stays silent while its readers run. The whole agent's pause (the
// node starved it of CPU) stops the loop and its readers alike: the first
// reader after it keeps the verdicts, and the loop, running again, ends the
// suspicion; a dead replica never comes back into the rings for a pause.
func TestCheckerStallFallsBack(t *testing.T) {
	c, a, advance := idleChecker(t)
	c.targets[a].rep.live = false
	if d := c.Dead(); !slices.Equal(d, []netip.Addr{a}) {
		t.Fatalf("dead %v", d)
	}
	advance(2 * time.Second) // the agent paused for 2 s
	if d := c.Dead(); !slices.Equal(d, []netip.Addr{a}) {
		t.Fatalf("dead %v right after a pause of the whole agent, want %v kept", d, a)
	}
	advance(100 * time.Millisecond)
	c.step(c.cfg.Now(), c.cfg.Now().Add(-2100*time.Millisecond)) // the loop runs again
	advance(2 * time.Second)                                     // and the agent pauses again
	if d := c.Dead(); !slices.Equal(d, []netip.Addr{a}) {
		t.Fatalf("dead %v right after a second pause, want %v kept", d, a)
	}
	if got := testutil.ToFloat64(c.met.fallback); got != 0 {
		t.Errorf("fallback gauge %v after pauses, want 0", got)
	}
	// The loop stays silent while readers run: stalled.
	advance(300 * time.Millisecond)
	if d := c.Dead(); !slices.Equal(d, []netip.Addr{a}) {
		t.Fatalf("dead %v, want %v: the loop has had only 300 ms", d, a)
	}
	advance(300 * time.Millisecond)
	if d := c.Dead(); len(d) != 0 {
		t.Fatalf("dead %v from a stalled checker", d)
	}
	if v := c.View(); v[0].Fallback != "checker stalled" {
		t.Fatalf("view %+v", v)
	}
	if got := testutil.ToFloat64(c.met.fallback); got != 1 {
		t.Errorf("fallback gauge %v", got)
	}
}

func TestClassify(t *testing.T) {
	op := func(e error) error { return &net.OpError{Op: "read", Net: "tcp", Err: e} }
	for _, tc := range []struct {
		err  error
		want Result
	}{
		{op(syscall.ECONNREFUSED), Refused},
		{op(syscall.ECONNRESET), Reset},
		{op(syscall.EHOSTUNREACH), Unreachable},
		{op(syscall.EMFILE), Fault},
		{op(syscall.ENOBUFS), Fault},
		{context.DeadlineExceeded, Timeout},
		{fmt.Errorf("malformed HTTP response %q", "x"), Fault},
	} {
		if got := classify(tc.err); got != tc.want {
			t.Errorf("classify(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
	if got := classifyRead(fmt.Errorf("malformed HTTP response %q", "x")); got != BadAnswer {
		t.Errorf("classifyRead(parse error) = %s", got)
	}
}

// A stall of the checker's own loop is not held against the replicas; the
// same silence without a stall is.
func TestCheckerExcusesItsOwnStall(t *testing.T) {
	c, a, _ := idleChecker(t)
	t0 := c.cfg.Now()
	tick := c.cfg.Tick
	// Ticks on time for 100 ms, then none for a second (the agent starved),
	// then on time again: no answer came in all that time.
	last := t0
	for now := t0.Add(tick); now.Sub(t0) <= 100*time.Millisecond; now = now.Add(tick) {
		c.step(now, last)
		last = now
	}
	resumed := last.Add(time.Second)
	if c.step(resumed, last) {
		t.Fatal("a replica went dead for the checker's own stall")
	}
	if got := testutil.ToFloat64(c.met.stalls); got != 1 {
		t.Errorf("stalls = %v, want 1", got)
	}
	// Silence on time after the stall counts: dead once DeadAfter has passed.
	last = resumed
	var deadAt time.Duration
	for now := resumed.Add(tick); now.Sub(resumed) < time.Second; now = now.Add(tick) {
		if c.step(now, last) {
			deadAt = now.Sub(resumed)
			break
		}
		last = now
	}
	if d := c.Dead(); len(d) != 1 || d[0] != a {
		t.Fatalf("dead %v after the stall and %v of silence, want %v", d, deadAt, a)
	}
	if deadAt > c.cfg.DeadAfter+tick {
		t.Errorf("dead %v after the stall ended, want <= %v: the stall is excused, the silence after it is not", deadAt, c.cfg.DeadAfter+tick)
	}
}

// TestCheckerLearnsOthersVerdict: this node's own replica, which its own
// checks find serving, is dead for its rings while most other edges' answers
// say they call it down; an edge this node cannot hear has no say.
func TestCheckerLearnsOthersVerdict(t *testing.T) {
	port := testenv.Ports(t, 1)[0]
	self := newReplicaServer(t, "127.0.0.4", port)
	a := newReplicaServer(t, "127.0.0.2", port)
	b := newReplicaServer(t, "127.0.0.3", port)
	cc := newReplicaServer(t, "127.0.0.5", port)
	c, _ := startChecker(t, Config{Port: port})
	c.SetTargets([]netip.Addr{self.addr, a.addr, b.addr, cc.addr}, func(x netip.Addr) bool { return x == self.addr })
	time.Sleep(100 * time.Millisecond)
	if d := c.Dead(); len(d) != 0 {
		t.Fatalf("dead %v with every replica serving and nobody called down", d)
	}

	// One of three calls it down (and says something this checker skips).
	a.setReport("down 127.0.0.4\ndown not-an-address\nsomething else\n")
	time.Sleep(100 * time.Millisecond)
	if d := c.Dead(); len(d) != 0 {
		t.Fatalf("dead %v when one of three edges calls this node down", d)
	}
	// Two of three: it follows them.
	b.setReport("down 127.0.0.4\ndown 127.0.0.9\n")
	took := waitDead(t, c, []netip.Addr{self.addr}, 2*time.Second)
	t.Logf("learned it is called down after %v", took.Round(time.Millisecond))
	if got := testutil.ToFloat64(c.met.calledDown); got != 1 {
		t.Errorf("called_down = %v, want 1", got)
	}
	view := c.View()
	if i := slices.IndexFunc(view, func(r Replica) bool { return r.Addr == self.addr }); i < 0 || !view[i].Live || !view[i].CalledDown {
		t.Errorf("view of this node's replica %+v, want live and called down", view)
	}

	// An edge it cannot hear has no say: with b dead to it, one of two (a)
	// calls it down, no majority.
	b.stop()
	waitDead(t, c, []netip.Addr{b.addr}, 3*time.Second)
	// They clear their verdicts: it is live again at once.
	a.setReport("")
	waitDead(t, c, []netip.Addr{b.addr}, 2*time.Second)
	cc.setReport("down 127.0.0.4\n")
	a.setReport("down 127.0.0.4\n")
	waitDead(t, c, []netip.Addr{b.addr, self.addr}, 2*time.Second)
	a.setReport("")
	cc.setReport("")
	waitDead(t, c, []netip.Addr{b.addr}, 2*time.Second)
	if got := testutil.ToFloat64(c.met.calledDown); got != 0 {
		t.Errorf("called_down = %v, want 0", got)
	}
	if got := testutil.ToFloat64(c.met.learned); got < 4 {
		t.Errorf("called_down_transitions_total = %v, want at least 4", got)
	}
}

// TestCheckerDiffer: Differ says whether an edge this node hears calls
// another set of replicas down than this node does (their rings differ: the
// agent's held reports then list every connection).
func TestCheckerDiffer(t *testing.T) {
	port := testenv.Ports(t, 1)[0]
	self := newReplicaServer(t, "127.0.0.4", port)
	a := newReplicaServer(t, "127.0.0.2", port)
	b := newReplicaServer(t, "127.0.0.3", port)
	c, _ := startChecker(t, Config{Port: port})
	c.SetTargets([]netip.Addr{self.addr, a.addr, b.addr}, func(x netip.Addr) bool { return x == self.addr })
	waitDiffer := func(want bool, why string) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Second)
		for c.Differ() != want {
			if time.Now().After(deadline) {
				t.Fatalf("Differ() = %v, want %v: %s (dead here %v)", !want, want, why, c.Dead())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitDiffer(false, "every edge calls nobody down")
	// One edge alone calls b down (its probes failed, this node's passed).
	// Changed says so: the agent pins every new connection while verdicts
	// differ, and nothing else changes here to wake it.
	for drained := false; !drained; {
		select {
		case <-c.Changed():
		default:
			drained = true
		}
	}
	a.setReport("down 127.0.0.3\n")
	waitDiffer(true, "a calls b down, this node does not")
	select {
	case <-c.Changed():
	case <-time.After(time.Second):
		t.Fatal("another edge's verdicts changed (Differ), Changed was not signalled")
	}
	a.setReport("")
	waitDiffer(false, "a's verdict agrees again")
	// This node alone calls a replica down: b's answers stop.
	b.stop()
	waitDead(t, c, []netip.Addr{b.addr}, 3*time.Second)
	waitDiffer(true, "this node calls b down, a does not")
	// a agrees (its report, in any order, with b's own verdicts unheard).
	a.setReport("down 127.0.0.3\ndown 127.0.0.3\n")
	waitDiffer(false, "a calls b down too")
}
