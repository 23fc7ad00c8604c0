package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/cilium/ebpf/rlimit"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/portico-edge/portico/bgp"
	"github.com/portico-edge/portico/controlplane"
	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/liveness"
	"github.com/portico-edge/portico/nginx"
	"github.com/portico-edge/portico/vrrp"
)

// Run runs the agent until ctx ends, then releases the VIPs and stops. The XDP
// program stays attached and its maps pinned, so forwarding goes on while the
// agent restarts.
func Run(ctx context.Context, cfg Config, log *zap.Logger) error {
	reg, client, dyn, err := start(cfg)
	if err != nil {
		return err
	}
	ifc, err := net.InterfaceByName(cfg.Iface)
	if err != nil {
		return fmt.Errorf("edge interface: %w", err)
	}
	host := hostState{dir: cfg.StateDir}
	if err := host.setupDSR(cfg.Iface); err != nil {
		return fmt.Errorf("direct server return sysctls: %w", err)
	}

	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("remove memlock rlimit: %w", err)
	}
	// In BGP mode the router sends an edge established flows the moment it
	// announces: a new (or rebooted) edge starts from the ring the others held.
	dp, err := dataplane.Load(dataplane.Options{PinPath: cfg.PinPath, RingSize: cfg.RingSize,
		Arrival: cfg.Announce == "bgp", Rejoin: true, Logger: log.Named("dataplane")})
	if err != nil {
		return err
	}
	defer dp.Close() // pins stay: forwarding goes on while the agent restarts
	if err := dp.Attach(cfg.Iface); err != nil {
		return err
	}
	reg.MustRegister(dataplane.NewCollector(dp))

	ropts := nginx.DefaultOptions(cfg.NginxDir)
	ropts.Group = cfg.Group
	ropts.HTTPPort, ropts.HTTPSPort, ropts.StatusPort = cfg.HTTPPort, cfg.HTTPSPort, cfg.StatusPort
	ropts.LivenessPort, ropts.LivenessAddr = cfg.LivenessPort, cfg.NodeIP
	ropts.DrainTimeout = cfg.NginxDrainTimeout
	served := &servedIngresses{group: cfg.Group, kick: make(chan struct{}, 1)}
	reloader, err := nginx.NewReloader(nginx.ReloaderConfig{Dir: cfg.NginxDir, Render: ropts, OnServed: served.set},
		nginx.Exec{Log: log.Named("nginx.master")}, log.Named("nginx"), reg)
	if err != nil {
		return err
	}

	l4 := &l4Sink{dp: dp, group: cfg.Group, seed: cfg.Seed, log: log.Named("l4"),
		neigh: &neighbors{ifc: ifc, log: log.Named("neighbors"), resolved: map[netip.Addr]net.HardwareAddr{}}}
	if cfg.Sites != "" {
		l4.tunnel = cfg.Tunnel
		if !l4.tunnel.IsValid() {
			l4.tunnel = firstAddr(ifc, true)
		}
		l4.sites = &sites{path: cfg.Sites, ifc: ifc, neigh: l4.neigh, log: log.Named("sites")}
		l4.sites.reload()
		l4.spillGauge = prometheus.NewGauge(prometheus.GaugeOpts{Name: "portico_site_spill_ratio",
			Help: "The share of this edge's new connections it spills to another site above its capacity (federation overflow)."})
		reg.MustRegister(l4.spillGauge)
	}
	// Every node checks every replica, the VRRP backups too: a takeover starts
	// with a ring that already leaves out a replica that died before it.
	var checker *liveness.Checker
	if cfg.LivenessPort != 0 {
		checker, err = liveness.New(liveness.Config{Port: cfg.LivenessPort, Iface: cfg.Iface, Timing: cfg.Liveness,
			Logger: log.Named("liveness"), Registerer: reg})
		if err != nil {
			return err
		}
		l4.live = checker
		l4.publish = reloader.PushVerdicts
	}
	// The announcer: VRRP (one owner) or BGP (every edge).
	var (
		announcer  controlplane.Sink
		setHealthy func(context.Context, bool)
		release    func()
		vs         *vrrpSink
		bs         *bgpSink
		speaker    *bgp.Speaker
		vrrpStates = func() map[string]vrrp.State { return nil }
		bgpStatus  = func() *BGPState { return nil }
	)
	switch cfg.Announce {
	case "bgp":
		routerID := firstAddr(ifc, true)
		scfg, err := cfg.BGP.SpeakerConfig(cfg.Node, routerID, cfg.NextHop6)
		if err != nil {
			return err
		}
		bmet, err := bgp.NewMetrics(reg)
		if err != nil {
			return err
		}
		blog := log.Named("bgp")
		if speaker, err = bgp.New(scfg, blog, bmet); err != nil {
			return err
		}
		bs = &bgpSink{group: cfg.Group, log: blog, speaker: speaker, setLoVIPs: host.setLoVIPs, localAddrs: localAddrs,
			withdrawAfter: cfg.BGP.withdrawAfter(), siteUpAfter: defaultSiteUpAfter, now: time.Now, managed: host.managedVIPs()}
		if l4.sites != nil {
			bs.handover, bs.siteDrain = l4.handover, l4.sites.drainingNow
		}
		announcer, setHealthy, release, bgpStatus = bs, bs.setHealthy, bs.stop, bs.status
	default:
		vmet, err := vrrp.NewMetrics(reg)
		if err != nil {
			return err
		}
		vlog := log.Named("vrrp")
		vs = &vrrpSink{base: context.WithoutCancel(ctx), iface: cfg.Iface, group: cfg.Group,
			priority: cfg.VRRPPriority, degraded: cfg.VRRPDegraded,
			interval: cfg.VRRPInterval, version: cfg.VRRPVersion, log: vlog,
			newAnnouncer: newAnnouncer(vlog, vmet), setLoVIPs: host.setLoVIPs, managed: host.managedVIPs(),
			unicast: cfg.VRRPUnicast}
		announcer, setHealthy, release, vrrpStates = vs, vs.setHealthy, vs.stop, vs.states
	}

	// nginx starts (or adopts the master a previous agent left running) only
	// with the first real snapshot: an adopted master must never be reloaded
	// with an empty configuration while it serves traffic.
	l7 := &firstSnapshot{Sink: reloader, arrived: make(chan struct{})}
	ccfg := controlplaneConfig(cfg, client, dyn, log, reg)
	ccfg.Sinks, ccfg.Identity, ccfg.ReadOnly = []controlplane.Sink{l4, l7, announcer}, cfg.Node, cfg.ReadOnly
	ctrl, err := controlplane.New(ccfg)
	if err != nil {
		return err
	}

	h := &health{attached: dp.Attached, applied: l4.applied, checksum: reloader.Checksum, reason: "starting",
		statusURL: fmt.Sprintf("http://127.0.0.1:%d/healthz", cfg.StatusPort)}
	srv := &http.Server{Handler: h.mux(reg, cfg.Pprof), ReadHeaderTimeout: 5 * time.Second}
	ln, err := net.Listen("tcp", cfg.MetricsAddr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.MetricsAddr, err)
	}

	// Everything but VRRP stops when ctx ends; VRRP is released first.
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	var wg sync.WaitGroup
	// The first failure stops the agent; later ones (during shutdown) are only
	// logged, so no goroutine ever blocks on errc.
	errc := make(chan error, 1)
	goRun := func(name string, f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(runCtx); err != nil && !errors.Is(err, context.Canceled) {
				select {
				case errc <- fmt.Errorf("%s: %w", name, err):
				default:
					log.Error("agent part failed", zap.String("part", name), zap.Error(err))
				}
			}
		}()
	}
	goRun("nginx", func(ctx context.Context) error {
		select {
		case <-l7.arrived:
			return reloader.Run(ctx)
		case <-ctx.Done():
			return nil
		}
	})
	goRun("controlplane", ctrl.Run)
	goRun("neighbours", l4.watchNeighbours)
	if checker != nil {
		goRun("liveness", checker.Run)
		goRun("liveness-follow", l4.followLiveness)
	}
	goRun("transitions", l4.expireTransitions)
	if l4.sites != nil {
		goRun("sites", func(ctx context.Context) error { return l4.sites.watch(ctx, l4.reapply, l4.handoverDraining) })
		goRun("overflow", l4.followLoad)
	}
	if speaker != nil {
		goRun("bgp", speaker.Run)
		goRun("bgp-announce", bs.run)
	}
	if vs != nil && vs.unicast {
		goRun("vrrp-peers", func(ctx context.Context) error {
			return followPeers(ctx, client, cfg.PodNamespace, vs, cfg.Node, log.Named("vrrp"))
		})
	}
	goRun("health", func(ctx context.Context) error { h.loop(ctx, setHealthy, log); return nil })
	goRun("status", func(ctx context.Context) error {
		view := nodeView{node: cfg.Node, group: cfg.Group, iface: cfg.Iface, health: h.current, vrrp: vrrpStates, vips: dp.VIPs,
			replicas: l4.replicas, bgp: bgpStatus, served: served.get, tunnel: l4.tunnel, spill: l4.spillRatio}
		if vs != nil && vs.unicast {
			view.vrrpSources = func() []netip.Addr {
				srcs, err := vrrp.SourceAddrs(cfg.Iface, vs.vips())
				if err != nil {
					log.Warn("vrrp sources", zap.Error(err))
				}
				return srcs
			}
		}
		publishStatus(ctx, client, cfg.PodNamespace, view.collect, served.kick, log.Named("status"))
		return nil
	})
	go srv.Serve(ln)
	log.Info("agent started", zap.String("iface", cfg.Iface), zap.String("metrics", cfg.MetricsAddr))

	var runErr error
	select {
	case <-ctx.Done():
		// Unready first, still serving: Kubernetes marks the endpoint terminating,
		// every edge stops giving this replica new flows, its flows finish. With
		// BGP, the routes are de-preferenced now: routers move flows to the other
		// edges, which steer them to the same replicas.
		h.stopping.Store(true)
		if bs != nil {
			bs.stop()
		}
		log.Info("agent stopping: unready, still serving", zap.Duration("delay", cfg.ShutdownDelay))
		select {
		case <-time.After(cfg.ShutdownDelay):
		case runErr = <-errc:
		}
	case runErr = <-errc:
		log.Error("agent stopping", zap.Error(runErr))
	}
	// Then priority-0 release (a Backup takes over after its skew time; with BGP
	// the speaker stops with the rest, a graceful restart for its peers), then
	// nginx finishes in-flight requests, then the rest.
	h.stopping.Store(true)
	log.Info("releasing VIPs")
	release()
	cancel()
	wg.Wait()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	srv.Shutdown(sctx)
	log.Info("agent stopped; xdp_lb stays attached (portico uninstall removes it)")
	return runErr
}

// firstSnapshot passes snapshots to a sink and closes arrived at the first one.
type firstSnapshot struct {
	controlplane.Sink
	once    sync.Once
	arrived chan struct{}
}

func (f *firstSnapshot) Apply(ctx context.Context, snap model.Snapshot) error {
	err := f.Sink.Apply(ctx, snap)
	f.once.Do(func() { close(f.arrived) })
	return err
}
