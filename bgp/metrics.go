package bgp

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the speaker's Prometheus series (namespace portico, subsystem
// bgp). Labels are bounded: peer is a configured peer address, to a session or
// BFD state from a closed list, preference one of Preferences.
type Metrics struct {
	sessionTransitions *prometheus.CounterVec
	bfdTransitions     *prometheus.CounterVec
	established        prometheus.Gauge
	sessionUp          *prometheus.GaugeVec
	announced          *prometheus.GaugeVec
	peers              prometheus.Gauge
	peerChanges        *prometheus.CounterVec
}

// Peer changes of Reconfigure, as the metric names them.
const (
	peerAdded     = "added"
	peerRemoved   = "removed"
	peerUpdated   = "updated"   // its session stays
	peerRestarted = "restarted" // updated in what the OPEN carries: its session restarts
	peerFailed    = "failed"    // GoBGP refused the change
)

// NewMetrics creates the series and registers them with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "portico", Subsystem: "bgp", Name: name, Help: help}
	}
	m := &Metrics{
		sessionTransitions: prometheus.NewCounterVec(prometheus.CounterOpts(opts("session_transitions_total",
			"BGP session state changes, by peer and new state.")), []string{"peer", "to"}),
		bfdTransitions: prometheus.NewCounterVec(prometheus.CounterOpts(opts("bfd_transitions_total",
			"BFD session state changes, by peer and new state.")), []string{"peer", "to"}),
		established: prometheus.NewGauge(prometheus.GaugeOpts(opts("established_sessions",
			"BGP sessions in the established state."))),
		sessionUp: prometheus.NewGaugeVec(prometheus.GaugeOpts(opts("session_up",
			"1 while the BGP session with a configured peer is established, else 0, by peer (the alert \"peer X is down\").")), []string{"peer"}),
		announced: prometheus.NewGaugeVec(prometheus.GaugeOpts(opts("announced_prefixes",
			"Prefixes announced, by preference.")), []string{"preference"}),
		peers: prometheus.NewGauge(prometheus.GaugeOpts(opts("peers",
			"Peers the speaker is configured with (the --bgp-config file's and the BGPPeer objects' for this node)."))),
		peerChanges: prometheus.NewCounterVec(prometheus.CounterOpts(opts("peer_changes_total",
			"Peers added, removed or changed while the speaker runs, by change: added, removed, updated (the session stays), restarted (a change the session's OPEN carries: ASN, password, port, multihop), failed.")), []string{"change"}),
	}
	for _, c := range []prometheus.Collector{m.sessionTransitions, m.bfdTransitions, m.established, m.sessionUp, m.announced, m.peers, m.peerChanges} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register bgp metrics: %w", err)
		}
	}
	for _, p := range Preferences {
		if p != Withdrawn {
			m.announced.WithLabelValues(p.String())
		}
	}
	for _, c := range []string{peerAdded, peerRemoved, peerUpdated, peerRestarted, peerFailed} {
		m.peerChanges.WithLabelValues(c)
	}
	return m, nil
}
