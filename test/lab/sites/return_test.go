package sites

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/test/lab"
	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

// TestSiteReturn: site b, withdrawn (its federated Ingress had
// no ready backend), announces the anycast VIP again while clients hold
// connections to site a. The router rehashes, and sends some of those
// connections to b's edges, which have never seen them. Run twice: first each
// site on its own (no --federation-peers: what anycast gives today), where those
// connections are reset; then with the sites knowing each other's edges, where b
// starts a site hand-over and sends every packet no replica of b has to a's
// edges through a tunnel: none is reset. New connections keep coming
// throughout, and none fails.
func TestSiteReturn(t *testing.T) {
	s := startSites(t)
	ctx := context.Background()
	for _, handover := range []bool{false, true} {
		name := "baseline, each site on its own"
		if handover {
			name = "site hand-over"
		}
		for _, l := range []*lab.Lab{s.A, s.B} {
			if err := s.SetPeers(l, handover); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.WaitRemotes(30*time.Second, handover); err != nil {
			t.Fatalf("%s: %v", name, err)
		}

		// b goes away: its Ingress has no ready backend.
		if err := s.B.SetBackendReady(ctx, false); err != nil {
			t.Fatal(err)
		}
		if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error {
			p, err := s.Paths()
			if err != nil {
				return err
			}
			if p["b"] != 0 || p["a"] != len(s.A.Edges) {
				return fmt.Errorf("the router's paths to the lab.VIP by site: %v, want a's only", p)
			}
			return nil
		}); err != nil {
			t.Fatalf("%s: site b not withdrawn: %v", name, err)
		}
		held, err := s.OpenKeepConns(ctx, "echo.lab", 64)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range held {
			if s.SiteOf(k.Edge) != "a" {
				t.Fatalf("%s: a connection opened while b was withdrawn is held by %s", name, k.Edge)
			}
		}
		out0, err := s.Reasons(s.B, dataplane.ReasonSiteOut)
		if err != nil {
			t.Fatal(err)
		}
		in0, err := s.Reasons(s.A, dataplane.ReasonSiteIn)
		if err != nil {
			t.Fatal(err)
		}

		// b comes back while the connections are held and new ones keep coming.
		stream := s.StartStream(ctx, "echo.lab", traffic.StreamOptions{For: time.Minute})
		time.Sleep(500 * time.Millisecond)
		back := time.Now()
		if err := s.B.SetBackendReady(ctx, true); err != nil {
			stream.Stop()
			t.Fatal(err)
		}
		_, err = testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, s.HopsAre(len(s.A.Edges), len(s.B.Edges)))
		announced := time.Since(back)
		if err != nil {
			stream.Stop()
			t.Fatalf("%s: site b not back in the route: %v", name, err)
		}
		time.Sleep(2 * time.Second)
		atts := stream.Stop()
		moved := s.sentTo(t, held, "b")
		kept, total, failed := lab.CheckKeepConns(held, "/after-return")
		held.Close()
		news := traffic.FailuresAround(atts, back)
		out1, err := s.Reasons(s.B, dataplane.ReasonSiteOut)
		if err != nil {
			t.Fatal(err)
		}
		in1, err := s.Reasons(s.A, dataplane.ReasonSiteIn)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: b back in the route %v after its backend was ready; the router now sends %d of %d held connections to b; %d/%d held kept (%d reset); new connections: %v; packets b sent to a through the tunnel: %d, a took out: %d",
			name, announced.Round(time.Millisecond), moved, total, kept, total, total-kept, news, out1-out0, in1-in0)
		if moved == 0 {
			t.Fatalf("%s: the router moved none of %d held connections to b: the lab shows nothing", name, total)
		}
		if late, ok := joinFailures(atts, news, back, announced); !ok {
			t.Errorf("%s: %d new connections failed as b came back (%d more than a second after it was in the route)", name, news.Failed, late.Failed)
		}
		if !handover {
			if kept == total {
				t.Errorf("baseline: all %d held connections kept though the router moved %d to b, which has none of them: the lab does not show the problem", total, moved)
			}
			continue
		}
		if kept != total {
			t.Errorf("site hand-over: %d of %d held connections broke: %v", total-kept, total, failed)
		}
		if out1 == out0 || in1 == in0 {
			t.Errorf("site hand-over: no packet went through the tunnel (%d out of b, %d into a)", out1-out0, in1-in0)
		}
	}
}

