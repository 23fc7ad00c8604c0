package agent

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/portico-edge/portico/controlplane"
	"github.com/portico-edge/portico/internal/version"
)

// start makes what the agent and the controller both begin with: a registry with
// the Go, process and build-info collectors, and the API server's clients.
func start(cfg Config) (*prometheus.Registry, kubernetes.Interface, dynamic.Interface, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), version.Collector())
	client, err := kubernetes.NewForConfig(cfg.Kube)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg.Kube)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("dynamic client: %w", err)
	}
	return reg, client, dyn, nil
}

// RunController runs the control plane alone, as the one that writes: it
// campaigns for the leader Lease and, while it holds it, makes the cluster-wide
// writes (allocations, bindings, statuses, Events, IngressClaims' Services and
// DaemonSets) that ReadOnly agents leave to it. It decides from the same flags as
// the agents (cfg), serves /metrics, /healthz and /readyz on cfg.MetricsAddr,
// and runs until ctx ends. identity names it in the Lease (its pod's name).
func RunController(ctx context.Context, cfg Config, identity string, log *zap.Logger) error {
	reg, client, dyn, err := start(cfg)
	if err != nil {
		return err
	}
	ccfg := controlplaneConfig(cfg, client, dyn, log, reg)
	ccfg.Identity = identity
	ctrl, err := controlplane.New(ccfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.MetricsAddr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.MetricsAddr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	ok := func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") }
	mux.HandleFunc("/healthz", ok)
	mux.HandleFunc("/readyz", ok)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	log.Info("controller started", zap.String("identity", identity), zap.String("metrics", cfg.MetricsAddr))
	return ctrl.Run(ctx)
}
