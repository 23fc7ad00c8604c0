package liveness

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the checker's series (namespace portico, subsystem liveness).
// Labels come from closed lists: no replica addresses.
type metrics struct {
	probes      *prometheus.CounterVec
	transitions *prometheus.CounterVec
	replicas    *prometheus.GaugeVec
	faults      prometheus.Counter
	stalls      prometheus.Counter
	fallback    prometheus.Gauge
	calledDown  prometheus.Gauge
	learned     prometheus.Counter
	holds       prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "portico", Subsystem: "liveness", Name: name, Help: help}
	}
	m := &metrics{
		probes: prometheus.NewCounterVec(prometheus.CounterOpts(opts("probes_total",
			"Liveness probes of replicas' nginx, by result.")), []string{"result"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts(opts("transitions_total",
			"Replicas that went dead or came back live, as this node sees them.")), []string{"to"}),
		replicas: prometheus.NewGaugeVec(prometheus.GaugeOpts(opts("replicas",
			"Replicas checked, by verdict (fallback: the checker failed for it and Kubernetes' view holds).")), []string{"state"}),
		faults: prometheus.NewCounter(prometheus.CounterOpts(opts("checker_faults_total",
			"Failures of the checker itself (sockets, a panic, a stalled loop); each falls back to Kubernetes' view."))),
		stalls: prometheus.NewCounter(prometheus.CounterOpts(opts("checker_stalls_total",
			"Times the checker's own loop ran late; the silence of replicas during the stall was not held against them."))),
		fallback: prometheus.NewGauge(prometheus.GaugeOpts(opts("fallback",
			"1 while the checker as a whole has failed and every replica Kubernetes lists ready is used."))),
		calledDown: prometheus.NewGauge(prometheus.GaugeOpts(opts("called_down",
			"1 while most other edges call this node's own replica down (their probes' answers say so): its rings follow them."))),
		learned: prometheus.NewCounter(prometheus.CounterOpts(opts("called_down_transitions_total",
			"Times this node learned that the other edges call its replica down, or up again."))),
		holds: prometheus.NewCounter(prometheus.CounterOpts(opts("reload_holds_total",
			"Probes that waited on a replica which had ended its connection itself (an nginx reload or restart) and accepted a new one; its verdict was held meanwhile, up to the reload grace."))),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.probes, m.transitions, m.replicas, m.faults, m.stalls, m.fallback, m.calledDown, m.learned, m.holds} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register liveness metrics: %w", err)
		}
	}
	for _, r := range Results {
		m.probes.WithLabelValues(string(r))
	}
	for _, to := range []string{"live", "dead"} {
		m.transitions.WithLabelValues(to)
	}
	return m, nil
}

// DescribeMetrics registers on reg this package's series, with no values
// behind them: for the generated metrics table (hack/metricsdoc).
func DescribeMetrics(reg prometheus.Registerer) error {
	_, err := newMetrics(reg)
	return err
}
