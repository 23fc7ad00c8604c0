package federation

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/portico-edge/portico/api/v1alpha1"
)

type metrics struct {
	syncs        *prometheus.CounterVec
	propagations *prometheus.CounterVec
}

// sitesDesc is the sites gauge, computed on scrape from the cached objects' status
// (nothing to keep in step on every sync).
var sitesDesc = prometheus.NewDesc("portico_federation_sites",
	"Placed sites of all FederatedIngresses by state (propagated, pending, error).", []string{"state"}, nil)

// Describe and Collect make the controller the sites gauge's collector.
func (c *Controller) Describe(ch chan<- *prometheus.Desc) { ch <- sitesDesc }

func (c *Controller) Collect(ch chan<- prometheus.Metric) {
	counts := map[string]float64{"propagated": 0, "pending": 0, "error": 0}
	for _, obj := range c.fisAll() {
		fi := &v1alpha1.FederatedIngress{}
		if runtime.DefaultUnstructuredConverter.FromUnstructured(obj.(*unstructured.Unstructured).Object, fi) != nil {
			continue
		}
		for _, s := range fi.Status.Sites {
			switch {
			case s.Error != "":
				counts["error"]++
			case s.PropagatedGeneration == fi.Generation:
				counts["propagated"]++
			default:
				counts["pending"]++
			}
		}
	}
	for state, n := range counts {
		ch <- prometheus.MustNewConstMetric(sitesDesc, prometheus.GaugeValue, n, state)
	}
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "portico", "federation"
	m := &metrics{
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "syncs_total",
			Help: "FederatedIngress syncs by result (ok, error)."}, []string{"result"}),
		propagations: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "propagations_total",
			Help: "Writes of a member's Ingress by action (apply, delete) and result (ok, error)."}, []string{"action", "result"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.syncs, m.propagations} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// DescribeMetrics registers on reg this package's series, with no values
// behind them: for the generated metrics table (hack/metricsdoc).
// The sites gauge is described by a Controller with nothing behind it: reg
// must not gather it.
func DescribeMetrics(reg prometheus.Registerer) error {
	if _, err := newMetrics(reg); err != nil {
		return err
	}
	return reg.Register(&Controller{})
}
