package agent

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"
)

// newSpillGauge is portico_site_spill_ratio (buildSites).
func newSpillGauge() prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Name: "portico_site_spill_ratio",
		Help: "The share of this edge's new connections it spills to another site above its capacity (federation overflow)."})
}

// DescribeMetrics registers on reg the series every agent defines itself (the
// packages it builds on have their own DescribeMetrics or NewMetrics), with
// no values behind them: for the generated metrics table (hack/metricsdoc).
func DescribeMetrics(reg prometheus.Registerer) error {
	for _, c := range slices.Concat([]prometheus.Collector{healthCollector{}}, newPeerMetrics().collectors(), newHeldMetrics().collectors()) {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// DescribeSiteMetrics is DescribeMetrics for the series of an agent in a
// federation (--federation-peers).
func DescribeSiteMetrics(reg prometheus.Registerer) error {
	return reg.Register(newSpillGauge())
}
