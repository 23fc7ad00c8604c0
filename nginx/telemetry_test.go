package nginx

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/testenv"
)

// telemetryBackend answers /status/<code> with that status, /slow after 60 ms,
// and anything else with 1,000 bytes.
func telemetryBackend(t *testing.T) netip.AddrPort {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if code, ok := strings.CutPrefix(r.URL.Path, "/status/"); ok {
			n, _ := strconv.Atoi(code)
			w.WriteHeader(n)
			return
		}
		if r.URL.Path == "/slow" {
			time.Sleep(60 * time.Millisecond)
		}
		w.Write(make([]byte, 1000))
	}))
	t.Cleanup(s.Close)
	return netip.MustParseAddrPort(s.Listener.Addr().String())
}

// refusedEndpoint is a loopback address and port where nothing listens.
func refusedEndpoint(t *testing.T) netip.AddrPort {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ap := netip.MustParseAddrPort(l.Addr().String())
	l.Close()
	return ap
}

// series reads the telemetry's series as "name{label=value,...}" -> value (a
// histogram gives _count, _sum and a _bucket per bound).
func series(t testing.TB, tel *telemetry) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(tel)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var l []string
			for _, p := range m.GetLabel() {
				l = append(l, p.GetName()+"="+p.GetValue())
			}
			key := func(suffix string, extra ...string) string {
				return mf.GetName() + suffix + "{" + strings.Join(append(append([]string{}, l...), extra...), ",") + "}"
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out[key("")] = m.GetCounter().GetValue()
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				out[key("_count")] = float64(h.GetSampleCount())
				out[key("_sum")] = h.GetSampleSum()
				for _, b := range h.GetBucket() {
					out[key("_bucket", "le="+strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64))] = float64(b.GetCumulativeCount())
				}
			}
		}
	}
	return out
}

