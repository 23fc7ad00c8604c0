package lab

import (
	"context"
	"fmt"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

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
	l.checkMetricsDocumented(t) // with BGP's series, before an edge dies
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
// (the recommended router setting, docs/bgp.md), an edge's death moves
// none of the surviving edges' flows and its return moves only the flows it takes
// back; held connections and new ones keep working through both.
func TestBGPResilient(t *testing.T) {
	// What is watched is the router's group, not BFD's speed: detection in 5
	// intervals, so that a starved agent's session does not flap during the
	// return (CI run 16: FRR's BFD called e3 down 3 s after it came back, e3
	// joined the group twice, and the second join took buckets from e1 and e2
	// that were not the ones the first had taken).
	l := startBGPLabWith(t, BGPOptions{BFD: 50 * time.Millisecond, BFDMultiplier: 5, Resilient: true})
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
		t.Errorf("the re-add moved %d flows between edges that stayed, want 0; the group's changes: %v", between, l.Router.res.history())
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
