package agent

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
)

// TestHealthObserve feeds sequences of check results through the health state
// and checks the node's health after each: three failures in a row before a
// healthy node turns unhealthy, one good check to recover.
func TestHealthObserve(t *testing.T) {
	const bad, worse = "nginx unhealthy", "xdp_lb is not attached"
	type step struct {
		result  string // what the check found
		reason  string // the node's health after it
		changed bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{name: "starting, then healthy", steps: []step{
			{result: "", reason: "", changed: true},
			{result: "", reason: "", changed: false},
		}},
		{name: "failing while starting counts at once", steps: []step{
			{result: bad, reason: bad, changed: true},
			{result: "", reason: "", changed: true},
		}},
		{name: "degraded after three failures in a row", steps: []step{
			{result: "", reason: "", changed: true},
			{result: bad, reason: ""},
			{result: bad, reason: ""},
			{result: bad, reason: bad, changed: true},
			{result: bad, reason: bad},
			{result: "", reason: "", changed: true},
		}},
		{name: "a good check resets the count", steps: []step{
			{result: "", reason: "", changed: true},
			{result: bad, reason: ""},
			{result: bad, reason: ""},
			{result: "", reason: ""},
			{result: bad, reason: ""},
			{result: bad, reason: ""},
			{result: worse, reason: worse, changed: true},
		}},
		{name: "an unhealthy node reports the latest reason", steps: []step{
			{result: bad, reason: bad, changed: true},
			{result: worse, reason: worse, changed: true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &health{reason: "starting"}
			var got []step
			for _, s := range tc.steps {
				reason, changed := h.observe(s.result)
				got = append(got, step{result: s.result, reason: reason, changed: changed})
			}
			if diff := cmp.Diff(tc.steps, got, cmp.AllowUnexported(step{})); diff != "" {
				t.Errorf("health after each check (-want +got):\n%s", diff)
			}
		})
	}
}

// TestHealthCheck runs the node check against injected parts and a fake nginx
// health endpoint, which answers with the checksum nginx serves.
func TestHealthCheck(t *testing.T) {
	serving := "abc123"
	nginxUp := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !nginxUp {
			http.Error(w, "down", http.StatusBadGateway)
			return
		}
		fmt.Fprintln(w, serving)
	}))
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		name     string
		stopping bool
		attached bool
		applied  bool
		checksum string
		nginxUp  bool
		want     string // a prefix of the reason; "" when healthy
	}{
		{name: "healthy", attached: true, applied: true, checksum: serving, nginxUp: true, want: ""},
		{name: "shutting down", stopping: true, attached: true, applied: true, checksum: serving, nginxUp: true, want: "shutting down"},
		{name: "detached", applied: true, checksum: serving, nginxUp: true, want: "xdp_lb is not attached"},
		{name: "maps stale", attached: true, checksum: serving, nginxUp: true, want: "data plane maps are not current"},
		{name: "no configuration", attached: true, applied: true, nginxUp: true, want: "nginx has no configuration yet"},
		{name: "nginx down", attached: true, applied: true, checksum: serving, want: "nginx unhealthy: "},
		{name: "old configuration", attached: true, applied: true, checksum: "def456", nginxUp: true, want: "nginx is not serving the latest configuration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nginxUp = tc.nginxUp
			h := &health{
				attached:  func() bool { return tc.attached },
				applied:   func() bool { return tc.applied },
				checksum:  func() string { return tc.checksum },
				statusURL: srv.URL,
			}
			h.stopping.Store(tc.stopping)
			got := h.check(context.Background())
			if tc.want == "" && got != "" || !strings.HasPrefix(got, tc.want) {
				t.Errorf("check = %q, want %q", got, tc.want)
			}
			if got != "" && reasonCode(got) == "other" {
				t.Errorf("check = %q: no code in healthReasons (portico_agent_unhealthy's reason)", got)
			}
		})
	}
}

// TestHealthMux: /readyz follows the node's health and turns unready at once on
// shutdown; /healthz only says the process answers.
func TestHealthMux(t *testing.T) {
	h := &health{reason: "starting"}
	m := h.mux(prometheus.NewRegistry(), false)
	get := func(path string) (int, string) {
		w := httptest.NewRecorder()
		m.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		return w.Code, strings.TrimSpace(w.Body.String())
	}
	for _, tc := range []struct {
		name     string
		result   string // one check's result, observed first
		stopping bool
		path     string
		code     int
		body     string
	}{
		{name: "starting", result: "nginx has no configuration yet", path: "/readyz", code: http.StatusServiceUnavailable, body: "nginx has no configuration yet"},
		{name: "live while unready", result: "nginx has no configuration yet", path: "/healthz", code: http.StatusOK, body: "ok"},
		{name: "ready", path: "/readyz", code: http.StatusOK, body: "ready"},
		{name: "stopping", stopping: true, path: "/readyz", code: http.StatusServiceUnavailable, body: "shutting down"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.observe(tc.result)
			h.stopping.Store(tc.stopping)
			if code, body := get(tc.path); code != tc.code || body != tc.body {
				t.Errorf("GET %s = %d %q, want %d %q", tc.path, code, body, tc.code, tc.body)
			}
		})
	}
	if code, _ := get("/metrics"); code != http.StatusOK {
		t.Errorf("GET /metrics = %d", code)
	}
}

// TestHealthMetrics: portico_agent_healthy follows the node's verdict (after
// failuresToDegrade failed checks) and at once the agent's shutdown, and
// portico_agent_unhealthy names the reason from a closed list
// (TestHealthCheck: every reason check gives has its code).
func TestHealthMetrics(t *testing.T) {
	h := &health{reason: "starting"}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(healthCollector{h})
	read := func() (healthy float64, reasons map[string]float64) {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		healthy, reasons = -1, map[string]float64{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				switch mf.GetName() {
				case "portico_agent_healthy":
					healthy = m.GetGauge().GetValue()
				case "portico_agent_unhealthy":
					reasons[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
		return healthy, reasons
	}
	want := func(code string) map[string]float64 {
		out := map[string]float64{}
		for _, r := range healthReasons {
			out[r.code] = 0
		}
		if code != "" {
			out[code] = 1
		}
		return out
	}
	for _, step := range []struct {
		name     string
		result   string // a check's result, observed first ("-": none)
		stopping bool
		healthy  float64
		reason   string
	}{
		{name: "before the first check", result: "-", reason: "starting"},
		{name: "healthy", healthy: 1},
		{name: "one failed check", result: "nginx unhealthy: connection refused", healthy: 1},
		{name: "two", result: "nginx unhealthy: connection refused", healthy: 1},
		{name: "three", result: "nginx unhealthy: connection refused", reason: "nginx_down"},
		{name: "another reason", result: "data plane maps are not current", reason: "maps_stale"},
		{name: "healthy again", healthy: 1},
		{name: "stopping", result: "-", stopping: true, reason: "shutting_down"},
	} {
		if step.result != "-" {
			h.observe(step.result)
		}
		h.stopping.Store(step.stopping)
		healthy, reasons := read()
		if healthy != step.healthy {
			t.Errorf("%s: portico_agent_healthy = %v, want %v", step.name, healthy, step.healthy)
		}
		if d := cmp.Diff(want(step.reason), reasons); d != "" {
			t.Errorf("%s: portico_agent_unhealthy (-want +got):\n%s", step.name, d)
		}
	}
}
