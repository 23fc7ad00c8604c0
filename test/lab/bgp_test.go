package lab

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/test/frr"
	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

// startBGPLab is startLab for the BGP lab: the client behind an FRR router, the
// agents with --announce=bgp and BFD at bfd x 3.
func startBGPLab(t *testing.T, bfd time.Duration) *Lab {
	t.Helper()
	return startBGPLabWith(t, BGPOptions{BFD: bfd})
}

// startBGPLabWith is startBGPLab with more options (o.T is set here).
func startBGPLabWith(t *testing.T, o BGPOptions) *Lab {
	t.Helper()
	testenv.RequireRoot(t, "network namespaces, XDP, FRR")
	if _, err := os.Stat(filepath.Join(frr.Dir, "bgpd")); err != nil {
		testenv.Unavailable(t, "FRR is not installed (%v); hack/deps.sh installs it", err)
	}
	o.T = t
	return startLabWith(t, Options{Portico: porticoBin, BGP: &o})
}

// directed reads, per edge, how many new connections its xdp_lb steered (as a
// director: the router sent them to it).
func (l *Lab) directed(t *testing.T) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for i, e := range l.Edges {
		in, err := dataplane.OpenPinned(l.Agent(i).PinPath)
		if err != nil {
			t.Fatalf("%s: %v", e.Name, err)
		}
		vs, err := in.VIPs()
		in.Close()
		if err != nil {
			t.Fatalf("%s: %v", e.Name, err)
		}
		for _, v := range vs {
			if v.Addr == VIP {
				out[e.Name] += v.Counters.NewFlows
			}
		}
	}
	return out
}

