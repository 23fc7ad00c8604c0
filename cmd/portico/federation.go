package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/zapr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
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
	if *metricsAddr != "" {
		ln, err := net.Listen("tcp", *metricsAddr)
		if err != nil {
			return fmt.Errorf("listen for metrics: %w", err)
		}
		srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("serve metrics", zap.Error(err))
			}
		}()
		defer srv.Close()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return ctrl.Run(ctx)
}
