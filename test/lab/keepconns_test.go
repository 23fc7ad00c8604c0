package lab

import (
	"context"
	"fmt"

	"testing"
	"time"

	"github.com/portico-edge/portico/test/testenv"
)

// TestDirectorFailover: with 200+ long-lived connections open through the VIP,
// the owner's agent is killed (-9) and its link cut. Another edge takes the VIP
// within the VRRP bound, and the connections held by the surviving replicas keep
// working: the new owner's identical Maglev table sends each one where it was.
func TestDirectorFailover(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	owner := vipOwner(t, l)
	conns, err := l.OpenKeepConns(ctx, "echo.lab", 240)
	if err != nil {
		t.Fatal(err)
	}
	defer conns.Close()
	ownerIP := owner.Addr.Addr().String()
	byEdge := map[string]int{}
	for _, k := range conns {
		byEdge[k.Edge]++
	}
	t.Logf("owner %s; connections per edge: %v", owner.Name, byEdge)

	newOwner, takeover := l.killOwner(t, owner)
	// Master down interval at 100 ms adverts: 3 × 100 ms + skew (< 100 ms).
	if takeover > 2*time.Second {
		t.Errorf("takeover took %v", takeover)
	}

	survived, OnSurvivors := 0, 0
	for _, k := range conns {
		if k.Edge == ownerIP {
			continue
		}
		OnSurvivors++
		if _, err := k.Do("echo.lab", "/after", 3*time.Second); err == nil {
			survived++
		} else {
			t.Logf("connection via %s: %v", k.Edge, err)
		}
	}
	t.Logf("new owner %s after %v; %d of %d connections on surviving replicas kept working", newOwner.Name, takeover.Round(time.Millisecond), survived, OnSurvivors)
	if OnSurvivors < 100 {
		t.Fatalf("only %d connections on surviving replicas", OnSurvivors)
	}
	if float64(survived) < 0.99*float64(OnSurvivors) {
		t.Errorf("%d of %d connections survived, want >= 99%%", survived, OnSurvivors)
	}
}

// TestReplicaDrain: a replica marked terminating finishes its connections and
// gets no new ones; once removed, no connection to the others breaks.
func TestReplicaDrain(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	owner := vipOwner(t, l)
	conns, err := l.OpenKeepConns(ctx, "echo.lab", 90)
	if err != nil {
		t.Fatal(err)
	}
	defer conns.Close()
	// Drain an edge that is not the owner.
	var drained *Node
	for _, e := range l.Edges {
		if e != owner {
			drained = e
			break
		}
	}
	dIP := drained.Addr.Addr().String()
	if err := l.SetGroupEndpoints(ctx, map[*Node]string{drained: "terminating"}); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(ctx, 10*time.Second, 100*time.Millisecond, func() error {
		bs, err := l.ownerBackends(owner)
		if err != nil {
			return err
		}
		// Apply writes the backend entry before it swaps the ring: wait for both.
		if !bs[dIP].Draining || bs[dIP].Slots != 0 {
			return fmt.Errorf("%s not draining, or still holding ring slots, in the owner's maps: %+v", dIP, bs[dIP])
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	c := l.HTTPClient(false, 2*time.Second)
	for range 300 {
		r, err := l.Get(ctx, c, "echo.lab", "/new")
		if err != nil {
			t.Fatal(err)
		}
		if r.Edge == dIP {
			t.Fatalf("a new connection reached the draining replica %s", drained.Name)
		}
	}
	onDrained := 0
	for _, k := range conns {
		if _, err := k.Do("echo.lab", "/during-drain", 3*time.Second); err != nil {
			t.Errorf("connection via %s broke while %s drained: %v", k.Edge, drained.Name, err)
		}
		if k.Edge == dIP {
			onDrained++
		}
	}
	if onDrained == 0 {
		t.Fatal("no connection was on the drained replica: the test proves nothing")
	}

	// Removed: connections to the other replicas keep working.
	if err := l.SetGroupEndpoints(ctx, map[*Node]string{drained: "gone"}); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(ctx, 10*time.Second, 100*time.Millisecond, func() error {
		bs, err := l.ownerBackends(owner)
		if err != nil {
			return err
		}
		if _, ok := bs[dIP]; ok {
			return fmt.Errorf("%s still in the owner's maps", dIP)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	others := 0
	for _, k := range conns {
		if k.Edge == dIP {
			continue
		}
		others++
		if _, err := k.Do("echo.lab", "/after-removal", 3*time.Second); err != nil {
			t.Errorf("connection via %s broke after %s was removed: %v", k.Edge, drained.Name, err)
		}
	}
	t.Logf("%d connections on the drained replica completed; %d on the others kept working after its removal", onDrained, others)
}
