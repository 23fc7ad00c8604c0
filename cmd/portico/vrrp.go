package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/portico-edge/portico/vrrp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// runVRRP runs the VRRP announcer alone, without Kubernetes: one virtual router
// from flags, or any number from a JSON config file (see vrrp.Config).
func runVRRP(args []string) error {
	fs := flag.NewFlagSet("vrrp", flag.ContinueOnError)
	var (
		configPath   = fs.String("config", "", "JSON config file (vrrp.Config); replaces the single-router flags")
		iface        = fs.String("iface", "", "interface to run VRRP on")
		vrid         = fs.Uint("vrid", 0, "virtual router id, 1 to 255")
		version      = fs.Uint("version", 3, "VRRP version: 3, or 2 for keepalived interop (IPv4 only)")
		priority     = fs.Uint("priority", 100, "priority, 1 to 255 (255: address owner)")
		interval     = fs.Duration("advert-interval", time.Second, "advertisement interval (centiseconds in v3, whole seconds in v2)")
		vips         = fs.String("vip", "", "comma-separated virtual IPs (one family)")
		peers        = fs.String("peers", "", "comma-separated unicast peers; adverts go to them instead of the multicast group")
		anySource    = fs.Bool("accept-any-source", false, "with -peers, also accept adverts from sources that are not peers")
		noPreempt    = fs.Bool("no-preempt", false, "do not take over from a lower-priority Master")
		preemptDelay = fs.Duration("preempt-delay", 0, "hold preemption back this long after entering Backup")
		garpRefresh  = fs.Duration("garp-refresh", 10*time.Second, "period of the gratuitous ARP / NA refresh while Master (negative: none)")
		metricsAddr  = fs.String("metrics-addr", "", "serve Prometheus metrics on this address (e.g. 127.0.0.1:9105)")
		debug        = fs.Bool("debug", false, "debug logging")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	var cfg vrrp.Config
	if *configPath != "" {
		var err error
		if cfg, err = vrrp.LoadConfig(*configPath); err != nil {
			return err
		}
	} else {
		ic := vrrp.InstanceConfig{
			VRID:            uint8(*vrid),
			Version:         uint8(*version),
			Priority:        uint8(*priority),
			AdvertInterval:  vrrp.Duration{Duration: *interval},
			NoPreempt:       *noPreempt,
			PreemptDelay:    vrrp.Duration{Duration: *preemptDelay},
			AcceptAnySource: *anySource,
			GARPRefresh:     vrrp.Duration{Duration: *garpRefresh},
		}
		if *vrid > 255 || *version > 255 || *priority > 255 || *priority == 0 {
			return fmt.Errorf("vrid, version or priority out of range")
		}
		var err error
		if ic.VIPs, err = parseAddrs(*vips); err != nil {
			return fmt.Errorf("parse -vip: %w", err)
		}
		if ic.Peers, err = parseAddrs(*peers); err != nil {
			return fmt.Errorf("parse -peers: %w", err)
		}
		cfg = vrrp.Config{Interface: *iface, Instances: []vrrp.InstanceConfig{ic}}
	}
	zc := zap.NewProductionConfig()
	if *debug {
		zc.Level = zap.NewAtomicLevelAt(zap.DebugLevel)
	}
	log, err := zc.Build()
	if err != nil {
		return fmt.Errorf("build logger: %w", err)
	}
	defer log.Sync()
	reg := prometheus.NewRegistry()
	met, err := vrrp.NewMetrics(reg)
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
	a, err := vrrp.New(cfg, log.Named("vrrp"), met)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return a.Run(ctx)
}

func parseAddrs(s string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}
