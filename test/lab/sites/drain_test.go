package sites

import (
	"context"
	"testing"
	"time"

	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/test/lab"
	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

// TestSiteDrain: a planned drain of site b while clients hold
// connections to both sites and new ones keep coming. b's file says it drains
// from a moment on; b's edges then de-prefer the VIP and the router takes every
// flow to a. Run twice: first a is not told (the baseline: b's connections reach
// a's edges, which have none of them), then a is told, and hands b's
// connections back to b's edges through tunnels: none is reset, and no new
// connection fails. Each round ends the drain: b comes back, with a hand-over of
// its own for the connections opened at a meanwhile.
func TestSiteDrain(t *testing.T) {
	s := startPeeredSites(t)
	ctx := context.Background()
	for _, told := range []bool{false, true} {
		name := "baseline, a not told that b drains"
		if told {
			name = "planned drain"
		}
		if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, s.HopsAre(len(s.A.Edges), len(s.B.Edges))); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		held, err := s.OpenKeepConns(ctx, "echo.lab", 64)
		if err != nil {
			t.Fatal(err)
		}
		onB := 0
		for _, k := range held {
			if s.SiteOf(k.Edge) == "b" {
				onB++
			}
		}
		if onB == 0 {
			t.Fatalf("%s: none of 64 connections is held by b", name)
		}
		out0, _ := s.Reasons(s.A, dataplane.ReasonSiteOut)
		in0, _ := s.Reasons(s.B, dataplane.ReasonSiteIn)
		stream := s.StartStream(ctx, "echo.lab", traffic.StreamOptions{For: time.Minute})
		// drainFrom is written to the second.
		from := time.Now().Add(2 * time.Second).Truncate(time.Second)
		if err := s.WriteSites(s.A, SiteFile{Peers: true, PeerDraining: told}); err != nil {
			t.Fatal(err)
		}
		if err := s.WriteSites(s.B, SiteFile{Peers: true, Draining: true, DrainFrom: from}); err != nil {
			t.Fatal(err)
		}
		_, err = testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, s.HopsAre(len(s.A.Edges), 0))
		gone := time.Since(from)
		if err != nil {
			stream.Stop()
			t.Fatalf("%s: b still in the route: %v", name, err)
		}
		time.Sleep(2 * time.Second)
		kept, total, failed := lab.CheckKeepConns(held, "/during-drain")
		atts := stream.Stop()
		news := traffic.FailuresAround(atts, from)
		out1, _ := s.Reasons(s.A, dataplane.ReasonSiteOut)
		in1, _ := s.Reasons(s.B, dataplane.ReasonSiteIn)
		t.Logf("%s: b left the route %v after its drain began; %d/%d held kept (%d of them held by b; %d reset); new connections: %v; packets a sent to b through the tunnel: %d, b took out: %d",
			name, gone.Round(time.Millisecond), kept, total, onB, total-kept, news, out1-out0, in1-in0)
		if told {
			if kept != total {
				t.Errorf("planned drain: %d of %d held connections broke: %v", total-kept, total, failed)
			}
			if news.Failed > 0 {
				t.Errorf("planned drain: %d new connections failed", news.Failed)
			}
			if out1 == out0 || in1 == in0 {
				t.Errorf("planned drain: no packet went through the tunnel (%d out of a, %d into b)", out1-out0, in1-in0)
			}
		} else if kept == total {
			t.Errorf("baseline: all %d held connections kept though b, holding %d, left the route: the lab does not show the problem", total, onB)
		}

		// The drain ends: b comes back while the connections opened at a
		// meanwhile are held, and the older ones too.
		during, err := s.OpenKeepConns(ctx, "echo.lab", 32)
		if err != nil {
			t.Fatal(err)
		}
		stream = s.StartStream(ctx, "echo.lab", traffic.StreamOptions{For: time.Minute})
		back := time.Now()
		for _, l := range []*lab.Lab{s.A, s.B} {
			if err := s.SetPeers(l, true); err != nil {
				t.Fatal(err)
			}
		}
		_, err = testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, s.HopsAre(len(s.A.Edges), len(s.B.Edges)))
		returned := time.Since(back)
		if err != nil {
			stream.Stop()
			t.Fatalf("%s: b not back: %v", name, err)
		}
		time.Sleep(2 * time.Second)
		atts = stream.Stop()
		k2, t2, f2 := lab.CheckKeepConns(during, "/after-drain")
		news = traffic.FailuresAround(atts, back)
		t.Logf("%s: drain over, b back in the route after %v; %d/%d connections opened during the drain kept; new connections: %v", name, returned.Round(time.Millisecond), k2, t2, news)
		if k2 != t2 {
			t.Errorf("%s: b's return broke %d of %d connections opened during the drain (%v)", name, t2-k2, t2, f2)
		}
		if late, ok := joinFailures(atts, news, back, returned); !ok {
			t.Errorf("%s: %d new connections failed as b came back (%d more than a second after it was in the route)", name, news.Failed, late.Failed)
		}
		held.Close()
		during.Close()
	}
}