// TestSiteReturnDuringDrain: a return and a drain that overlap, across sites.
// Site b is withdrawn and 64 connections are held at site a; one
// of a's edges starts draining (its replica terminating) and, 300 ms later, b
// returns to the route, with the sites' hand-over on: the router moves some of
// the held flows to b, whose edges send them back to a through the tunnel, where
// they must find their replicas while a's rings change. Each held connection
// must answer, and no new connection may fail once b is in the route. Then the
// drain ends: every connection opened during it must answer too.
func TestSiteReturnDuringDrain(t *testing.T) {
	s := startPeeredSites(t)
	ctx := context.Background()
	if err := s.B.SetBackendReady(ctx, false); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, s.HopsAre(len(s.A.Edges), 0)); err != nil {
		t.Fatalf("site b not withdrawn: %v", err)
	}
	held, err := s.OpenKeepConns(ctx, "echo.lab", 64)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	drained := s.A.Edges[0]
	onDrained := len(held) - len(lab.OnSurvivors(held, drained))
	stream := s.StartStream(ctx, "echo.lab", traffic.StreamOptions{For: time.Minute})
	defer func() { stream.Stop() }() // the stream then running, also on failure
	time.Sleep(500 * time.Millisecond)

	start := time.Now()
	if err := s.A.SetGroupEndpoints(ctx, map[*lab.Node]string{drained: "terminating"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	back := time.Now()
	if err := s.B.SetBackendReady(ctx, true); err != nil {
		t.Fatal(err)
	}
	// The draining edge de-preferences its routes: the router keeps a's others.
	_, err = testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, s.HopsAre(len(s.A.Edges)-1, len(s.B.Edges)))
	announced := time.Since(back)
	if err != nil {
		t.Fatalf("site b not back in the route: %v", err)
	}
	// During the drain, more connections open (some to b now).
	during, err := s.OpenKeepConns(ctx, "echo.lab", 32)
	if err != nil {
		t.Fatal(err)
	}
	defer during.Close()
	time.Sleep(2 * time.Second)
	moved := s.sentTo(t, held, "b")
	kept, total, failed := lab.CheckKeepConns(held, "/after-return")
	t.Logf("%s draining, b back in the route %v later (%v after its backend was ready); the router sends %d of %d held connections to b; %d/%d held kept (%d on the draining replica)",
		drained.Name, back.Sub(start).Round(time.Millisecond), announced.Round(time.Millisecond), moved, total, kept, total, onDrained)
	if moved == 0 || onDrained == 0 {
		t.Errorf("the router moved %d held connections to b, %d are on the draining replica: the lab shows less than it says", moved, onDrained)
	}
	if kept != total {
		t.Errorf("%d of %d held connections broke: %v", total-kept, total, failed)
	}

	// The drain ends while the connections opened during it are held.
	end := time.Now()
	if err := s.A.SetGroupEndpoints(ctx, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	atts := stream.Stop()
	k2, t2, f2 := lab.CheckKeepConns(during, "/after-drain")
	k3, t3, f3 := lab.CheckKeepConns(held, "/after-drain")
	news := traffic.FailuresAround(atts, start)
	late := traffic.FailuresAround(traffic.Hard(atts), back.Add(announced+time.Second))
	t.Logf("drain over %v after it began: %d/%d connections opened during it kept, %d/%d of the first ones; new connections: %v",
		end.Sub(start).Round(time.Millisecond), k2, t2, k3, t3, news)
	if k2 != t2 || k3 != t3 {
		t.Errorf("the drain's end broke %d of %d connections opened during it (%v) and %d of %d of the first ones (%v)", t2-k2, t2, f2, t3-k3, t3, f3)
	}
	// A connection opened while b's edges join the route one by one can have
	// its handshake split over two route changes (TestSiteReturn): only
	// failures outside that window count.
	if late.Failed > 0 || news.Failed > news.Total/100 {
		t.Errorf("%d new connections failed (%d more than a second after b was in the route)", news.Failed, late.Failed)
	}
}

// TestSiteReturnDuringDeath: across sites, events of one site
// overlap those of the other. Site b is withdrawn and a holds the connections;
// one of a's edges dies and, 300 ms later, b returns to the route (the router
// rehashes twice: a's survivors' flows move to b too). Then, while the dead edge
// comes back (a node back from a reboot: no pins), b drains, planned (a hands
// b's connections back to b through tunnels). Every held connection on a
// surviving replica answers within 1 s of each overlap, those opened between
// them too, and no new connection fails outside the moments the router's route
// changes. (A drain that is not planned, b's backends failing, is a failure of
// b's own, TestSiteFailures: a is not told.)
func TestSiteReturnDuringDeath(t *testing.T) {
	s := startPeeredSites(t)
	ctx := context.Background()
	na, nb := len(s.A.Edges), len(s.B.Edges)
	if err := s.B.SetBackendReady(ctx, false); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, s.HopsAre(na, 0)); err != nil {
		t.Fatalf("site b not withdrawn: %v", err)
	}
	held, err := s.OpenKeepConns(ctx, "echo.lab", 64)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	victim := s.A.Edges[0]
	stream := s.StartStream(ctx, "echo.lab", traffic.StreamOptions{For: 2 * time.Minute})
	defer func() { stream.Stop() }() // the stream then running, also on failure
	time.Sleep(500 * time.Millisecond)

	fault := time.Now()
	if err := s.A.KillEdge(victim); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	back := time.Now()
	if err := s.B.SetBackendReady(ctx, true); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, s.HopsAre(na-1, nb)); err != nil {
		t.Fatalf("after %s's death and b's return: %v", victim.Name, err)
	}
	settled := time.Now()
	survivors := lab.OnSurvivors(held, victim)
	moved := s.sentTo(t, survivors, "b")
	kept, failed := lab.AnswerWithin(survivors, "/after-return", time.Second)
	t.Logf("%s dead, b back %v later; route settled %v after the death; the router sends %d of %d held connections on survivors to b; %d of %d answered within 1 s",
		victim.Name, back.Sub(fault).Round(time.Millisecond), settled.Sub(fault).Round(time.Millisecond), moved, len(survivors), kept, len(survivors))
	if moved == 0 || len(survivors) == len(held) {
		t.Errorf("%d held connections moved to b, %d of %d on the dead edge: the lab shows less than it says", moved, len(held)-len(survivors), len(held))
	}
	if kept != len(survivors) {
		t.Errorf("%d of %d held connections on survivors broke: %v", len(survivors)-kept, len(survivors), failed)
	}
	during, err := s.OpenKeepConns(ctx, "echo.lab", 32)
	if err != nil {
		t.Fatal(err)
	}
	defer during.Close()

	// The dead edge comes back (joins) while b drains, planned: a is told,
	// and b's drain begins at the next whole second but one.
	rejoin := time.Now()
	if err := s.A.ReviveEdge(victim); err != nil {
		t.Fatal(err)
	}
	from := time.Now().Add(2 * time.Second).Truncate(time.Second)
	if err := s.WriteSites(s.A, SiteFile{Peers: true, PeerDraining: true}); err != nil {
		t.Fatal(err)
	}
	if err := s.WriteSites(s.B, SiteFile{Peers: true, Draining: true, DrainFrom: from}); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(ctx, 60*time.Second, 100*time.Millisecond, s.HopsAre(na, 0)); err != nil {
		t.Fatalf("after %s's return and b's drain: %v", victim.Name, err)
	}
	settled2 := time.Now()
	all := append(slices.Clone(survivors), during...)
	k2, f2, broke := lab.AnswerEach(all, "/after-rejoin", time.Second)
	if len(broke) > 0 {
		t.Logf("where the broken connections went:\n%s", s.whereFlows(t, broke))
	}
	time.Sleep(2 * time.Second)
	atts := stream.Stop()
	// New connections: failures only while the route changes (a dead next hop
	// until BFD drops it; a handshake split over two route changes).
	var calm []traffic.Attempt
	for _, a := range traffic.Hard(atts) {
		if (a.Start.After(settled.Add(time.Second)) && a.Start.Before(rejoin)) || a.Start.After(settled2.Add(time.Second)) {
			calm = append(calm, a)
		}
	}
	cf := traffic.FailuresAround(calm, fault)
	t.Logf("%s back and b drained: route settled %v after the return; %d of %d held connections (%d opened between the overlaps) answered within 1 s; new connections: %v; once each route settled (+1 s): %v",
		victim.Name, settled2.Sub(rejoin).Round(time.Millisecond), k2, len(all), len(during), traffic.FailuresAround(atts, fault), cf)
	if k2 != len(all) {
		t.Errorf("%d of %d held connections broke: %v", len(all)-k2, len(all), f2)
	}
	if cf.Failed > 0 {
		t.Errorf("%d new connections failed once the route had settled", cf.Failed)
	}
}

