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

// vrrpFlags are `portico vrrp`'s settings besides the announcer's own.
type vrrpFlags struct {
	metricsAddr string
	debug       bool
}

// parseVRRPFlags turns `portico vrrp`'s arguments into an announcer config: one
// virtual router from flags, or any number from a JSON file (see vrrp.Config).
// Flags left out stay zero, so vrrp.Config.SetDefaults is the one place defaults
// live; single-router flags next to -config are an error, not silently dropped.
func parseVRRPFlags(args []string) (vrrp.Config, vrrpFlags, error) {
	fs := flag.NewFlagSet("vrrp", flag.ContinueOnError)
	var (
		f            vrrpFlags
		configPath   = fs.String("config", "", "JSON config file (vrrp.Config); replaces the single-router flags")
		iface        = fs.String("iface", "", "interface to run VRRP on")
		vrid         = fs.Uint("vrid", 0, "virtual router id, 1 to 255")
		version      = fs.Uint("version", 0, "VRRP version: 3 (default), or 2 for keepalived interop (IPv4 only)")
		priority     = fs.Uint("priority", 0, "priority, 1 to 255 (default 100; 255: address owner)")
		interval     = fs.Duration("advert-interval", 0, "advertisement interval, default 1s (centiseconds in v3, whole seconds in v2)")
		vips         = fs.String("vip", "", "comma-separated virtual IPs (one family)")
		peers        = fs.String("peers", "", "comma-separated unicast peers (IPv6: their fe80:: link-local addresses); adverts go to them instead of the multicast group")
		anySource    = fs.Bool("accept-any-source", false, "with -peers, also accept adverts from sources that are not peers")
		noPreempt    = fs.Bool("no-preempt", false, "do not take over from a lower-priority Master")
		preemptDelay = fs.Duration("preempt-delay", 0, "hold preemption back this long after entering Backup")
		garpRefresh  = fs.Duration("garp-refresh", 0, "period of the gratuitous ARP / NA refresh while Master, default 10s (negative: none)")
	)
	fs.StringVar(&f.metricsAddr, "metrics-addr", "", "serve Prometheus metrics on this address (e.g. 127.0.0.1:9105)")
	fs.BoolVar(&f.debug, "debug", false, "debug logging")
	if err := fs.Parse(args); err != nil {
		return vrrp.Config{}, f, err
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if *configPath != "" {
		var extra []string
		for name := range set {
			if name != "config" && name != "metrics-addr" && name != "debug" {
				extra = append(extra, "-"+name)
			}
		}
		if len(extra) > 0 {
			return vrrp.Config{}, f, fmt.Errorf("%s cannot be combined with -config (put them in the file)", strings.Join(extra, ", "))
		}
		cfg, err := vrrp.LoadConfig(*configPath)
		return cfg, f, err
	}
	if *vrid > 255 || *version > 255 || *priority > 255 || (set["priority"] && *priority == 0) {
		return vrrp.Config{}, f, fmt.Errorf("-vrid, -version or -priority out of range (priority 0 is reserved for release)")
	}
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
	var err error
	if ic.VIPs, err = parseAddrs(*vips); err != nil {
		return vrrp.Config{}, f, fmt.Errorf("parse -vip: %w", err)
	}
	if ic.Peers, err = parseAddrs(*peers); err != nil {
		return vrrp.Config{}, f, fmt.Errorf("parse -peers: %w", err)
	}
	cfg := vrrp.Config{Interface: *iface, Instances: []vrrp.InstanceConfig{ic}}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return vrrp.Config{}, f, err
	}
	return cfg, f, nil
}

// runVRRP runs the VRRP announcer alone, without Kubernetes.
func runVRRP(args []string) error {
	cfg, flags, err := parseVRRPFlags(args)
	if err != nil {
		return err
	}
	zc := zap.NewProductionConfig()
	if flags.debug {
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
	stopMetrics, err := serveMetrics(flags.metricsAddr, reg, log)
	if err != nil {
		return err
	}
	defer stopMetrics()
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

// serveMetrics serves reg's metrics on addr ("" serves none) until the returned
// function is called.
func serveMetrics(addr string, reg *prometheus.Registry, log *zap.Logger) (func(), error) {
	if addr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for metrics: %w", err)
	}
	srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("serve metrics", zap.Error(err))
		}
	}()
	return func() { srv.Close() }, nil
}
