package sites

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

// TestSiteFailures, with new connections coming all
// along:
//   - site b's federated Ingress has no ready backend: b's edges de-prefer the
//     VIP at once and withdraw it withdrawAfter (3 s in the lab) later; no new
//     connection fails once the router has left b; b comes back when a backend
//     is ready again (after 3 s of it);
//   - fail-static: b's API server stops: nothing in the routing changes and no
//     connection fails;
//   - site a's edges die (agents killed, links cut): BFD takes them out of the
//     router's route in under a second, and no new connection fails after that.
func TestSiteFailures(t *testing.T) {
	s := startSites(t)
	ctx := context.Background()
	hops := func() map[string]int {
		h, err := s.Hops()
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	na, nb := len(s.A.Edges), len(s.B.Edges)

	// b's backends go not ready.
	stream := s.StartStream(ctx, "echo.lab", traffic.StreamOptions{For: time.Minute})
	time.Sleep(500 * time.Millisecond)
	fault := time.Now()
	if err := s.B.SetBackendReady(ctx, false); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(ctx, 10*time.Second, 100*time.Millisecond, s.HopsAre(na, 0)); err != nil {
		t.Fatal(err)
	}
	deprefered := time.Since(fault)
	if _, err := testenv.Poll(ctx, 20*time.Second, 100*time.Millisecond, func() error {
		p, err := s.Paths()
		if err != nil {
			return err
		}
		if p["b"] != 0 {
			return fmt.Errorf("b still has %d paths at the router", p["b"])
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	withdrawn := time.Since(fault)
	time.Sleep(time.Second)
	atts := stream.Stop()
	late := traffic.FailuresAround(atts, fault.Add(deprefered+300*time.Millisecond))
	t.Logf("b's backends not ready: out of the router's route (de-preferenced) after %v, withdrawn after %v; new connections: %v, after the route left b (+300 ms): %v",
		deprefered.Round(time.Millisecond), withdrawn.Round(time.Millisecond), traffic.FailuresAround(atts, fault), late)
	if late.Failed > 0 {
		t.Errorf("%d new connections failed after the router left b", late.Failed)
	}
	back := time.Now()
	if err := s.B.SetBackendReady(ctx, true); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(ctx, 20*time.Second, 100*time.Millisecond, s.HopsAre(na, nb)); err != nil {
		t.Fatal(err)
	}
	t.Logf("b's backends ready again: b back in the route after %v", time.Since(back).Round(time.Millisecond))

	// Fail-static: b's API server stops.
	stream = s.StartStream(ctx, "echo.lab", traffic.StreamOptions{For: time.Minute})
	stop := time.Now()
	if err := s.B.API.Stop(); err != nil {
		t.Fatal(err)
	}
	changes := 0
	for time.Since(stop) < 10*time.Second {
		if err := s.HopsAre(na, nb)(); err != nil {
			changes++
			t.Errorf("b's API server stopped %v ago: %v", time.Since(stop).Round(time.Millisecond), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	atts = stream.Stop()
	f := traffic.FailuresAround(atts, stop)
	t.Logf("b's API server stopped: %d changes of the router's route in 10 s; new connections: %v", changes, f)
	if f.Failed > 0 {
		t.Errorf("%d new connections failed while b's API server was down", f.Failed)
	}

	// a's edges die.
	if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error { return s.Router.Announced(na + nb) }); err != nil {
		t.Fatal(err)
	}
	stream = s.StartStream(ctx, "echo.lab", traffic.StreamOptions{For: time.Minute})
	time.Sleep(500 * time.Millisecond)
	fault = time.Now()
	for _, e := range s.A.Edges {
		if err := s.A.KillEdge(e); err != nil {
			t.Fatal(err)
		}
	}
	var gone time.Duration
	for {
		if h := hops(); h["a"] == 0 && h["b"] == nb {
			gone = time.Since(fault)
			break
		}
		if time.Since(fault) > 10*time.Second {
			t.Fatalf("a's edges still in the route 10 s after they died: %v", hops())
		}
		time.Sleep(2 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	atts = stream.Stop()
	late = traffic.FailuresAround(traffic.Hard(atts), fault.Add(gone+300*time.Millisecond))
	t.Logf("a's edges died: their next hops left the router's route after %v (BFD 50 ms x 5); new connections: %v, after that (+300 ms): %v",
		gone.Round(time.Millisecond), traffic.FailuresAround(atts, fault), late)
	if gone > time.Second {
		t.Errorf("a's next hops left the route after %v, want under 1 s", gone)
	}
	if late.Failed > 0 {
		t.Errorf("%d new connections failed after a left the route", late.Failed)
	}
}
