package nginx

import (
	"context"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/testenv"
)

// A restarted agent takes over the master an earlier one left running (its listening
// sockets stay open), reloads it with the new configuration and stops it on exit.
func TestRunAdoptsALeftoverMaster(t *testing.T) {
	_, epA := backend(t, "A")
	_, epB := backend(t, "B")
	snap := func(ep netip.AddrPort) model.Snapshot {
		return model.Snapshot{
			Servers:   []model.Server{{Host: "a.test", DefaultUpstream: "t-x-80"}},
			Upstreams: []model.Upstream{{Name: "t-x-80", Endpoints: []netip.AddrPort{ep}}},
		}
	}
	first := startNginx(t, snap(epA))
	dir, opt := first.r.cfg.Dir, first.opt
	pid := first.r.MasterPID()
	// Both workers up (the second may still be starting when nginx first serves).
	var workersBefore []int
	if _, err := testenv.Poll(context.Background(), 10*time.Second, 10*time.Millisecond, func() bool {
		workersBefore = workerPIDs(t, first)
		return len(workersBefore) == first.opt.WorkerProcesses
	}); err != nil {
		t.Fatalf("workers %v, want %d", workersBefore, first.opt.WorkerProcesses)
	}
	// The first agent "crashes": it forgets its master without stopping it.
	first.r.mu.Lock()
	first.r.master = nil
	first.r.mu.Unlock()
	first.stop(t)
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("the leftover master %d is gone: %v", pid, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) }) // only if the test failed to stop it

	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	r, err := NewReloader(ReloaderConfig{Dir: dir, Render: opt, ConfirmTimeout: 10 * time.Second, StopTimeout: 10 * time.Second},
		Exec{Log: log.Named("nginx")}, log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	r.Update(snap(epB))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	second := &liveNginx{r: r, opt: opt}
	want, err := Render(snap(epB), opt)
	if err != nil {
		t.Fatal(err)
	}
	second.waitChecksum(t, want.Checksum)
	second.waitTable(t, want.Digest)
	if got := r.MasterPID(); got != pid {
		t.Errorf("master pid %d, want the adopted %d", got, pid)
	}
	// Only the endpoints changed, and the adopted master serves the text on disk:
	// no reload, the same workers (their clients' kept-alive connections stay).
	if got := workerPIDs(t, second); !slices.Equal(got, workersBefore) {
		t.Errorf("workers %v after adoption, want the same %v (no reload)", got, workersBefore)
	}
	if got := r.Checksum(); got != want.Checksum {
		t.Errorf("Checksum() %q after adoption, want %q (the agent's health reads it)", got, want.Checksum)
	}
	if resp, body := get(t, second.client(false), "http://a.test/x"); resp.StatusCode != 200 || body != "B /x" {
		t.Errorf("after adoption: %d %q, want B", resp.StatusCode, body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	for start := time.Now(); syscall.Kill(pid, 0) == nil; time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("adopted master %d still runs after shutdown", pid)
		}
	}
}
