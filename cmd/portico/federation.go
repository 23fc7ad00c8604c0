package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/zapr"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/federation"
	"github.com/portico-edge/portico/federation/gslb"
)

// runFederation runs the FederatedIngress controller against the host cluster, or
// with "dns" a site's DNS server (federation/gslb) in a member cluster.
func runFederation(args []string) error {
	if len(args) > 0 && args[0] == "dns" {
		return runFederationDNS(args[1:])
	}
	fs := flag.NewFlagSet("federation", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "the host cluster's kubeconfig; empty: in-cluster config")
	namespace := fs.String("namespace", "portico-federation", "namespace of the member cluster Secrets (labelled "+v1alpha1.LabelMemberCluster+")")
	resync := fs.Duration("resync", 10*time.Second, "how often every site's status is read again")
	drainLead := fs.Duration("drain-lead", federation.DrainLead, "a site's drain (portico.io/drain=true on its member Secret) begins this long after it is asked for, so every site's agents have read it first")
	metricsAddr := fs.String("metrics-addr", ":9102", "address of /metrics (empty: none)")
	level := &logLevel{zapcore.InfoLevel}
	fs.Var(level, "log-level", "debug, info (the default), warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %v", fs.Args())
	}
	log, err := newLogger(*level)
	if err != nil {
		return err
	}
	defer log.Sync()
	klog.SetLogger(zapr.NewLogger(log.Named("k8s")))
	host, err := kubeConfig(*kubeconfig, "")
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	ctrl, err := federation.New(federation.Config{Host: host, Namespace: *namespace, Logger: log.Named("federation"),
		Registerer: reg, Resync: *resync, DrainLead: *drainLead})
	if err != nil {
		return err
	}
	return untilSignal(*metricsAddr, reg, log, ctrl.Run)
}

// runFederationDNS runs one site's authoritative DNS server for the federated names,
// judging its own site by the agents' status Leases of its cluster.
func runFederationDNS(args []string) error {
	fs := flag.NewFlagSet("federation dns", flag.ContinueOnError)
	config := fs.String("config", "", "the site's gslb configuration (YAML: self, names, sites, ttl, ...)")
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "the member cluster's kubeconfig; empty: in-cluster config")
	agents := fs.String("agents-namespace", "portico-system", "namespace of the site's Portico agents (their status Leases)")
	dnsAddr := fs.String("dns-addr", ":53", "address of the DNS server (UDP and TCP)")
	healthAddr := fs.String("health-addr", ":8053", "address of GET /health, which the other sites probe")
	metricsAddr := fs.String("metrics-addr", ":9103", "address of /metrics (empty: none)")
	level := &logLevel{zapcore.InfoLevel}
	fs.Var(level, "log-level", "debug, info (the default), warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *config == "" || fs.NArg() > 0 {
		return fmt.Errorf("-config is required, and nothing else after the flags")
	}
	log, err := newLogger(*level)
	if err != nil {
		return err
	}
	defer log.Sync()
	klog.SetLogger(zapr.NewLogger(log.Named("k8s")))
	cfg, err := gslb.LoadFile(*config)
	if err != nil {
		return err
	}
	kc, err := kubeConfig(*kubeconfig, "")
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(kc)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	cfg.OwnHealth = gslb.AgentsHealth(client, *agents)
	reg := prometheus.NewRegistry()
	srv, err := gslb.New(cfg, log.Named("gslb"), reg)
	if err != nil {
		return err
	}
	return untilSignal(*metricsAddr, reg, log, func(ctx context.Context) error { return srv.Run(ctx, *dnsAddr, *healthAddr) })
}

// untilSignal serves reg's metrics on metricsAddr and runs run until SIGINT or SIGTERM.
func untilSignal(metricsAddr string, reg *prometheus.Registry, log *zap.Logger, run func(context.Context) error) error {
	stopMetrics, err := serveMetrics(metricsAddr, reg, log)
	if err != nil {
		return err
	}
	defer stopMetrics()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return run(ctx)
}
