package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/portico-edge/portico/test/traffic"
)

// nonOwner is an edge of p that does not own the group's VIP now.
func nonOwner(t *testing.T, p *Portico) *Node {
	t.Helper()
	owner, err := p.Owner(GroupVIP)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range p.Edges {
		if n != owner {
			return n
		}
	}
	t.Fatalf("no edge but the VIP's owner %s", owner.Name)
	return nil
}

// waitServed waits until 30 new connections in a row to host+path are answered
// and reach every edge in edges.
func waitServed(t *testing.T, p *Portico, host, path string, edges []*Node) {
	t.Helper()
	if err := p.ServedEverywhere(context.Background(), host, path, edges, time.Minute); err != nil {
		t.Fatalf("%s%s not served through every edge: %v", host, path, err)
	}
}

// slowAnswer is how long a request of the drain and rolling-update streams may
// take before it counts as failed: what a client with a short timeout tolerates,
// above a loaded machine's latency. A misrouted packet fails anyway (a reset, or
// a connection that is never made); the failover tests, which measure outages,
// use 500 ms.
const slowAnswer = 2 * time.Second

// openHeld opens the HTTP and idle TCP connections of OpenHeld, closed when
// the test ends.
func openHeld(t *testing.T, p *Portico, http, idle int) Held {
	t.Helper()
	if err := p.WaitConfigQuiet(context.Background(), 3*time.Second, time.Minute); err != nil {
		t.Fatal(err)
	}
	held, err := p.OpenHeld(context.Background(), http, idle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(held.Close)
	return held
}

// checkHeld fails the test unless every held connection on a surviving replica
// answers within timeout (asked at once), and logs what it found.
func checkHeld(t *testing.T, ctx context.Context, p *Portico, what string, held Held, timeout time.Duration, excluded ...*Node) HeldCheck {
	t.Helper()
	c := p.Check(ctx, held, timeout, excluded...)
	t.Logf("held connections %s: %v", what, c)
	if c.Kept != c.Total || len(c.Failed) > 0 {
		t.Errorf("held connections %s: %v, want all to answer within %v; failed: %s", what, c, timeout, strings.Join(c.Failed, "; "))
		t.Logf("where they go:\n%s", p.Diagnose(ctx, c.FailedConns))
	}
	return c
}

// failures logs and returns the stream's failed attempts (at or after from),
// with the captured frames of the first few.
func failures(t *testing.T, p *Portico, atts []traffic.Attempt, from time.Time) traffic.Failures {
	t.Helper()
	f := traffic.FailuresAround(atts, from)
	t.Logf("new connections: %v", f)
	if f.Failed == 0 || p.Traffic == nil {
		return f
	}
	t.Log(p.MACs(context.Background()))
	shown := 0
	for _, a := range atts {
		if a.Err == nil || a.SPort == 0 || a.Start.Before(from) {
			continue
		}
		if shown++; shown > diagnosed {
			break
		}
		t.Logf("frames of the failed connection from port %d on the bridge (epoch seconds, MACs first):\n%s", a.SPort, p.Traffic.Show(fmt.Sprintf("tcp port %d", a.SPort), 80))
	}
	return f
}
