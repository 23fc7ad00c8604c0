package lab

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

// TestBGPReplicaChange: a replica drains and another is added while the router
// moves flows between edges (one edge's agent restarts, so its session ends and
// its flows go to the others, then come back): every held connection keeps
// working, on the draining replica too, and no new connection fails.
func TestBGPReplicaChange(t *testing.T) {
	l := startBGPLab(t, 50*time.Millisecond)
	ctx := context.Background()
	e1, e2, e3 := l.Edges[0], l.Edges[1], l.Edges[2]
	slots := func(n, of *Node) (dataplane.BackendView, error) {
		bs, err := l.ownerBackends(n)
		if err != nil {
			return dataplane.BackendView{}, err
		}
		return bs[of.Addr.Addr().String()], nil
	}
	// e3's replica starts out of the group (its edge still announces and steers).
	if err := l.SetGroupEndpoints(ctx, map[*Node]string{e3: "gone"}); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error {
		for _, n := range l.Edges {
			if b, err := slots(n, e3); err != nil || b.Slots != 0 {
				return fmt.Errorf("%s: %s's replica still has ring slots (%+v, %v)", n.Name, e3.Name, b, err)
			}
		}
		return l.Router.Announced(len(l.Edges))
	}); err != nil {
		t.Fatal(err)
	}
	held, err := l.OpenKeepConns(ctx, "echo.lab", 90)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	capture := l.capture(t)
	onDrained := len(held) - len(OnSurvivors(held, e2))
	stream := l.StartStream(ctx, "echo.lab", traffic.StreamOptions{For: time.Minute})
	defer func() { stream.Stop() }() // the stream then running, also on failure
	time.Sleep(500 * time.Millisecond)

	change := time.Now()
	if err := l.Agent(0).Kill(syscall.SIGKILL, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	// The router has moved e1's flows to e2 and e3 before the replicas change.
	if _, err := l.Router.waitGone(e1, len(l.Edges), change, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := l.SetGroupEndpoints(ctx, map[*Node]string{e2: "terminating"}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.StartAgent(0); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(ctx, 60*time.Second, 100*time.Millisecond, func() error {
		for _, n := range l.Edges {
			b2, err := slots(n, e2)
			if err != nil {
				return err
			}
			b3, err := slots(n, e3)
			if err != nil {
				return err
			}
			if !b2.Draining || b2.Slots != 0 || b3.Slots == 0 {
				return fmt.Errorf("%s: %s draining %v with %d slots, %s with %d slots", n.Name, e2.Name, b2.Draining, b2.Slots, e3.Name, b3.Slots)
			}
		}
		if err := l.Ready(0); err != nil {
			return err
		}
		// e2's edge de-preferences its routes while its replica drains, so
		// the router moves the flows it sent e2 to e1 and e3.
		hops, err := l.Router.Nexthops()
		if err != nil {
			return err
		}
		if len(hops) != 2 || slices.Contains(hops, e2.Addr.Addr()) {
			return fmt.Errorf("the router's next hops %v, want %s and %s", hops, e1.Name, e3.Name)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s drained (its edge de-preferenced) and %s added while %s's agent restarted: settled after %v", e2.Name, e3.Name, e1.Name, time.Since(change).Round(time.Millisecond))
	time.Sleep(time.Second)
	atts := stream.Stop()
	kept, total, failed := CheckKeepConns(held, "/after-change")
	f := traffic.FailuresAround(atts, change)
	t.Logf("%d/%d long-lived connections kept (%d on the draining replica); new connections: %v", kept, total, onDrained, f)
	if onDrained == 0 {
		t.Error("no held connection on the draining replica: the test proves less than it says")
	}
	if kept != total {
		t.Errorf("%d long-lived connections broke: %v", total-kept, failed)
	}
	if f.Failed > 0 {
		t.Errorf("%d new connections failed:\n%s", f.Failed, l.explain(capture, atts, change))
	}
	// A new connection never reaches the draining replica.
	c := l.HTTPClient(false, 2*time.Second)
	for range 100 {
		r, err := l.Get(ctx, c, "echo.lab", "/new")
		if err != nil {
			t.Fatal(err)
		}
		if r.Edge == e2.Addr.Addr().String() {
			t.Fatalf("a new connection reached the draining replica %s", e2.Name)
		}
	}
}

// TestBGPOverlaps: behind FRR (ECMP, BFD), events overlap within one ring
// transition, each moving flows between edges: a replica drains (its edge
// de-preferences its routes), another edge's pod is replaced (a rolling update,
// gracefully: its endpoint terminates, its session ends, the others call its
// replica down, its endpoint goes, the new agent starts before it is back), a false
// liveness verdict on the third (its probe port blocked for 300 ms: it learns
// the others' verdict from their answers), and right after it the restarted
// edge dies. Every held connection on a surviving replica (opened before the
// events or between them) answers within 1 s
// of the router dropping the dead edge, the draining one's too, and no new
// connection fails once it has.
func TestBGPOverlaps(t *testing.T) {
	l := startBGPLab(t, 50*time.Millisecond)
	ctx := context.Background()
	e1, e2, e3 := l.Edges[0], l.Edges[1], l.Edges[2]
	if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error { return l.Router.Announced(len(l.Edges)) }); err != nil {
		t.Fatal(err)
	}
	held, err := l.OpenKeepConns(ctx, "echo.lab", 90)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	capture := l.capture(t)
	stream := l.StartStream(ctx, "echo.lab", traffic.StreamOptions{For: 2 * time.Minute})
	defer func() { stream.Stop() }() // the stream then running, also on failure
	time.Sleep(500 * time.Millisecond)

	// e2 drains.
	start := time.Now()
	if err := l.SetGroupEndpoints(ctx, map[*Node]string{e2: "terminating"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	// e1 restarts as a rolling update restarts a pod: its endpoint turns
	// terminating and its agent gets SIGTERM (it withdraws, waits its shutdown
	// delay, stops nginx); the new pod's endpoint is ready again.
	if err := l.SetGroupEndpoints(ctx, map[*Node]string{e1: "terminating", e2: "terminating"}); err != nil {
		t.Fatal(err)
	}
	a1 := l.Agent(0)
	if err := a1.Kill(syscall.SIGTERM, 40*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := l.stopNginx(filepath.Join(a1.Dir, "nginx")); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(ctx, 10*time.Second, 100*time.Millisecond, func() error {
		for _, n := range []*Node{e2, e3} {
			if in, err := l.InRing(n, e1); err != nil || in {
				return fmt.Errorf("%s: %s still in the ring (%v)", n.Name, e1.Name, err)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The old pod is deleted: its endpoint goes; the new pod's agent starts
	// before its endpoint is back (it is not ready yet), so it first applies a
	// group without its own replica, from what the pins say.
	if err := l.SetGroupEndpoints(ctx, map[*Node]string{e1: "gone", e2: "terminating"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	restarted := time.Now()
	if _, err := l.StartAgent(0); err != nil {
		t.Fatal(err)
	}
	// The new pod's endpoint is ready once the pod is (Kubernetes asks its
	// readiness probe: maps applied, nginx serving).
	if _, err := testenv.Poll(ctx, 60*time.Second, 100*time.Millisecond, func() error { return l.Ready(0) }); err != nil {
		t.Fatal(err)
	}
	if err := l.SetGroupEndpoints(ctx, map[*Node]string{e2: "terminating"}); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(ctx, 60*time.Second, 100*time.Millisecond, func() error {
		for _, n := range []*Node{e2, e3} {
			if in, err := l.InRing(n, e1); err != nil || !in {
				return fmt.Errorf("%s: %s not back in the ring (%v)", n.Name, e1.Name, err)
			}
		}
		return l.Router.Announced(len(l.Edges) - 1) // e2 de-preferenced
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s drained; %s restarted (agent and nginx, gracefully), back after %v", e2.Name, e1.Name, time.Since(restarted).Round(time.Millisecond))

	// Connections opened within the transition, after the drain and the restart.
	during, err := l.OpenKeepConns(ctx, "echo.lab", 40)
	if err != nil {
		t.Fatal(err)
	}
	defer during.Close()

	// A false verdict on e3, and e1's death right after it.
	probes := func(op string) {
		t.Helper()
		out, err := exec.Command("ip", "netns", "exec", e3.NS, "iptables", "-w", op, "INPUT", "-p", "tcp", "--dport", "10247", "-j", "DROP").CombinedOutput()
		if err != nil {
			t.Fatalf("iptables %s in %s: %v: %s", op, e3.Name, err, out)
		}
	}
	probes("-I")
	time.Sleep(300 * time.Millisecond)
	probes("-D")
	fault := time.Now()
	if err := l.KillEdge(e1); err != nil {
		t.Fatal(err)
	}
	// The router's route: e3 alone (e2 de-preferenced while it drains).
	gone, err := l.Router.waitGone(e1, len(l.Edges)-1, fault, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	survivors := OnSurvivors(append(slices.Clone(held), during...), e1)
	kept, failed := AnswerWithin(survivors, "/after-overlaps", time.Second)
	time.Sleep(2 * time.Second)
	atts := stream.Stop()
	onE2, onE3 := len(survivors)-len(OnSurvivors(survivors, e2)), len(survivors)-len(OnSurvivors(survivors, e3))
	late := traffic.FailuresAround(traffic.Hard(atts), fault.Add(gone+300*time.Millisecond))
	var beforeDeath []traffic.Attempt
	for _, a := range atts {
		if a.Start.Before(fault) {
			beforeDeath = append(beforeDeath, a)
		}
	}
	calm := traffic.FailuresAround(beforeDeath, start)
	t.Logf("%s dead: next hop gone after %v; held connections on surviving replicas: %d of %d answered within 1 s (%d on the draining %s, %d on %s, called down wrongly); new connections from the drain to the death: %v; after the next hop left (+300 ms): %v",
		e1.Name, gone.Round(time.Millisecond), kept, len(survivors), onE2, e2.Name, onE3, e3.Name, calm, late)
	if onE2 == 0 || onE3 == 0 {
		t.Errorf("held connections on %s %d, on %s %d: the test proves less than it says", e2.Name, onE2, e3.Name, onE3)
	}
	if kept != len(survivors) {
		t.Errorf("%d held connections on surviving replicas broke: %v", len(survivors)-kept, failed)
	}
	if late.Failed > 0 {
		t.Errorf("%d new connections failed (refused or reset) after the dead edge left the route:\n%s", late.Failed,
			l.explain(capture, traffic.Hard(atts), fault.Add(gone+300*time.Millisecond)))
	}
	if calm.Failed > 0 {
		t.Errorf("%d new connections failed during the drain, the rolling restart and the false verdict:\n%s", calm.Failed,
			l.explain(capture, beforeDeath, start))
	}
	// The verdict happened, and e3 learned it. (e1's new agent had no down to
	// replay: its replica was not in the group when it started, as in a real
	// rollout, and its history lacks the ring the others made while it was
	// called down; the walk's order does not need it.)
	if l.LivenessTransitions(e2, e3, "dead", fault.Add(-time.Second)) == 0 {
		t.Errorf("%s never called %s down: the false verdict did not happen", e2.Name, e3.Name)
	}
	if log := l.Agent(2).Log(); !strings.Contains(log, `"called down":["`+e3.Addr.Addr().String()+`"]`) {
		t.Errorf("%s never learned that the others called it down", e3.Name)
	}
}
