package steer

import "github.com/prometheus/client_golang/prometheus"

// Collector exports the program's verdicts and its listeners, read at scrape
// time.
type Collector struct {
	s         *Steering
	verdicts  *prometheus.Desc
	listeners *prometheus.Desc
}

// NewCollector returns a Collector of s.
func NewCollector(s *Steering) *Collector {
	return &Collector{s: s,
		verdicts: prometheus.NewDesc("portico_l4_steer_connections_total",
			"Listener lookups of TCP packets to L4 Services' VIPs and ports (new connections, and the data plane's own socket lookups), by what sk_steer did: steered (to nginx's listener), no_listener (refused: nginx's listener not known), assign_failed, direct (to a listener's own port: dropped).",
			[]string{"verdict"}, nil),
		listeners: prometheus.NewDesc("portico_l4_steer_listeners",
			"nginx's steered listeners the program knows (of 4: plain and PROXY, IPv4 and IPv6).", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.verdicts
	ch <- c.listeners
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	if n, err := c.s.Counts(); err == nil {
		for _, v := range []struct {
			name string
			n    uint64
		}{{"steered", n.Steered}, {"no_listener", n.NoListener}, {"assign_failed", n.AssignFailed}, {"direct", n.Direct}} {
			ch <- prometheus.MustNewConstMetric(c.verdicts, prometheus.CounterValue, float64(v.n), v.name)
		}
	}
	known := 0
	for _, ok := range c.s.Listeners() {
		if ok {
			known++
		}
	}
	ch <- prometheus.MustNewConstMetric(c.listeners, prometheus.GaugeValue, float64(known))
}
