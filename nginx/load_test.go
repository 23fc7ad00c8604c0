package nginx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/testenv"
)

// loadSnapshot is generation gen of a configuration that changes on every call:
// odd generations move the "flip" upstream's endpoint (a change of the table, which
// needs no reload), even ones move an L4 Service from one of ports to the other (a
// reload); every other one adds a host (a change of the table).
func loadSnapshot(gen int, epA, epB netip.AddrPort, ports [2]uint16) model.Snapshot {
	flip := epA
	if gen%2 == 1 {
		flip = epB
	}
	s := model.Snapshot{
		Servers: []model.Server{{Host: "a.test", Locations: []model.Location{
			{Path: "/", Type: model.PathPrefix, Upstream: "t-a-80"},
			{Path: "/b", Type: model.PathPrefix, Upstream: "t-b-80"},
			{Path: "/flip", Type: model.PathPrefix, Upstream: "t-flip-80"},
		}}},
		Upstreams: []model.Upstream{
			{Name: "t-a-80", Endpoints: []netip.AddrPort{epA}},
			{Name: "t-b-80", Endpoints: []netip.AddrPort{epB}},
			{Name: "t-flip-80", Endpoints: []netip.AddrPort{flip}},
		},
	}
	for i := 0; i < gen/2; i++ {
		s.Servers = append(s.Servers, model.Server{Host: fmt.Sprintf("gen-%d.test", i), DefaultUpstream: "t-b-80"})
	}
	return withL4(s, "t/l4", ports[gen/2%2])
}

func TestReloadUnderLoadDropsNothing(t *testing.T) {
	const (
		changes     = 100 // half of them reloads
		clients     = 4
		maxRequests = 200000 // per client: more than the changes take, so the load outlasts them
		// The changes are counted, not timed: about 20 s on a quiet machine;
		// the cap is for a wedged nginx (a loaded 2-core CI did 34 reloads
		// in 90 s, and the test then failed for being slow).
		maxDuration = 5 * time.Minute
	)
	_, epA := backend(t, "A")
	_, epB := backend(t, "B")
	ports := [2]uint16(testenv.Ports(t, 2))
	n := startNginx(t, loadSnapshot(0, epA, epB, ports))

	var (
		stop     atomic.Bool
		requests atomic.Int64
		failures atomic.Int64
		wg       sync.WaitGroup
		firstErr sync.Once
	)
	deadline := time.Now().Add(maxDuration)
	for i := range clients {
		c := n.client(i%2 == 0) // half keep connections alive across reloads
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < maxRequests && !stop.Load() && time.Now().Before(deadline); j++ {
				// "/flip" is answered by A or B, whichever the last change chose.
				path, want, alt := "/", "A /", ""
				switch j % 3 {
				case 1:
					path, want, alt = "/b/x", "B /b/x", ""
				case 2:
					path, want, alt = "/flip", "A /flip", "B /flip"
				}
				err := func() error {
					resp, err := c.Get("http://a.test" + path)
					if err != nil {
						return err
					}
					defer resp.Body.Close()
					body, err := io.ReadAll(resp.Body)
					if err != nil {
						return err
					}
					if resp.StatusCode != 200 || string(body) != want && (alt == "" || string(body) != alt) {
						return fmt.Errorf("GET %s = %d %q, want 200 %q", path, resp.StatusCode, body, want)
					}
					return nil
				}()
				requests.Add(1)
				if err != nil {
					failures.Add(1)
					firstErr.Do(func() { t.Errorf("first failed request: %v", err) })
				}
			}
		}()
	}

	ctx := context.Background()
	var serve, update []time.Duration
	stalled := 0 // changes during which no request completed
	gen := 1
	for ; gen <= changes && time.Now().Before(deadline); gen++ {
		before := requests.Load()
		res, err := n.r.ApplyNow(ctx, loadSnapshot(gen, epA, epB, ports))
		want := ResultSuccess
		if gen%2 == 1 {
			want = ResultTable
		}
		if err != nil || res.Result != want {
			t.Fatalf("change %d: %s, %v; want %s", gen, res.Result, err, want)
		}
		if want == ResultSuccess {
			serve = append(serve, res.Switch)
		} else {
			update = append(update, res.Switch)
		}
		time.Sleep(20 * time.Millisecond) // let requests cross the change
		if requests.Load() == before {
			stalled++
		}
	}
	gen--
	stop.Store(true)
	wg.Wait()

	if len(serve) < 50 {
		t.Fatalf("only %d reloads within %v", len(serve), maxDuration)
	}
	// The load must overlap the changes: requests complete across nearly every one
	// (a scheduler hiccup may leave a few without).
	if stalled > gen/20 {
		t.Errorf("no request completed across %d of %d changes: the load did not overlap them", stalled, gen)
	}
	if f := failures.Load(); f != 0 {
		t.Errorf("%d of %d requests failed during %d reloads and %d endpoint updates", f, requests.Load(), len(serve), len(update))
	}
	// Apply returns once nginx uses the change: the last one shows at once.
	want := "A "
	if gen%2 == 1 {
		want = "B "
	}
	if resp, body := get(t, n.client(false), "http://a.test/flip"); resp.StatusCode != 200 || !strings.HasPrefix(body, want) {
		t.Errorf("after the last change /flip = %d %q, want %q...", resp.StatusCode, body, want)
	}
	// Every reload, and the first configuration, counted as a success; every
	// endpoint-only change as an endpoint update, not a reload.
	if got := testutil.ToFloat64(n.r.m.reloads.WithLabelValues(ResultSuccess)); got != float64(len(serve)+1) {
		t.Errorf("reloads_total{result=success} = %v, want %d", got, len(serve)+1)
	}
	if got := testutil.ToFloat64(n.r.m.tableUpdates.WithLabelValues(ResultSuccess)); got != float64(len(update)) {
		t.Errorf("table_updates_total{result=success} = %v, want %d", got, len(update))
	}
	if got := testutil.ToFloat64(n.r.m.configBytes); got != float64(len(n.r.applied)) || got == 0 {
		t.Errorf("config_bytes = %v, want %d", got, len(n.r.applied))
	}
	if got := testutil.ToFloat64(n.r.m.lastSuccess); time.Since(time.Unix(int64(got), 0)) > time.Minute {
		t.Errorf("last_reload_success_timestamp_seconds = %v, not recent", got)
	}
	mean := func(ds []time.Duration) time.Duration {
		var total time.Duration
		for _, d := range ds {
			total += d
		}
		return total / time.Duration(max(len(ds), 1))
	}
	t.Logf("%d reloads and %d endpoint updates (%d without a completed request), %d requests, 0 failed; mean reload (signal to only new workers accepting) %v, mean endpoint update %v",
		len(serve), len(update), stalled, requests.Load(), mean(serve), mean(update))
}