// TestBGPEveryEdge: with --announce=bgp every edge announces the VIP and the
// router spreads new connections over all of them by ECMP; each edge steers what
// it receives to the same replica. Then an edge dies (agent kill -9, link cut):
// its next hop is gone within the BFD bound, and no established connection on a
// surviving replica breaks, also those the router moved to another edge (all it
// had sent to the dead one). The edge comes back: the router rehashes flows onto
// it, and no connection breaks. An agent restarts under load: no request fails.
func TestBGPEveryEdge(t *testing.T) {
	const bfd = 50 * time.Millisecond
	l := startBGPLab(t, bfd)
	ctx := context.Background()

	hops, err := l.Router.Nexthops()
	if err != nil || len(hops) != len(l.Edges) {
		t.Fatalf("the router's route to the VIP: next hops %v (%v), want one per edge", hops, err)
	}
	t.Logf("the router's route to %s: next hops %v", VIP, hops)
	before := l.directed(t)
	c := l.HTTPClient(false, 2*time.Second)
	perReplica := map[string]int{}
	for range 300 {
		r, err := l.Get(ctx, c, "echo.lab", "/spread")
		if err != nil {
			t.Fatal(err)
		}
		perReplica[r.Edge]++
	}
	after := l.directed(t)
	for _, e := range l.Edges {
		n := after[e.Name] - before[e.Name]
		if n < 30 {
			t.Errorf("edge %s directed %d of 300 new connections, want a share (>= 30)", e.Name, n)
		}
	}
	t.Logf("300 new connections: directed per edge (ECMP) %v before, %v after; served per replica %v", before, after, perReplica)

	// An edge dies while 90 connections are held and new ones keep coming.
	held, err := l.OpenKeepConns(ctx, "echo.lab", 90)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	stream := l.StartStream(ctx, "echo.lab", traffic.StreamOptions{For: time.Minute})
	defer func() { stream.Stop() }() // the stream then running, also on failure
	time.Sleep(time.Second)
	// What is measured is BFD's detection: every session must be up now (on a
	// loaded machine a 50 ms session flaps now and then, and comes back).
	if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error { return l.Router.Announced(len(l.Edges)) }); err != nil {
		t.Fatal(err)
	}
	victim := l.Edges[len(l.Edges)-1]
	fault := time.Now()
	if err := l.KillEdge(victim); err != nil {
		t.Fatal(err)
	}
	gone, err := l.Router.waitGone(victim, len(l.Edges), fault, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s killed (agent -9, link down): its next hop left the router's route after %v (BFD %v x 3)", victim.Name, gone.Round(time.Millisecond), bfd)
	if bound := 3*bfd + 300*time.Millisecond; gone > bound {
		t.Errorf("next hop gone after %v, want within %v", gone, bound)
	}
	time.Sleep(2 * time.Second)
	atts := stream.Stop()
	total, kept := 0, 0
	var failed []string
	for _, k := range held {
		if k.Edge == victim.Addr.Addr().String() {
			continue
		}
		total++
		if _, err := k.Do("echo.lab", "/after", 3*time.Second); err == nil {
			kept++
		} else {
			failed = append(failed, k.Edge+": "+err.Error())
		}
	}
	t.Logf("%d/%d long-lived connections on surviving replicas kept", kept, total)
	if kept != total {
		t.Errorf("%d long-lived connections on surviving replicas broke: %v", total-kept, failed)
	}
	news := traffic.FailuresAround(atts, fault)
	late := traffic.FailuresAround(traffic.Hard(atts), fault.Add(gone+300*time.Millisecond))
	t.Logf("new connections after the fault: %v; after the next hop left (+300 ms): %v", news, late)
	if late.Failed > 0 {
		t.Errorf("%d new connections failed (refused or reset) after the dead edge left the route", late.Failed)
	}

	// The edge comes back: its next hop returns and the router moves flows onto it.
	held2, err := l.OpenKeepConns(ctx, "echo.lab", 90)
	if err != nil {
		t.Fatal(err)
	}
	defer held2.Close()
	stream = l.StartStream(ctx, "echo.lab", traffic.StreamOptions{For: time.Minute})
	back := time.Now()
	if err := l.ReviveEdge(victim); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error { return l.Router.Announced(len(l.Edges)) }); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s back: announced again %v after its link came up", victim.Name, time.Since(back).Round(time.Millisecond))
	time.Sleep(2 * time.Second)
	atts = stream.Stop()
	var older traffic.KeepConns
	for _, k := range held {
		if k.Edge != victim.Addr.Addr().String() {
			older = append(older, k)
		}
	}
	kept, total, failed = CheckKeepConns(older, "/after-return")
	t.Logf("%d/%d long-lived connections opened before the edge died kept while the router rehashed flows onto %s; new connections: %v",
		kept, total, victim.Name, traffic.FailuresAround(atts, back))
	if kept != total {
		t.Errorf("%d long-lived connections broke when %s came back: %v", total-kept, victim.Name, failed)
	}
	// Connections opened while the edge was away, in slots that were its own:
	// the returning edge, a director for a third of the flows at once, starts
	// from the ring without its replica (dataplane.Options.Arrival) and sends
	// them where they are.
	k2, t2, f2 := CheckKeepConns(held2, "/after-return")
	t.Logf("%d/%d long-lived connections opened while %s was away kept", k2, t2, victim.Name)
	if k2 != t2 {
		t.Errorf("%d long-lived connections opened while %s was away broke when it came back: %v", t2-k2, victim.Name, f2)
	}
	if f := traffic.FailuresAround(atts, back); f.Failed > 0 {
		t.Errorf("%d new connections failed when %s came back", f.Failed, victim.Name)
	}

	// An agent dies and starts again (kill -9, as TestAgentRestartUnderLoad) under
	// load: its session ends, the router moves its flows to the other edges, the
	// pinned program and nginx keep serving, and it announces again.
	stream = l.StartStream(ctx, "echo.lab", traffic.StreamOptions{For: time.Minute})
	restart := time.Now()
	if err := l.Agent(0).Kill(syscall.SIGKILL, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := l.StartAgent(0); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error {
		if err := l.Ready(0); err != nil {
			return err
		}
		return l.Router.Announced(len(l.Edges))
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s's agent restarted and announced again %v after the kill", l.Edges[0].Name, time.Since(restart).Round(time.Millisecond))
	time.Sleep(time.Second)
	atts = stream.Stop()
	kept, total, failed = CheckKeepConns(older, "/after-restart")
	f := traffic.FailuresAround(atts, restart)
	t.Logf("agent restart: %v; %d/%d long-lived connections kept", f, kept, total)
	if f.Failed > 0 || kept != total {
		t.Errorf("agent restart: %d new connections failed, %d long-lived connections broke (%v)", f.Failed, total-kept, failed)
	}
}

// TestBGPResilient: behind a router that forwards by a resilient nexthop group
// (the recommended router setting, README "BGP mode"), an edge's death moves
// none of the surviving edges' flows and its return moves only the flows it takes
// back; held connections and new ones keep working through both.
func TestBGPResilient(t *testing.T) {
	l := startBGPLabWith(t, BGPOptions{BFD: 50 * time.Millisecond, Resilient: true})
	ctx := context.Background()
	following := func(want int) func() error {
		return func() error {
			if err := l.Router.Announced(want); err != nil {
				return err
			}
			hops, err := l.Router.Nexthops()
			if err != nil {
				return err
			}
			members, err := l.Router.res.members()
			if err != nil {
				return err
			}
			if len(members) != len(hops) {
				return fmt.Errorf("the resilient group has %v, FRR's route %v", members, hops)
			}
			return nil
		}
	}
	if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, following(len(l.Edges))); err != nil {
		t.Fatal(err)
	}
	choices := func() map[uint16]netip.Addr {
		out, err := l.Router.Choices(20000, 600)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	held, err := l.OpenKeepConns(ctx, "echo.lab", 90)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	stream := l.StartStream(ctx, "echo.lab", traffic.StreamOptions{For: time.Minute})
	defer func() { stream.Stop() }() // the stream then running, also on failure
	before := choices()
	victim := l.Edges[len(l.Edges)-1]
	fault := time.Now()
	if err := l.KillEdge(victim); err != nil {
		t.Fatal(err)
	}
	gone, err := l.Router.waitGone(victim, len(l.Edges), fault, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(ctx, 5*time.Second, 100*time.Millisecond, following(len(l.Edges)-1)); err != nil {
		t.Fatal(err)
	}
	after := choices()
	moved, survivors := 0, 0
	for sport, a := range before {
		if a != victim.Addr.Addr() {
			survivors++
			if after[sport] != a {
				moved++
			}
		}
	}
	t.Logf("%s killed: next hop gone after %v; the removal moved %d of %d surviving edges' flows (%.1f%%)",
		victim.Name, gone.Round(time.Millisecond), moved, survivors, 100*float64(moved)/float64(max(survivors, 1)))
	if moved != 0 {
		t.Errorf("the resilient group moved %d of %d flows of the surviving edges, want 0", moved, survivors)
	}
	time.Sleep(time.Second)
	kept, total, failed := CheckKeepConns(OnSurvivors(held, victim), "/after-death")
	t.Logf("%d/%d long-lived connections on surviving replicas kept", kept, total)
	if kept != total {
		t.Errorf("%d long-lived connections on surviving replicas broke: %v", total-kept, failed)
	}

	back := time.Now()
	if err := l.ReviveEdge(victim); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, following(len(l.Edges))); err != nil {
		t.Fatal(err)
	}
	returned := choices()
	toVictim, between := 0, 0
	for sport, a := range after {
		switch b := returned[sport]; {
		case b == a:
		case b == victim.Addr.Addr():
			toVictim++
		default:
			between++
		}
	}
	time.Sleep(2 * time.Second)
	atts := stream.Stop()
	t.Logf("%s back after %v: %d of %d flows moved to it (%.1f%%), %d between the other edges",
		victim.Name, time.Since(back).Round(time.Millisecond), toVictim, len(after), 100*float64(toVictim)/float64(len(after)), between)
	if between != 0 {
		t.Errorf("the re-add moved %d flows between edges that stayed, want 0", between)
	}
	kept, total, failed = CheckKeepConns(OnSurvivors(held, victim), "/after-return")
	news := traffic.FailuresAround(atts, fault)
	late := traffic.FailuresAround(traffic.Hard(atts), fault.Add(gone+300*time.Millisecond))
	t.Logf("%d/%d long-lived connections on surviving replicas kept; new connections from the fault on: %v; after the next hop left (+300 ms): %v", kept, total, news, late)
	if kept != total {
		t.Errorf("%d long-lived connections broke when %s came back: %v", total-kept, victim.Name, failed)
	}
	if late.Failed > 0 {
		t.Errorf("%d new connections failed (refused or reset) after the dead edge left the route", late.Failed)
	}
}

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
