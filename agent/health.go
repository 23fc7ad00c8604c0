package agent

import (
	"context"
	"fmt"
	"net/http"
	"net/http/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/portico-edge/portico/nginx"
)

// health decides whether this node should own its group's VIP: the XDP program
// attached, the maps holding the latest snapshot, and nginx serving the latest
// configuration. An unhealthy node lowers its VRRP priority, so a healthy node
// takes the VIP; /readyz reports the same.
type health struct {
	attached  func() bool   // xdp_lb is attached (nil: not checked)
	applied   func() bool   // the maps hold the latest snapshot
	checksum  func() string // the configuration nginx should serve; "" before the first
	statusURL string        // nginx's health endpoint: it answers with the checksum it serves
	client    http.Client
	stopping  atomic.Bool

	mu       sync.Mutex
	reason   string // "" when healthy
	failures int    // consecutive failed checks
}

// check returns why the node cannot serve right now, or "".
func (h *health) check(ctx context.Context) string {
	if h.stopping.Load() {
		return "shutting down"
	}
	if h.attached != nil && !h.attached() {
		return "xdp_lb is not attached"
	}
	if !h.applied() {
		return "data plane maps are not current"
	}
	want := h.checksum()
	if want == "" {
		return "nginx has no configuration yet"
	}
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	got, err := nginx.Health(cctx, &h.client, h.statusURL)
	if err != nil {
		return fmt.Sprintf("nginx unhealthy: %v", err)
	}
	if got != want {
		return "nginx is not serving the latest configuration"
	}
	return ""
}

// healthReasons name the node's reasons not to serve (health.check's, and
// "starting" before the first check) in a closed list, the reason label of
// portico_agent_unhealthy: each check's text has its code's prefix.
var healthReasons = []struct{ code, prefix string }{
	{"starting", "starting"},
	{"shutting_down", "shutting down"},
	{"xdp_detached", "xdp_lb is not attached"},
	{"maps_stale", "data plane maps are not current"},
	{"nginx_no_config", "nginx has no configuration yet"},
	{"nginx_down", "nginx unhealthy"},
	{"nginx_stale", "nginx is not serving the latest configuration"},
}

// reasonCode is the code of a reason health.check gave ("other" for one not
// in healthReasons, which a test rules out).
func reasonCode(reason string) string {
	for _, r := range healthReasons {
		if strings.HasPrefix(reason, r.prefix) {
			return r.code
		}
	}
	return "other"
}

var (
	healthyDesc = prometheus.NewDesc("portico_agent_healthy",
		"1 while the agent finds its node fit to serve (xdp_lb attached, the maps and nginx on the latest configuration: the VRRP priority, BGP preference and /readyz follow it), else 0.", nil, nil)
	unhealthyDesc = prometheus.NewDesc("portico_agent_unhealthy",
		"1 for the reason the node is unhealthy now, 0 for the others: starting, shutting_down (the agent stops: unready, its VIPs released), xdp_detached, maps_stale, nginx_no_config, nginx_down, nginx_stale (nginx is not serving the latest configuration).",
		[]string{"reason"}, nil)
)

// healthCollector serves the node's health as the health loop last saw it
// (the agent's shutdown at once).
type healthCollector struct{ h *health }

func (c healthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- healthyDesc
	ch <- unhealthyDesc
}

func (c healthCollector) Collect(ch chan<- prometheus.Metric) {
	if c.h == nil {
		return
	}
	reason := c.h.current()
	if c.h.stopping.Load() {
		reason = "shutting down"
	}
	ch <- prometheus.MustNewConstMetric(healthyDesc, prometheus.GaugeValue, boolValue(reason == ""))
	code := ""
	if reason != "" {
		code = reasonCode(reason)
	}
	for _, r := range healthReasons {
		ch <- prometheus.MustNewConstMetric(unhealthyDesc, prometheus.GaugeValue, boolValue(r.code == code), r.code)
	}
	if code == "other" {
		ch <- prometheus.MustNewConstMetric(unhealthyDesc, prometheus.GaugeValue, 1, code)
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// failuresToDegrade is how many consecutive failed checks (one a second) make
// the node unhealthy. A reload briefly shows old workers: one failed check must
// not move the VIP on every Ingress change.
const failuresToDegrade = 3

// observe records one check's result and returns the node's health after it:
// a healthy node turns unhealthy only after failuresToDegrade failed checks in
// a row; an unhealthy one turns healthy with the first good check. changed
// reports whether the reason differs from before.
func (h *health) observe(result string) (reason string, changed bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	reason = result
	if result == "" {
		h.failures = 0
	} else {
		h.failures++
		// A healthy node stays healthy until the failure persists: a single
		// failed check may be a reload in progress.
		if h.failures < failuresToDegrade && h.reason == "" {
			reason = ""
		}
	}
	changed = reason != h.reason
	h.reason = reason
	return reason, changed
}

// loop re-checks every second and hands each change of health to setHealthy
// (the VRRP priority).
func (h *health) loop(ctx context.Context, setHealthy func(context.Context, bool), log *zap.Logger) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		if reason, changed := h.observe(h.check(ctx)); changed {
			if reason == "" {
				log.Info("node healthy")
			} else {
				log.Warn("node unhealthy", zap.String("reason", reason))
			}
			setHealthy(ctx, reason == "")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (h *health) current() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.reason
}

func (h *health) mux(reg *prometheus.Registry, withPprof bool) *http.ServeMux {
	m := http.NewServeMux()
	m.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	if withPprof {
		m.HandleFunc("/debug/pprof/", pprof.Index)
		m.HandleFunc("/debug/pprof/profile", pprof.Profile)
		m.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		m.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	m.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	m.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		reason := h.current()
		if h.stopping.Load() {
			reason = "shutting down"
		}
		if reason != "" {
			http.Error(w, reason, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return m
}