// whereFlows says, for connections that broke, where the router sends each and
// what every edge of both sites pinned for it, and every edge's reason
// counters: what a failure's report needs.
func (s *Sites) whereFlows(t *testing.T, broke traffic.KeepConns) string {
	var b strings.Builder
	for _, k := range broke {
		a, err := s.Router.Choose(k.LocalPort())
		fmt.Fprintf(&b, "port %d (held by %s): router -> %v %v\n  a: %s\n  b: %s\n", k.LocalPort(), k.Edge, a, err,
			s.A.FlowsFrom(k.LocalPort()), s.B.FlowsFrom(k.LocalPort()))
	}
	for _, l := range []*lab.Lab{s.A, s.B} {
		for i, e := range l.Edges {
			in, err := dataplane.OpenPinned(l.Agent(i).PinPath)
			if err != nil {
				fmt.Fprintf(&b, "%s: %v\n", e.Name, err)
				continue
			}
			c, err := in.Counters()
			in.Close()
			if err != nil {
				fmt.Fprintf(&b, "%s: %v\n", e.Name, err)
				continue
			}
			fmt.Fprintf(&b, "%s:", e.Name)
			for r, n := range c.Reasons {
				if n > 0 {
					fmt.Fprintf(&b, " %s=%d", dataplane.ReasonName(dataplane.Reason(r)), n)
				}
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}
