package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/internal/testenv"
	"github.com/portico-edge/portico/test/frr"
	"github.com/portico-edge/portico/test/kapi"
	"github.com/portico-edge/portico/test/traffic"
)

// startSites starts the two-site lab and brings it up; the agents' logs are
// printed if the test fails, and the lab is closed when it ends.
func startSites(t *testing.T) *Sites {
	t.Helper()
	testenv.RequireRoot(t, "network namespaces, XDP, FRR")
	kapi.Require(t)
	if _, err := os.Stat(filepath.Join(frr.Dir, "bgpd")); err != nil {
		testenv.Unavailable(t, "FRR is not installed (%v); test/setup/deps.sh installs it", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := StartSites(ctx, SitesOptions{Portico: porticoBin, BFD: 50 * time.Millisecond, T: t})
	if err != nil {
		t.Fatalf("start sites: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(s.logs())
		}
		if err := s.Close(); err != nil {
			t.Errorf("close sites: %v", err)
		}
	})
	if err := s.Up(ctx, 2*time.Minute); err != nil {
		t.Fatalf("sites up: %v", err)
	}
	return s
}

// TestSiteReturn (issue 13, test 4): site b, withdrawn (its federated Ingress had
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
		want := 0
		if handover {
			want = len(s.A.Edges)
		}
		for _, l := range []*Lab{s.A, s.B} {
			if err := s.SetPeers(l, handover); err != nil {
				t.Fatal(err)
			}
		}
		if err := waitFor(30*time.Second, func() error {
			for _, l := range []*Lab{s.A, s.B} {
				n, err := s.Remotes(l)
				if err != nil {
					return err
				}
				for _, r := range n {
					if r != want {
						return fmt.Errorf("site %s's edges hold %v remote edges, want %d each", l.name, n, want)
					}
				}
			}
			return nil
		}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}

		// b goes away: its Ingress has no ready backend.
		if err := s.B.SetBackendReady(ctx, false); err != nil {
			t.Fatal(err)
		}
		if err := waitFor(30*time.Second, func() error {
			p, err := s.Paths()
			if err != nil {
				return err
			}
			if p["b"] != 0 || p["a"] != len(s.A.Edges) {
				return fmt.Errorf("the router's paths to the VIP by site: %v, want a's only", p)
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
		err = waitFor(30*time.Second, func() error {
			h, err := s.Hops()
			if err != nil {
				return err
			}
			if h["a"] != len(s.A.Edges) || h["b"] != len(s.B.Edges) {
				return fmt.Errorf("the router's next hops by site: %v", h)
			}
			return nil
		})
		announced := time.Since(back)
		if err != nil {
			stream.Stop()
			t.Fatalf("%s: site b not back in the route: %v", name, err)
		}
		time.Sleep(2 * time.Second)
		atts := stream.Stop()
		moved := 0
		for _, k := range held {
			a, err := s.Router.Choose(k.LocalPort())
			if err != nil {
				t.Fatal(err)
			}
			if s.SiteOf(a.String()) == "b" {
				moved++
			}
		}
		kept, total, failed := checkKeepConns(held, "/after-return")
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
		if news.Failed > 0 {
			t.Errorf("%s: %d new connections failed as b came back", name, news.Failed)
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