// TestTelemetryCountsByIngress sends known requests through a real nginx and
// checks every count the agent then exports, also across a reload (SIGHUP: new
// workers, the old ones push what they counted as they exit).
func TestTelemetryCountsByIngress(t *testing.T) {
	live, dead := telemetryBackend(t), refusedEndpoint(t)
	snap := model.Snapshot{
		Servers: []model.Server{
			{Host: "a.test", Locations: []model.Location{
				{Path: "/", Type: model.PathPrefix, Upstream: "t-a-80", Source: "shop/web"},
				{Path: "/missing", Type: model.PathPrefix, Upstream: "t-empty-80", Source: "shop/web"},
			}},
			{Host: "b.test", Locations: []model.Location{{Path: "/", Type: model.PathPrefix, Upstream: "t-flaky-80", Source: "shop/api"}}},
			{Host: "c.test", Locations: []model.Location{{Path: "/", Type: model.PathPrefix, Upstream: "t-dead-80", Source: "shop/dead"}}},
		},
		Upstreams: []model.Upstream{
			{Name: "t-a-80", Endpoints: []netip.AddrPort{live}},
			{Name: "t-dead-80", Endpoints: []netip.AddrPort{dead}},
			{Name: "t-empty-80"},
			{Name: "t-flaky-80", Endpoints: []netip.AddrPort{dead, live}},
		},
	}
	n := startNginx(t, snap)
	c := n.client(false)
	do := func(url string, times, status int) {
		t.Helper()
		for range times {
			resp, _ := get(t, c, url)
			if resp.StatusCode != status {
				t.Fatalf("GET %s = %d, want %d", url, resp.StatusCode, status)
			}
		}
	}
	do("http://a.test/", 10, 200)
	do("http://a.test/status/404", 3, 404)
	do("http://a.test/status/500", 2, 500)
	do("http://a.test/missing/x", 4, 503) // no endpoints: no try
	do("http://a.test/slow", 2, 200)
	do("http://b.test/", 20, 200) // a refused endpoint first, then the live one
	do("http://c.test/", 3, 502)  // every try refused
	for range 2 {
		expectClosed(t, n, "unknown.test") // 444: no answer, not counted
	}

	const web = "ingress=shop/web"
	want := map[string]float64{
		"portico_http_requests_total{" + web + ",status_class=2xx}":                  12,
		"portico_http_requests_total{" + web + ",status_class=4xx}":                  3,
		"portico_http_requests_total{" + web + ",status_class=5xx}":                  6,
		"portico_http_request_duration_seconds_count{" + web + "}":                   21,
		"portico_http_request_duration_seconds_bucket{" + web + ",le=10}":            21,
		"portico_http_requests_total{ingress=shop/api,status_class=2xx}":             20,
		"portico_http_requests_total{ingress=shop/dead,status_class=5xx}":            3,
		"portico_http_upstream_tries_total{upstream=t-a-80}":                         17,
		"portico_http_upstream_retries_total{upstream=t-a-80}":                       0,
		"portico_http_upstream_connect_errors_total{upstream=t-a-80}":                0,
		"portico_http_upstream_response_duration_seconds_count{upstream=t-a-80}":     17,
		"portico_http_upstream_tries_total{upstream=t-dead-80}":                      3,
		"portico_http_upstream_retries_total{upstream=t-dead-80}":                    0,
		"portico_http_upstream_connect_errors_total{upstream=t-dead-80}":             3,
		"portico_http_upstream_response_duration_seconds_count{upstream=t-flaky-80}": 20,
		"portico_http_telemetry_dropped_total{}":                                     0,
	}
	var got map[string]float64
	testenv.Eventually(t, 15*time.Second, func() string {
		got = series(t, n.r.tel)
		for k, v := range want {
			if got[k] != v {
				return fmt.Sprintf("%s = %v, want %v", k, got[k], v)
			}
		}
		return ""
	})
	// The flaky upstream: every retry followed a refused connection.
	tries, retries, errs := got["portico_http_upstream_tries_total{upstream=t-flaky-80}"],
		got["portico_http_upstream_retries_total{upstream=t-flaky-80}"], got["portico_http_upstream_connect_errors_total{upstream=t-flaky-80}"]
	if retries < 1 || errs != retries || tries != 20+retries {
		t.Errorf("t-flaky-80: %v tries, %v retries, %v connect errors; want 20+retries tries, as many connect errors as retries, at least one", tries, retries, errs)
	}
	// The two slow requests are above 50 ms, in the request's and the upstream's time.
	if b := got["portico_http_request_duration_seconds_bucket{"+web+",le=0.05}"]; b > 19 {
		t.Errorf("shop/web: %v requests within 50 ms, want at most 19 (two took 60 ms)", b)
	}
	if s := got["portico_http_upstream_response_duration_seconds_sum{upstream=t-a-80}"]; s < 0.12 {
		t.Errorf("t-a-80: upstream time %v s in all, want at least 0.12 (two answers of 60 ms)", s)
	}
	// Twelve 1,000-byte bodies, and nginx's four 503 pages (Content-Length).
	if b := got["portico_http_response_bytes_total{"+web+"}"]; b < 12000 || b > 12000+4*600 {
		t.Errorf("shop/web: %v response bytes, want 12,000 and four error pages", b)
	}
	if n, ok := got["portico_http_requests_total{ingress=,status_class=4xx}"]; ok {
		t.Errorf("%v connections closed without an answer were counted", n)
	}
	if b := got["portico_http_request_bytes_total{"+web+"}"]; b < 21*30 || b > 21*400 {
		t.Errorf("shop/web: %v request bytes for 21 requests", b)
	}

	t.Run("reload", func(t *testing.T) {
		if err := syscall.Kill(n.master(t).PID(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		do("http://a.test/", 5, 200)
		testenv.Eventually(t, 15*time.Second, func() string {
			got := series(t, n.r.tel)
			k := "portico_http_requests_total{" + web + ",status_class=2xx}"
			if got[k] != 17 {
				return fmt.Sprintf("%s = %v, want 17", k, got[k])
			}
			return ""
		})
	})
}

// TestAccessLog checks the JSON access log against real nginx: one line per
// request with the Ingress and upstream that served it, and sampling.
func TestAccessLog(t *testing.T) {
	live := telemetryBackend(t)
	snap := model.Snapshot{
		Servers: []model.Server{{Host: "a.test", Locations: []model.Location{
			{Path: "/", Type: model.PathPrefix, Upstream: "t-a-80", Source: "shop/web"},
		}}},
		Upstreams: []model.Upstream{{Name: "t-a-80", Endpoints: []netip.AddrPort{live}}},
	}
	file := filepath.Join(t.TempDir(), "access.log")
	n := startNginx(t, snap, func(o *Options) { o.AccessLog = file })
	c := n.client(false)
	resp, _ := get(t, c, "http://a.test/p?secret=1", "User-Agent", `quote" and \ backslash`)
	if resp.StatusCode != 200 {
		t.Fatalf("GET = %d", resp.StatusCode)
	}
	expectClosed(t, n, "unknown.test")
	var lines []map[string]any
	testenv.Eventually(t, 10*time.Second, func() string { // the log is flushed every second
		lines = nil
		f, err := os.Open(file)
		if err != nil {
			return err.Error()
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Fatalf("access log line %q is not JSON: %v", sc.Text(), err)
			}
			lines = append(lines, m)
		}
		if len(lines) < 2 {
			return fmt.Sprintf("%d lines in the access log, want 2", len(lines))
		}
		return ""
	})
	byHost := map[string]map[string]any{} // two workers: each writes its own lines
	for _, l := range lines {
		byHost[l["host"].(string)] = l
	}
	l := byHost["a.test"]
	for k, v := range map[string]any{"ingress": "shop/web", "upstream": "t-a-80", "status": 200.0, "path": "/p",
		"host": "a.test", "method": "GET", "client": "127.0.0.1", "user_agent": `quote" and \ backslash`, "upstream_addr": live.String()} {
		if l[k] != v {
			t.Errorf("access log %s = %#v, want %#v (line %v)", k, l[k], v, l)
		}
	}
	if u := byHost["unknown.test"]; u["ingress"] != "" || u["status"] != 444.0 {
		t.Errorf("access log of an unknown host: %v, want no Ingress and 444", u)
	}

	t.Run("sampled", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "access.log")
		n := startNginx(t, snap, func(o *Options) { o.AccessLog, o.AccessLogSample = file, 0.25 })
		c := n.client(true)
		const requests = 400
		for range requests {
			resp, _ := get(t, c, "http://a.test/")
			if resp.StatusCode != 200 {
				t.Fatalf("GET = %d", resp.StatusCode)
			}
		}
		n.stop(t) // flushes the log
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		got := strings.Count(string(b), "\n")
		// Binomial(400, 0.25): mean 100, standard deviation 8.7; 5 of them.
		if got < 56 || got > 144 {
			t.Errorf("a log sampled at 25%% has %d lines for %d requests", got, requests)
		}
	})
}