// Workers a reload replaced keep serving the requests they hold, up to
// ReloaderConfig.MaxDraining: before a reload, the oldest beyond it are ended.
func TestDrainingWorkersAreBounded(t *testing.T) {
	// Answers the headers and a line, then holds the response open.
	hold := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "held")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(time.Minute):
		}
	}))
	t.Cleanup(func() { hold.CloseClientConnections(); hold.Close() })
	ports := testenv.Ports(t, 4)
	snap := func(i int) model.Snapshot {
		s := hostSnapshot("a.test")
		s.Upstreams[0].Endpoints = []netip.AddrPort{netip.MustParseAddrPort(hold.Listener.Addr().String())}
		return withL4(s, "t/l4", ports[i])
	}
	n := startNginx(t, snap(0))
	n.r.cfg.MaxDraining = 1
	open := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", n.opt.HTTPPort))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		fmt.Fprint(c, "GET /hold HTTP/1.1\r\nHost: a.test\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, 4096)
		if k, err := c.Read(b); err != nil || !strings.Contains(string(b[:k]), "held") {
			t.Fatalf("held request: %q, %v", b[:k], err)
		}
		return c
	}
	alive := func(c net.Conn) bool {
		c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		return errors.As(err, &ne) && ne.Timeout()
	}
	var held []net.Conn
	for i := 1; i <= 3; i++ {
		held = append(held, open()) // a worker of the running generation holds it
		if res, err := n.r.ApplyNow(context.Background(), snap(i)); err != nil || res.Result != ResultSuccess {
			t.Fatalf("reload %d: %s, %v", i, res.Result, err)
		}
		// The replaced workers that hold nothing exit; the one that holds a request stays.
		if _, err := testenv.Poll(t.Context(), 10*time.Second, 5*time.Millisecond, func() bool { d, _ := n.r.draining(); return d == min(i, 2) }); err != nil {
			t.Fatalf("waiting for idle replaced workers to exit: %v", err)
		}
	}
	if d, b := n.r.draining(); d != 2 || b <= 0 {
		t.Errorf("%d draining workers with %d bytes of private memory, want 2 with some", d, b)
	}
	for i, want := range []bool{false, true, true} {
		if got := alive(held[i]); got != want {
			t.Errorf("request held before reload %d: alive %v, want %v", i+1, got, want)
		}
	}
	if got := testutil.ToFloat64(n.r.m.drainingEnded); got != 1 {
		t.Errorf("draining_workers_ended_total = %v, want 1", got)
	}
}
