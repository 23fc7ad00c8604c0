package vrrp

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the announcer's Prometheus series (namespace portico, subsystem
// vrrp). Labels are bounded: instance names come from the configuration, reasons
// and kinds from closed lists.
type Metrics struct {
	state           *prometheus.GaugeVec
	priority        *prometheus.GaugeVec
	transitions     *prometheus.CounterVec
	advertsSent     *prometheus.CounterVec
	advertsReceived *prometheus.CounterVec
	advertsRejected *prometheus.CounterVec
	addressMismatch *prometheus.CounterVec
	garpSent        *prometheus.CounterVec
	conflicts       *prometheus.CounterVec
}

// NewMetrics creates the series and registers them with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "portico", Subsystem: "vrrp", Name: name, Help: help}
	}
	m := &Metrics{
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts(opts("state",
			"Current state of each virtual router: 0 init, 1 backup, 2 master.")), []string{"instance"}),
		priority: prometheus.NewGaugeVec(prometheus.GaugeOpts(opts("priority",
			"Effective priority of each virtual router.")), []string{"instance"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts(opts("transitions_total",
			"State transitions.")), []string{"instance", "from", "to"}),
		advertsSent: prometheus.NewCounterVec(prometheus.CounterOpts(opts("adverts_sent_total",
			"Adverts sent.")), []string{"instance"}),
		advertsReceived: prometheus.NewCounterVec(prometheus.CounterOpts(opts("adverts_received_total",
			"Valid adverts received.")), []string{"instance"}),
		advertsRejected: prometheus.NewCounterVec(prometheus.CounterOpts(opts("adverts_rejected_total",
			"Adverts rejected, by reason.")), []string{"reason"}),
		addressMismatch: prometheus.NewCounterVec(prometheus.CounterOpts(opts("adverts_address_mismatch_total",
			"Version 3 adverts accepted although their address list differs from ours (it shares an address with it): the list is changing, or the routers disagree.")), []string{"instance"}),
		garpSent: prometheus.NewCounterVec(prometheus.CounterOpts(opts("gratuitous_sent_total",
			"Gratuitous ARP requests and replies and unsolicited neighbour advertisements sent.")), []string{"instance", "kind"}),
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts(opts("conflicts_total",
			"ARP replies or neighbour advertisements claiming one of our VIPs from a foreign MAC while Master.")), []string{"instance"}),
	}
	for _, c := range []prometheus.Collector{m.state, m.priority, m.transitions, m.advertsSent, m.advertsReceived, m.advertsRejected, m.addressMismatch, m.garpSent, m.conflicts} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register vrrp metrics: %w", err)
		}
	}
	for _, r := range Reasons {
		m.advertsRejected.WithLabelValues(string(r))
	}
	return m, nil
}
