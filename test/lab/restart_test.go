package lab

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/portico-edge/portico/test/netlab"
)

// TestAgentRestartUnderLoad: the owner's agent dies (kill -9) and starts again
// while clients keep sending requests: the pinned XDP program keeps forwarding,
// nginx keeps serving, and no request fails.
func TestAgentRestartUnderLoad(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	owner, err := l.Owner()
	if err != nil {
		t.Fatal(err)
	}
	idx := owner.Index - 11
	load := l.StartLoad(ctx, "echo.lab", 4)
	time.Sleep(time.Second)
	if err := l.Agent(idx).Kill(syscall.SIGKILL, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	a, err := l.StartAgent(idx)
	if err != nil {
		t.Fatal(err)
	}
	// Wait until the restarted agent is ready again.
	if err := waitFor(30*time.Second, func() error { return l.Ready(idx) }); err != nil {
		t.Fatalf("restarted agent not ready: %v\n%s", err, a.Log())
	}
	time.Sleep(time.Second)
	ok, failed, first := load.Stop()
	t.Logf("%d requests succeeded, %d failed across the restart", ok, failed)
	if failed != 0 {
		t.Errorf("%d requests failed (first: %v)", failed, first)
	}
	if ok < 100 {
		t.Errorf("only %d requests ran", ok)
	}
}

// TestGracefulShutdown: as Kubernetes stops a pod, the owner's endpoint turns
// terminating and its agent gets SIGTERM. The agent releases the VIP with
// priority 0, so another edge takes over after its skew time rather than the
// master-down interval, and nginx drains: under a bounded load no request fails.
func TestGracefulShutdown(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	owner, err := l.Owner()
	if err != nil {
		t.Fatal(err)
	}
	idx := owner.Index - 11
	load := l.StartLoad(ctx, "echo.lab", 4)
	time.Sleep(time.Second)
	if err := l.SetGroupEndpoints(ctx, map[int]string{owner.Index: "terminating"}); err != nil {
		t.Fatal(err)
	}
	// The other edges must see the owner draining before it goes.
	if err := waitFor(10*time.Second, func() error {
		for _, e := range l.Edges {
			if e == owner {
				continue
			}
			bs, err := l.ownerBackends(e)
			if err != nil {
				return err
			}
			if !bs[owner.Addr.Addr().String()].Draining {
				return fmt.Errorf("%s does not see %s draining yet", e.Name, owner.Name)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := l.Agent(idx).Kill(syscall.SIGTERM, 40*time.Second); err != nil {
		t.Fatal(err)
	}
	exited := time.Since(start)
	var newOwner *Node
	if err := waitFor(5*time.Second, func() error {
		n, err := l.newOwner(owner)
		newOwner = n
		return err
	}); err != nil {
		t.Fatalf("no new owner after the graceful stop: %v", err)
	}
	time.Sleep(time.Second)
	ok, failed, first := load.Stop()
	t.Logf("agent on %s exited %v after SIGTERM; %s owns the VIP; %d requests ok, %d failed",
		owner.Name, exited.Round(time.Millisecond), newOwner.Name, ok, failed)
	if failed != 0 {
		t.Errorf("%d requests failed (first: %v)", failed, first)
	}
	// The released VIP was taken over without waiting for the master-down
	// interval: the old owner no longer holds it on eth0.
	out, err := netlab.Exec(owner.NS, "ip", "-4", "-o", "addr", "show", "dev", "eth0")
	if err != nil {
		t.Fatal(err)
	}
	if containsAddr(out, VIP) {
		t.Errorf("%s still holds the VIP after a graceful stop", owner.Name)
	}
}
