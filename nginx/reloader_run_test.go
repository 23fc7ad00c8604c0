package nginx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/testenv"
)

// runUntilCleanup runs r until the test ends, and checks what Run returns.
func runUntilCleanup(t *testing.T, r *Reloader) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
}

func TestRunCoalescesRestartsAndStops(t *testing.T) {
	runner := &fakeRunner{}
	r, _ := newTestReloader(t, runner, ReloaderConfig{Debounce: time.Second, RestartBackoff: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	if _, err := testenv.Poll(t.Context(), 10*time.Second, 5*time.Millisecond, func() bool { _, ms := runner.snapshot(); return len(ms) == 1 }); err != nil {
		t.Fatalf("waiting for the first master: %v", err)
	}
	_, ms := runner.snapshot()
	first := ms[0]

	// A burst of updates that need a reload, inside one debounce window, is one
	// reload, of the last one.
	var last model.Snapshot
	for i := range 20 {
		last = withL4(hostSnapshot("a.example.com"), "app/l4", uint16(15000+i))
		r.Update(last)
	}
	want, err := Render(last, r.cfg.Render)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(t.Context(), 10*time.Second, 5*time.Millisecond, func() bool { n, _ := first.state(); return n >= 1 }); err != nil {
		t.Fatalf("waiting for the burst's reload: %v", err)
	}
	if r.Checksum() != want.Checksum {
		t.Errorf("running checksum %.12s, want the last update's %.12s", r.Checksum(), want.Checksum)
	}
	time.Sleep(1500 * time.Millisecond) // another window: nothing more may come
	if n, _ := first.state(); n != 1 {
		t.Errorf("reloads for a burst of 20 updates = %d, want 1", n)
	}

	// The master dies: Run starts another.
	first.die()
	if _, err := testenv.Poll(t.Context(), 10*time.Second, 5*time.Millisecond, func() bool { _, ms := runner.snapshot(); return len(ms) == 2 }); err != nil {
		t.Fatalf("waiting for a restarted master: %v", err)
	}
	if got := testutil.ToFloat64(r.m.restarts); got != 1 {
		t.Errorf("master_restarts_total = %v, want 1", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	_, ms = runner.snapshot()
	if _, stopped := ms[1].state(); !stopped {
		t.Error("the running master was not stopped on shutdown")
	}
}

// A first snapshot that nginx -t refuses still gets nginx started, with no routes.
func TestRunStartsWithNoRoutesWhenTheFirstConfigIsRefused(t *testing.T) {
	runner := &fakeRunner{reject: "app/bad"}
	r, _ := newTestReloader(t, runner, ReloaderConfig{})
	r.Update(withL4(hostSnapshot("a.example.com"), "app/bad", 15000))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	if _, err := testenv.Poll(t.Context(), 10*time.Second, 5*time.Millisecond, func() bool { _, ms := runner.snapshot(); return len(ms) == 1 }); err != nil {
		t.Fatalf("waiting for a master: %v", err)
	}
	conf, err := os.ReadFile(r.confPath())
	if err != nil {
		t.Fatal(err)
	}
	empty, err := Render(model.Snapshot{}, r.cfg.Render)
	if err != nil {
		t.Fatal(err)
	}
	if string(conf) != string(empty.Text) {
		t.Error("nginx started with something else than the empty configuration")
	}
	if got := testutil.ToFloat64(r.m.reloads.WithLabelValues(ResultInvalid)); got != 1 {
		t.Errorf("reloads_total{result=invalid} = %v, want 1", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}

// A change of the table is pushed to the control socket at once, without nginx -t
// or a reload; a push that fails is counted and tried again without waiting for
// another change.
func TestRunPushesTableChangesAndRetries(t *testing.T) {
	runner := &fakeRunner{}
	r, _ := newTestReloader(t, runner, ReloaderConfig{Debounce: time.Hour, RestartBackoff: 20 * time.Millisecond})
	first := hostSnapshot("a.example.com")
	r.Update(first)
	runUntilCleanup(t, r)
	if _, err := testenv.Poll(t.Context(), 10*time.Second, 5*time.Millisecond, func() bool { _, ms := runner.snapshot(); return len(ms) == 1 }); err != nil {
		t.Fatalf("waiting for the first master: %v", err)
	}

	// The control socket, after the start (which removes a stale one): the first
	// push fails, the next ones are taken.
	ctl := fakeControl(t, r, 1)

	moved := hostSnapshot("a.example.com", "b.example.com")
	moved.Upstreams[0].Endpoints = []netip.AddrPort{ap("10.0.0.2:80")}
	r.Update(moved)
	if _, err := testenv.Poll(t.Context(), 10*time.Second, 5*time.Millisecond, func() bool { return testutil.ToFloat64(r.m.tableUpdates.WithLabelValues(ResultSuccess)) == 1 }); err != nil {
		t.Fatalf("waiting for a pushed table: %v", err)
	}
	if got := testutil.ToFloat64(r.m.tableUpdates.WithLabelValues(ResultError)); got != 1 {
		t.Errorf("table_updates_total{result=error} = %v, want 1", got)
	}
	if diff := cmp.Diff([]string{"PUT /table", "PUT /table"}, ctl.requests()); diff != "" {
		t.Errorf("requests to the control socket (-want +got):\n%s", diff)
	}
	// Only what changed: the new host and the moved endpoint.
	want := fmt.Sprintf("%s%s %s %d\nset h:b.example.com - - - / ns-svc-80\nset u:ns-svc-80 10.0.0.2:80\n",
		deltaHeader, r.appliedTable.digest(), Must(Render(moved, r.cfg.Render)).Digest, 0)
	if got := ctl.pushes(); len(got) != 2 || !strings.HasSuffix(want, got[1][strings.Index(got[1], "\n"):]) {
		t.Errorf("pushed %q, want the second to be %q", got, want)
	}
	tests, ms := runner.snapshot()
	if reloads, _ := ms[0].state(); reloads != 0 || tests != 1 {
		t.Errorf("%d reloads and %d nginx -t runs, want 0 and 1 (the first configuration)", reloads, tests)
	}
	if got := testutil.ToFloat64(r.m.reloads.WithLabelValues(ResultSuccess)); got != 1 {
		t.Errorf("reloads_total{result=success} = %v, want 1", got)
	}
}

// Must returns v, and panics on err: for values a test cannot go on without.
func Must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// controlSocket is a fake of the Reloader's control socket: it answers as nginx
// does, except to the first requests it is told to fail, and records them all.
type controlSocket struct {
	mu     sync.Mutex
	fail   int
	reqs   []string // "METHOD PATH"
	tables []string // the bodies
}

// fakeControl serves r's control socket until the test ends, failing the first
// fail requests (500).
func fakeControl(t *testing.T, r *Reloader, fail int) *controlSocket {
	t.Helper()
	c := &controlSocket{fail: fail}
	l, err := net.Listen("unix", resolve(r.cfg.Dir, r.cfg.Render.ControlSocket))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		c.mu.Lock()
		defer c.mu.Unlock()
		if req.Method == http.MethodGet { // tableState: a table this fake does not keep
			fmt.Fprintln(w, "unknown 0")
			return
		}
		c.reqs = append(c.reqs, req.Method+" "+req.URL.Path)
		c.tables = append(c.tables, string(body))
		if len(c.reqs) <= c.fail {
			http.Error(w, "dictionary full", http.StatusInternalServerError)
			return
		}
		header, _, _ := strings.Cut(string(body), "\n")
		f := strings.Fields(header)
		fmt.Fprintln(w, f[len(f)-2])
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return c
}

func (c *controlSocket) requests() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.reqs)
}

// pushes returns the tables pushed, in order.
func (c *controlSocket) pushes() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.tables)
}

// While nginx -t refuses the latest configuration, changes of the table still reach
// the running one, pushed without nginx -t or a reload.
func TestRefusedConfigDoesNotFreezeTheTable(t *testing.T) {
	runner := &fakeRunner{reject: "app/bad"}
	r, _ := newTestReloader(t, runner, ReloaderConfig{})
	ctx := context.Background()
	fm := startFake(r, runner)
	pushes := fakeControl(t, r, 0).pushes
	refused := func(eps []netip.AddrPort, hosts ...string) model.Snapshot {
		s := hostSnapshot(hosts...)
		s.Upstreams[0].Endpoints = eps
		return withL4(s, "app/bad", 15000)
	}

	if res, err := r.ApplyNow(ctx, hostSnapshot("a.example.com")); err != nil || res.Result != ResultSuccess {
		t.Fatalf("first apply: %+v, %v", res, err)
	}
	if res, err := r.ApplyNow(ctx, refused([]netip.AddrPort{ap("10.0.0.1:80")}, "a.example.com")); err == nil || res.Result != ResultInvalid {
		t.Fatalf("refused apply: %+v, %v, want invalid", res, err)
	}
	if got := pushes(); len(got) != 0 {
		t.Fatalf("pushed %d changes for a refused configuration with the same table, want none", len(got))
	}

	// The refused text again, with other endpoints.
	res, err := r.ApplyNow(ctx, refused([]netip.AddrPort{ap("10.0.0.2:80")}, "a.example.com"))
	if err != nil || res.Result != ResultTable {
		t.Fatalf("endpoint change while refused: %+v, %v, want %s", res, err, ResultTable)
	}
	if got := pushes(); len(got) != 1 || !strings.HasSuffix(got[0], "\nset u:ns-svc-80 10.0.0.2:80\n") {
		t.Fatalf("pushed %q, want the new endpoint", got)
	}

	// A new host and other endpoints, still with the refused text.
	if _, err := r.ApplyNow(ctx, refused([]netip.AddrPort{ap("10.0.0.3:80")}, "a.example.com", "c.example.com")); err != nil {
		t.Fatalf("second change while refused: %v", err)
	}
	if got := pushes(); len(got) != 2 || !strings.Contains(got[1], "\nset h:c.example.com - - - / ns-svc-80\n") ||
		!strings.Contains(got[1], "\nset u:ns-svc-80 10.0.0.3:80\n") {
		t.Fatalf("pushed %q, want the new host and endpoint", got)
	}

	// An upstream the snapshot no longer has is removed; its routes answer 503.
	gone := refused(nil, "a.example.com", "c.example.com")
	gone.Upstreams = gone.Upstreams[1:]
	if _, err := r.ApplyNow(ctx, gone); err != nil {
		t.Fatalf("change without the upstream: %v", err)
	}
	if got := pushes(); len(got) != 3 || !strings.Contains(got[2], "\nset h:a.example.com - - - / @503\n") || !strings.HasSuffix(got[2], "\ndel u:ns-svc-80\n") {
		t.Fatalf("pushed %q, want the routes to answer 503 and the upstream gone", got)
	}

	tests, _ := runner.snapshot()
	if reloads, _ := fm.state(); reloads != 1 || tests != 2 {
		t.Errorf("%d reloads and %d nginx -t runs, want 1 and 2", reloads, tests)
	}
	if got := testutil.ToFloat64(r.m.tableUpdates.WithLabelValues(ResultSuccess)); got != 3 {
		t.Errorf("table_updates_total{result=success} = %v, want 3", got)
	}
}

// A reload that fails leaves what nginx runs unknown: the same snapshot is not
// reported served (unchanged) but reloaded again.
func TestFailedReloadIsTriedAgain(t *testing.T) {
	runner := &fakeRunner{}
	r, _ := newTestReloader(t, runner, ReloaderConfig{})
	ctx := context.Background()
	fm := startFake(r, runner)
	fakeControl(t, r, 0)
	if res, err := r.ApplyNow(ctx, hostSnapshot("a.example.com")); err != nil || res.Result != ResultSuccess {
		t.Fatalf("first apply: %+v, %v", res, err)
	}
	snap := withL4(hostSnapshot("a.example.com"), "app/l4", 15000)
	fm.mu.Lock()
	fm.reloadErr = errors.New("signal: no such process")
	fm.mu.Unlock()
	if res, err := r.ApplyNow(ctx, snap); err == nil || res.Serving {
		t.Fatalf("apply with a failing reload: %+v, %v, want an error", res, err)
	}
	fm.mu.Lock()
	fm.reloadErr = nil
	fm.mu.Unlock()
	res, err := r.ApplyNow(ctx, snap)
	if err != nil || res.Result != ResultSuccess || !res.Serving {
		t.Fatalf("the same snapshot again: %+v, %v, want a reload that succeeds", res, err)
	}
	if n, _ := fm.state(); n != 3 {
		t.Errorf("%d reloads, want 3", n)
	}
}

// A change that needs a reload, after a quiet debounce window, reloads at once;
// one within the window of that reload waits for the window's end (an hour).
func TestRunReloadsAtOnceAfterAQuietWindow(t *testing.T) {
	runner := &fakeRunner{}
	r, _ := newTestReloader(t, runner, ReloaderConfig{Debounce: time.Hour, RestartBackoff: 10 * time.Millisecond})
	runUntilCleanup(t, r)
	if _, err := testenv.Poll(t.Context(), 10*time.Second, 5*time.Millisecond, func() bool { _, ms := runner.snapshot(); return len(ms) == 1 }); err != nil {
		t.Fatalf("waiting for the first master: %v", err)
	}
	_, ms := runner.snapshot()
	master := ms[0]
	fakeControl(t, r, 0)

	// The window after the start has passed (as if it were two hours ago):
	// a change that needs a reload reloads at once.
	r.mu.Lock()
	r.reloadedAt = time.Now().Add(-2 * time.Hour)
	r.mu.Unlock()
	last := withL4(hostSnapshot("a.example.com"), "app/l4", 15000)
	r.Update(last)
	if _, err := testenv.Poll(t.Context(), 10*time.Second, 5*time.Millisecond, func() bool { n, _ := master.state(); return n == 1 }); err != nil {
		t.Fatalf("waiting for a reload at once: %v", err)
	}
	want, err := Render(last, r.cfg.Render)
	if err != nil {
		t.Fatal(err)
	}
	if r.Checksum() != want.Checksum {
		t.Errorf("running checksum %.12s, want the last update's %.12s", r.Checksum(), want.Checksum)
	}
	// And the next one, within the window of that reload, waits again.
	r.Update(withL4(last, "app/l4c", 15002))
	time.Sleep(300 * time.Millisecond)
	if n, _ := master.state(); n != 1 {
		t.Errorf("%d reloads, want 1: a change within the window of the last reload reloaded at once", n)
	}
}
