package nginx

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Reload results (the result label of portico_nginx_reloads_total).
const (
	ResultSuccess     = "success"     // validated, swapped, signalled and serving
	ResultInvalid     = "invalid"     // nginx -t rejected the candidate; the old config runs
	ResultError       = "error"       // writing files or signalling nginx failed
	ResultUnconfirmed = "unconfirmed" // signalled, but new workers were not seen serving in time
)

type metrics struct {
	reloads        *prometheus.CounterVec
	configBytes    prometheus.Gauge
	lastSuccess    prometheus.Gauge
	renderDuration prometheus.Histogram
	reloadDuration prometheus.Histogram
	restarts       prometheus.Counter
	problems       *prometheus.GaugeVec

	tableUpdates        *prometheus.CounterVec
	tableUpdateDuration prometheus.Histogram
	drainingEnded       prometheus.Counter

	certExpiry *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "portico", "nginx"
	m := &metrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "reloads_total",
			Help: "Configuration changes applied to nginx, by result (success, invalid, error, unconfirmed).",
		}, []string{"result"}),
		configBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "config_bytes",
			Help: "Size of the configuration nginx runs.",
		}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "last_reload_success_timestamp_seconds",
			Help: "Unix time of the last successful reload.",
		}),
		renderDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "render_duration_seconds",
			Help:    "Time to render a configuration from the model.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		reloadDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "reload_duration_seconds",
			Help:    "Time from the reload signal until only workers with the new configuration accept connections.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
		}),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "master_restarts_total",
			Help: "Times the nginx master exited unexpectedly and was started again.",
		}),
		problems: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "problems",
			Help: "Parts of the model left out of the running configuration, by reason.",
		}, []string{"reason"}),
		tableUpdates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "table_updates_total",
			Help: "Changes of hosts, paths, certificates or endpoints applied without a reload, by result (success, error).",
		}, []string{"result"}),
		tableUpdateDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "table_update_duration_seconds",
			Help:    "Time to hand a change of the table to nginx, after which every worker uses it.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14),
		}),
		drainingEnded: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "draining_workers_ended_total",
			Help: "Workers a reload replaced that were ended with the connections they held, because more than the bound (ReloaderConfig.MaxDraining) still drained.",
		}),
		// Not in the subsystem: the name operators alert on (a certificate
		// about to expire).
		certExpiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: "tls", Name: "certificate_expiry_timestamp_seconds",
			Help: "Unix time when the leaf certificate of each TLS Secret this edge's nginx serves expires (its NotAfter), by the Secret's namespace (secret_namespace: Prometheus gives a target's own namespace the label namespace) and name; the series goes when no host uses the Secret any more.",
		}, []string{"secret_namespace", "secret"}),
	}
	for _, c := range []prometheus.Collector{m.certExpiry, m.drainingEnded, m.reloads, m.configBytes, m.lastSuccess, m.renderDuration, m.reloadDuration, m.restarts, m.problems,
		m.tableUpdates, m.tableUpdateDuration} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, r := range []string{ResultSuccess, ResultInvalid, ResultError, ResultUnconfirmed} {
		m.reloads.WithLabelValues(r)
	}
	for _, r := range []string{ResultSuccess, ResultError} {
		m.tableUpdates.WithLabelValues(r)
	}
	return m, nil
}
