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
	"k8s.io/klog/v2"

	"github.com/portico-edge/portico/federation"
)

// runFederation runs the FederatedIngress controller against the host cluster.
func runFederation(args []string) error {
	fs := flag.NewFlagSet("federation", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "the host cluster's kubeconfig; empty: in-cluster config")
	namespace := fs.String("namespace", "portico-federation", "namespace of the member cluster Secrets (labelled "+federation.LabelMember+")")
	resync := fs.Duration("resync", 10*time.Second, "how often every site's status is read again")
	metricsAddr := fs.String("metrics-addr", ":9102", "address of /metrics (empty: none)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %v", fs.Args())
	}
	log, err := newLogger(*logLevel)
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
		Registerer: reg, Resync: *resync})
	if err != nil {
		return err
	}
	stopMetrics, err := serveMetrics(*metricsAddr, reg, log)
	if err != nil {
		return err
	}
	defer stopMetrics()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return ctrl.Run(ctx)
}