func TestAccessLogSample(t *testing.T) {
	for _, tc := range []struct {
		sample float64
		want   string
	}{{0, "1"}, {1, "1"}, {0.5, "0.5"}, {0.0001, "0.0001"}, {0.00123, "0.00123"}, {0.1234567, "0.123457"}} {
		if _, got := accessLog(Options{AccessLog: "stdout", AccessLogSample: tc.sample}); got != tc.want {
			t.Errorf("sample %v renders %q, want %q", tc.sample, got, tc.want)
		}
	}
	if f, _ := accessLog(Options{AccessLog: "stdout"}); f != "/dev/stdout" {
		t.Errorf("access log stdout renders %q", f)
	}
	for _, bad := range []float64{-0.1, 1.5, 0.00001} {
		o := DefaultOptions("/run/portico")
		o.AccessLogSample = bad
		if o.validate() == nil {
			t.Errorf("AccessLogSample %v accepted", bad)
		}
	}
}

// TestTelemetryLines checks how the agent reads nginx's lines: a bad one is
// skipped and reported, the others count; nginx's dropped count starts again
// with a new master.
func TestTelemetryLines(t *testing.T) {
	tel := newTelemetry()
	// every field of n, each counting 1 (2 for the milliseconds' field ms)
	counts := func(n, ms int) string {
		var b strings.Builder
		for i := 1; i <= n; i++ {
			v := 1
			if i == ms {
				v = 2
			}
			fmt.Fprintf(&b, " %d %d", i, v)
		}
		return b.String()
	}
	in := strings.Join([]string{
		"r shop/web" + counts(ingressFields, 9),
		"r Shop/Web" + counts(ingressFields, 9), // not an Ingress name
		"r shop/web 22 1",                       // no such field
		"r shop/web 2",                          // a field without its count
		"r shop/web 2 NaN",
		" u t-a-80" + counts(upstreamFields, 4) + " ", // as Lua's concat puts them
		"u t-a-80 2 -1",
		"x whatever",
		"dropped 5",
		" ",
		"",
	}, "\n")
	err := tel.add(strings.NewReader(in))
	if err == nil || !strings.Contains(err.Error(), "Shop/Web") {
		t.Errorf("add: %v, want the bad lines reported", err)
	}
	if err := tel.add(strings.NewReader("r - 5 1\ndropped 2\n")); err != nil {
		t.Fatal(err)
	}
	got := series(t, tel)
	for k, v := range map[string]float64{
		"portico_http_requests_total{ingress=shop/web,status_class=2xx}":                   1,
		"portico_http_requests_total{ingress=,status_class=5xx}":                           1,
		"portico_http_request_duration_seconds_count{ingress=shop/web}":                    12,
		"portico_http_upstream_tries_total{upstream=t-a-80}":                               1,
		"portico_http_upstream_response_duration_seconds_count{upstream=t-a-80}":           12,
		"portico_http_upstream_response_duration_seconds_bucket{upstream=t-a-80,le=0.005}": 1,
		"portico_http_telemetry_dropped_total{}":                                           7,
		"portico_http_request_duration_seconds_sum{ingress=shop/web}":                      0.002,
		"portico_http_request_bytes_total{ingress=shop/web}":                               1,
		"portico_http_upstream_response_duration_seconds_sum{upstream=t-a-80}":             0.002,
	} {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	tel.prune(map[string]bool{}, map[string]bool{"t-a-80": true})
	tel.prune(map[string]bool{}, map[string]bool{"t-a-80": true})
	got = series(t, tel)
	if _, ok := got["portico_http_requests_total{ingress=shop/web,status_class=2xx}"]; ok {
		t.Error("a deleted Ingress's series stay after two prunes without counts")
	}
	if _, ok := got["portico_http_requests_total{ingress=,status_class=2xx}"]; !ok {
		t.Error("the series of requests without an Ingress went")
	}
	if _, ok := got["portico_http_upstream_tries_total{upstream=t-a-80}"]; !ok {
		t.Error("an upstream the table still has lost its series")
	}
}
