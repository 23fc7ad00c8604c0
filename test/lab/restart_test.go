package lab

import (
	"context"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
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
	stop := make(chan struct{})
	var ok, failed atomic.Int64
	var wg sync.WaitGroup
	var firstErr atomic.Value
	c := l.HTTPClient(false, 3*time.Second)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(60 * time.Second)
			for i := 0; i < 20000 && time.Now().Before(deadline); i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := l.Get(ctx, c, "echo.lab", "/load"); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				} else {
					ok.Add(1)
				}
			}
		}()
	}
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
	close(stop)
	wg.Wait()
	t.Logf("%d requests succeeded, %d failed across the restart", ok.Load(), failed.Load())
	if failed.Load() != 0 {
		t.Errorf("%d requests failed (first: %v)", failed.Load(), firstErr.Load())
	}
	if ok.Load() < 100 {
		t.Errorf("only %d requests ran", ok.Load())
	}
}
