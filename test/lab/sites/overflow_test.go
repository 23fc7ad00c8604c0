package sites

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/portico-edge/portico/api/sites"
	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

// TestSiteOverflow: site b declares a capacity (10 new
// connections a second per edge) and overflows to a, at most half of its new
// connections. About 80 new connections a second come in, a quarter through each
// of the four edges, so each of b's edges gets about twice its capacity: it
// spills half of its new connections to a's edges through tunnels, which serve
// them. Connections held at b since before stay where they are, a's own new
// connections stay at a, no BGP update is sent, and none fails. When the load
// falls below the capacity, b keeps its new connections again.
// spillDownLab is how long after the load falls the test waits for b's edges to
// stop spilling: the agent's hold-down (2 s) and its measuring window (1 s), and
// a second.
const spillDownLab = 4 * time.Second

func TestSiteOverflow(t *testing.T) {
	s := startSites(t)
	ctx := context.Background()
	if err := s.SetPeers(s.A, true); err != nil {
		t.Fatal(err)
	}
	overflow := &sites.Overflow{CapacityPerEdge: 10, To: "a", Limit: 0.5}
	// The tunnels' frames (IPIP, IPv6 in IPv6) and every TCP frame on the
	// shared network: a packet b spills when it should not is shown.
	capture, err := s.shared.Net.StartCaptureOf(t.TempDir(), "tcp or ip proto 4 or ip6 proto 41")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(capture.Stop)
	if err := s.WriteSites(s.B, SiteFile{Peers: true, Overflow: overflow}); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitRemotes(30*time.Second, true); err != nil {
		t.Fatal(err)
	}
	held, err := s.OpenKeepConns(ctx, "echo.lab", 32)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	updates0, err := s.UpdatesReceived()
	if err != nil {
		t.Fatal(err)
	}
	hops0, err := s.Router.Nexthops()
	if err != nil {
		t.Fatal(err)
	}

	// A phase of load: new connections at one every `every` for d. What the
	// router sent b's edges is what they directed (they never get spilled
	// ones: a does not spill); what stayed at b is what b's replicas answered.
	type phase struct {
		atts           []traffic.Attempt
		failed, fromB  int
		servedB        int
		outB, inA, inB uint64
		spilled        float64
		firstSpill     time.Duration // from the load's start to b's first tunnel packet (-1: none in the ramp)
		maxRatio       float64       // the highest spill ratio of b's edges after the ramp
	}
	counter := func(f func() (uint64, error)) uint64 {
		t.Helper()
		n, err := f()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	load := func(every, d, ramp time.Duration) phase {
		t.Helper()
		spill0 := counter(func() (uint64, error) { return s.Reasons(s.B, dataplane.ReasonSiteOut) })
		start := time.Now()
		stream := s.StartStream(ctx, "echo.lab", traffic.StreamOptions{Every: every, Timeout: time.Second, For: d})
		ph := phase{firstSpill: -1}
		for time.Since(start) < ramp {
			if ph.firstSpill < 0 && counter(func() (uint64, error) { return s.Reasons(s.B, dataplane.ReasonSiteOut) }) > spill0 {
				ph.firstSpill = time.Since(start)
			}
			time.Sleep(20 * time.Millisecond)
		}
		b0 := counter(func() (uint64, error) { return s.NewFlows(s.B) })
		out0 := counter(func() (uint64, error) { return s.Reasons(s.B, dataplane.ReasonSiteOut) })
		inA0 := counter(func() (uint64, error) { return s.Reasons(s.A, dataplane.ReasonSiteIn) })
		inB0 := counter(func() (uint64, error) { return s.Reasons(s.B, dataplane.ReasonSiteIn) })
		measured := time.Now()
		for time.Since(start) < d {
			for i := range s.B.Edges {
				if r, err := s.B.Metric(i, "portico_site_spill_ratio"); err == nil {
					ph.maxRatio = max(ph.maxRatio, r)
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		ph.atts = stream.Stop()
		ph.fromB = int(counter(func() (uint64, error) { return s.NewFlows(s.B) }) - b0)
		ph.outB = counter(func() (uint64, error) { return s.Reasons(s.B, dataplane.ReasonSiteOut) }) - out0
		ph.inA = counter(func() (uint64, error) { return s.Reasons(s.A, dataplane.ReasonSiteIn) }) - inA0
		ph.inB = counter(func() (uint64, error) { return s.Reasons(s.B, dataplane.ReasonSiteIn) }) - inB0
		for _, a := range ph.atts {
			switch {
			case a.Err != nil:
				ph.failed++
			case !a.Start.Before(measured) && s.SiteOf(a.Edge) == "b":
				ph.servedB++
			}
		}
		ph.spilled = 1 - float64(ph.servedB)/float64(max(ph.fromB, 1))
		return ph
	}
	// The edges measure over a second and go up a step at a time: the first
	// 2 s are the ramp.
	ph := load(12*time.Millisecond, 8*time.Second, 2*time.Second)
	updates1, err := s.UpdatesReceived()
	if err != nil {
		t.Fatal(err)
	}
	hops1, err := s.Router.Nexthops()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("b's first spilled packet %v after the load began", ph.firstSpill.Round(time.Millisecond))
	t.Logf("%d new connections in 8 s (%d failed); after the first 2 s, the router sent b's edges %d, b's replicas served %d: b spilled %.0f%% (limit %.0f%%); tunnel packets out of b %d, into a %d, into b %d; BGP updates received during the load: %d",
		len(ph.atts), ph.failed, ph.fromB, ph.servedB, 100*ph.spilled, 100*overflow.Limit, ph.outB, ph.inA, ph.inB, updates1-updates0)
	if ph.failed > 0 {
		t.Errorf("%d new connections failed", ph.failed)
	}
	if ph.spilled < 0.35 || ph.spilled > 0.6 {
		t.Errorf("b spilled %.0f%% of its new connections, want about %.0f%%", 100*ph.spilled, 100*overflow.Limit)
	}
	if ph.inB > 0 {
		t.Errorf("a sent %d packets to b: a is below its capacity (it has none)", ph.inB)
	}
	if updates1 != updates0 || !slices.Equal(hops0, hops1) {
		t.Errorf("routing changed: %d BGP updates, next hops %v -> %v", updates1-updates0, hops0, hops1)
	}
	for _, k := range held {
		r, err := k.Do("echo.lab", "/after-overflow", 3*time.Second)
		if err != nil || r.Edge != k.Edge {
			t.Errorf("a connection held by %s before the overflow: %v, answered by %q", k.Edge, err, r.Edge)
		}
	}

	// The load falls: b keeps its new connections again, once its edges'
	// agents measured it (at least spillDownLab; longer on a loaded machine).
	fell := time.Now()
	time.Sleep(spillDownLab)
	if _, err := testenv.Poll(ctx, 20*time.Second, 100*time.Millisecond, func() error {
		for i, e := range s.B.Edges {
			r, err := s.B.Metric(i, "portico_site_spill_ratio")
			if err != nil {
				return err
			}
			if r != 0 {
				return fmt.Errorf("%s still spills %.0f%%", e.Name, 100*r)
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("the load fell %v ago: %v", time.Since(fell).Round(time.Millisecond), err)
	}
	t.Logf("b's edges stopped spilling %v after the load fell", time.Since(fell).Round(100*time.Millisecond))
	// The low load is 10 new connections a second, a quarter of the capacity:
	// an edge raises its ratio at once when one window of about a second saw
	// more than 10 SYNs (retransmissions count). At 20 a second a b edge gets
	// about 5.5 a window, more than 10 in about 2.5 % of windows: the likely
	// cause of CI's failure in stop 38 (b spilled one connection, 6 tunnel
	// packets), not reproduced in 5 runs; maxRatio tells next time.
	low := time.Now()
	ph = load(100*time.Millisecond, 4*time.Second, time.Second)
	// Exactly: no packet leaves b through a tunnel (the SYNs b's edges count
	// include retransmissions, so served vs. directed is only an estimate).
	t.Logf("low load (10 a second): the router sent b's edges %d SYNs, b's replicas served %d connections, b sent %d packets through the tunnel (%d failed); b's edges' spill ratio at most %.2f",
		ph.fromB, ph.servedB, ph.outB, ph.failed, ph.maxRatio)
	if ph.outB > 0 || ph.failed > 0 {
		t.Errorf("below capacity, b still sent %d packets to a; %d new connections failed", ph.outB, ph.failed)
		tunnel := capture.ShowBetween("ip proto 4 or ip6 proto 41", low, time.Now(), 40)
		t.Logf("the tunnels' frames of the low load (Unix seconds, as the agents' logs; MACs first):\n%s", tunnel)
		if m := regexp.MustCompile(`\.(\d+) > [0-9a-f.:]+\.80: `).FindStringSubmatch(tunnel); m != nil {
			t.Logf("every frame of the first of them on the network:\n%s", capture.Show("tcp port "+m[1], 60))
		}
	}
}

// TestSiteLocality: two regions, each with its router
// and clients: a and b behind one, c behind the other, the routers peering. Each
// region's client reaches its own region's sites (the routers prefer the shorter
// AS path). The link between the regions goes down for 5 s: nothing fails over.
// Then c's backends go not ready: c de-prefers the VIP, and its region's client
// goes to a and b (through both routers) until c is back.
func TestSiteLocality(t *testing.T) {
	s := startSitesWith(t, SitesOptions{Third: true})
	ctx := context.Background()
	served := func(tg traffic.Target, n int) (map[string]int, int) {
		t.Helper()
		c := tg.HTTPClient(false, time.Second)
		by, failed := map[string]int{}, 0
		for range n {
			r, err := tg.Get(ctx, c, "echo.lab", "/where")
			if err != nil {
				failed++
				continue
			}
			by[s.SiteOf(r.Edge)]++
		}
		return by, failed
	}
	by1, f1 := served(s.Target, 100)
	by2, f2 := served(s.Client2, 100)
	t.Logf("region 1's client: served by site %v (%d failed); region 2's: %v (%d failed)", by1, f1, by2, f2)
	if f1+f2 > 0 || by1["c"] > 0 || by1["a"] == 0 || by1["b"] == 0 || by2["c"] != 100 {
		t.Errorf("locality: region 1 %v, region 2 %v, %d failed; want a and b, and c only", by1, by2, f1+f2)
	}

	// A partition between the regions: no site fails over.
	hops1, _ := s.Router.Nexthops()
	hops2, _ := s.Router2.Nexthops()
	st1 := s.StartStream(ctx, "echo.lab", traffic.StreamOptions{Every: 20 * time.Millisecond, For: time.Minute})
	st2 := s.Client2.StartStream(ctx, "echo.lab", traffic.StreamOptions{Every: 20 * time.Millisecond, For: time.Minute})
	cut := time.Now()
	if err := s.LinkRegions(false); err != nil {
		t.Fatal(err)
	}
	changes := 0
	for time.Since(cut) < 5*time.Second {
		h1, _ := s.Router.Nexthops()
		h2, _ := s.Router2.Nexthops()
		if !slices.Equal(h1, hops1) || !slices.Equal(h2, hops2) {
			changes++
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := s.LinkRegions(true); err != nil {
		t.Fatal(err)
	}
	a1, a2 := st1.Stop(), st2.Stop()
	p1, p2 := traffic.FailuresAround(a1, cut), traffic.FailuresAround(a2, cut)
	t.Logf("regions cut off from each other for 5 s: %d polls saw a router's route change; region 1: %v; region 2: %v", changes, p1, p2)
	if changes > 0 || p1.Failed+p2.Failed > 0 {
		t.Errorf("partition: %d route changes, %d and %d new connections failed", changes, p1.Failed, p2.Failed)
	}
	// The routers peer again before c fails (its region then needs the other).
	if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error {
		var peers map[string]struct {
			State string `json:"bgpState"`
		}
		if err := s.Router2.FRR.VtyJSON("show bgp neighbors "+rtLink.Addr().String()+" json", &peers); err != nil {
			return err
		}
		if st := peers[rtLink.Addr().String()].State; st != "Established" {
			return fmt.Errorf("rt2's session with rt: %q", st)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// c fails: its region's client goes to the other region's sites.
	st2 = s.Client2.StartStream(ctx, "echo.lab", traffic.StreamOptions{Every: 20 * time.Millisecond, For: time.Minute})
	time.Sleep(500 * time.Millisecond)
	fault := time.Now()
	if err := s.C.SetBackendReady(ctx, false); err != nil {
		st2.Stop()
		t.Fatal(err)
	}
	var moved time.Duration
	c2 := s.Client2.HTTPClient(false, time.Second)
	if _, err := testenv.Poll(ctx, 20*time.Second, 100*time.Millisecond, func() error {
		r, err := s.Client2.Get(ctx, c2, "echo.lab", "/moved")
		if err != nil {
			return err
		}
		if site := s.SiteOf(r.Edge); site == "c" {
			return fmt.Errorf("still served by c")
		}
		moved = time.Since(fault)
		return nil
	}); err != nil {
		st2.Stop()
		h2, _ := s.Router2.Nexthops()
		t.Fatalf("%v; rt2's next hops %v", err, h2)
	}
	time.Sleep(time.Second)
	by2, f2 = served(s.Client2, 60)
	a2 = st2.Stop()
	t.Logf("c's backends not ready: region 2's client served by the other region after %v; then by site %v (%d failed); new connections: %v, after (+300 ms): %v",
		moved.Round(time.Millisecond), by2, f2, traffic.FailuresAround(a2, fault), traffic.FailuresAround(a2, fault.Add(moved+300*time.Millisecond)))
	if by2["c"] > 0 || f2 > 0 || traffic.FailuresAround(a2, fault.Add(moved+300*time.Millisecond)).Failed > 0 {
		t.Errorf("c down: region 2 served by %v, %d failed", by2, f2)
	}

	// c is back: its region comes back to it.
	back := time.Now()
	if err := s.C.SetBackendReady(ctx, true); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(ctx, 20*time.Second, 100*time.Millisecond, func() error {
		by, _ := served(s.Client2, 20)
		if by["c"] != 20 {
			return fmt.Errorf("region 2 served by %v", by)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("c's backends ready again: region 2 back at c after %v", time.Since(back).Round(time.Millisecond))
}
