package controlplane

import (
	"maps"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/portico-edge/portico/controlplane/model"
)

// metrics are the control plane's Prometheus series (namespace portico, subsystem
// controlplane). Labels are bounded: kinds, problem reasons, sink names, results.
type metrics struct {
	syncDuration prometheus.Histogram
	syncs        *prometheus.CounterVec
	objects      *prometheus.GaugeVec
	problems     *prometheus.GaugeVec
	sinkApplies  *prometheus.CounterVec
	writes       *prometheus.CounterVec
	leader       prometheus.Gauge
	poolAddrs    *prometheus.GaugeVec
}

// newMetrics registers the series; agents serves portico_controlplane_agents.
func newMetrics(reg prometheus.Registerer, queueDepth func() float64, agents *agentsCollector) (*metrics, error) {
	const ns, sub = "portico", "controlplane"
	m := &metrics{
		syncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "sync_duration_seconds",
			Help: "Time to list the informer caches, build the snapshot and (as leader) write back.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "syncs_total",
			Help: "Syncs by result: changed (a new snapshot went to the sinks), unchanged, error, invalid (a snapshot that fails Validate, a bug: not published)."}, []string{"result"}),
		objects: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "objects",
			Help: "Objects in the informer caches by kind."}, []string{"kind"}),
		problems: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "problems",
			Help: "Problems in the last build by reason."}, []string{"reason"}),
		sinkApplies: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "sink_applies_total",
			Help: "Snapshot deliveries to sinks by sink and result."}, []string{"sink", "result"}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "writes_total",
			Help: "Cluster-wide writes made as leader by kind of write and result."}, []string{"write", "result"}),
		// Not in the subsystem: the name operators alert on (the pool
		// exhausted), whichever process serves it.
		poolAddrs: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "pool_addresses",
			Help: "Addresses of each VIP pool (a VIPPool's name, or \"--vip-pool <prefix>\") by family and state: used (a VIP served now) or free (neither used, excluded, nor a network, broadcast or IPv6 subnet-router address; counted exactly up to 4,096 addresses a prefix, above that less the excluded prefixes' sizes)."},
			[]string{"pool", "family", "state"}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "leader",
			Help: "1 while this instance holds the leader Lease."}),
	}
	depth := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "queue_depth",
		Help: "Items waiting in the sync workqueue."}, queueDepth)
	for _, c := range []prometheus.Collector{m.syncDuration, m.syncs, m.objects, m.problems, m.sinkApplies, m.writes, m.leader, m.poolAddrs, depth, agents} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// observePools sets the pools' usage from the snapshot the sinks serve.
func (c *Controller) observePools(pools Pools, snap model.Snapshot) {
	c.metrics.poolAddrs.Reset()
	// A pool's size takes up to 4,096 steps a prefix to count: once per pool,
	// not on every sync (an endpoint change is one). Only the build worker
	// runs this.
	if c.poolSizes == nil {
		c.poolSizes = map[string]float64{}
	}
	seen := map[string]bool{}
	size := func(p Pool) float64 {
		k := p.String()
		seen[k] = true
		n, ok := c.poolSizes[k]
		if !ok {
			n = p.size()
			c.poolSizes[k] = n
		}
		return n
	}
	usage := poolUsage(pools, snap, size)
	maps.DeleteFunc(c.poolSizes, func(k string, _ float64) bool { return !seen[k] })
	for k, v := range usage {
		c.metrics.poolAddrs.WithLabelValues(k[0], k[1], "used").Set(v[0])
		c.metrics.poolAddrs.WithLabelValues(k[0], k[1], "free").Set(v[1])
	}
}

// observe sets the counts of cached objects and of the problems.
func (c *Controller) observe(st State, problems []model.Problem) {
	for kind, n := range map[string]int{
		"IngressClass": len(st.IngressClasses), "Ingress": len(st.Ingresses), "Service": len(st.Services),
		"EndpointSlice": len(st.EndpointSlices), "Secret": len(st.Secrets), "Pod": len(st.Pods), "Node": len(st.Nodes),
	} {
		c.metrics.objects.WithLabelValues(kind).Set(float64(n))
	}
	if c.claimInformer != nil {
		c.metrics.objects.WithLabelValues("IngressClaim").Set(float64(len(c.claimInformer.GetStore().List())))
	}
	c.metrics.problems.Reset()
	for _, p := range problems {
		c.metrics.problems.WithLabelValues(string(p.Reason)).Inc()
	}
}

// DescribeMetrics registers on reg this package's series, with no values
// behind them: for the generated metrics table (hack/metricsdoc).
func DescribeMetrics(reg prometheus.Registerer) error {
	_, err := newMetrics(reg, func() float64 { return 0 }, &agentsCollector{})
	return err
}
