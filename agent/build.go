package agent

import (
	"context"
	"fmt"
	"github.com/portico-edge/portico/api/agentstatus"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/cilium/ebpf/rlimit"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/portico-edge/portico/bgp"
	"github.com/portico-edge/portico/controlplane"
	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/dataplane/steer"
	"github.com/portico-edge/portico/liveness"
	"github.com/portico-edge/portico/nginx"
	"github.com/portico-edge/portico/vrrp"
)

// agent is a running agent's parts, built by Run one after the other for cfg's
// mode: each build step fills what it makes, and leaves nil what the mode has
// none of.
type agent struct {
	cfg    Config
	log    *zap.Logger
	reg    *prometheus.Registry
	client kubernetes.Interface
	dyn    dynamic.Interface
	ifc    *net.Interface // the edge interface
	host   hostState

	dp       *dataplane.Dataplane
	served   *servedIngresses
	reloader *nginx.Reloader
	steer    *steer.Steering // nil: a listener per L4 TCP port (Config.L4SteerPort 0)
	l4       *l4Sink
	checker  *liveness.Checker // nil: liveness checks off
	held     *heldReports      // nil: Config.NoHeld
	ann      announcement
	l7       *firstSnapshot // the reloader, until nginx starts
	ctrl     *controlplane.Controller
	health   *health
}

// newAgent starts an agent for cfg: the registry, the API server's clients, the
// edge interface (ChooseIface: the node's annotation or --iface; the agent's
// cfg.Iface is the one chosen) and the sysctls direct server return needs.
func newAgent(ctx context.Context, cfg Config, log *zap.Logger) (*agent, error) {
	reg, client, dyn, err := start(cfg)
	if err != nil {
		return nil, err
	}
	choice, err := ChooseIface(ctx, client, cfg.Node, cfg.Iface, ifacePresent, log)
	if err != nil {
		return nil, err
	}
	cfg.Iface = choice.Name
	ifc, err := net.InterfaceByName(cfg.Iface)
	if err != nil {
		return nil, fmt.Errorf("edge interface: %w", err)
	}
	host := hostState{dir: cfg.StateDir}
	if err := host.setupDSR(cfg.Iface); err != nil {
		return nil, fmt.Errorf("direct server return sysctls: %w", err)
	}
	return &agent{cfg: cfg, log: log, reg: reg, client: client, dyn: dyn, ifc: ifc, host: host}, nil
}

// buildDataplane loads xdp_lb (or takes over the pinned one) and attaches it to
// the edge interface.
func (a *agent) buildDataplane() error {
	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("remove memlock rlimit: %w", err)
	}
	// In BGP mode the router sends an edge established flows the moment it
	// announces: a new (or rebooted) edge starts from the ring the others held.
	dp, err := dataplane.Load(dataplane.Options{PinPath: a.cfg.PinPath, RingSize: a.cfg.RingSize,
		Arrival: a.cfg.Announce == "bgp", Rejoin: true, XDPMode: a.cfg.XDPMode, Transition: a.cfg.Transition, Logger: a.log.Named("dataplane")})
	if err != nil {
		return err
	}
	if err := dp.Attach(a.cfg.Iface); err != nil {
		dp.Close()
		return err
	}
	a.dp = dp
	a.reg.MustRegister(dataplane.NewCollector(dp))
	return nil
}

// buildNginx makes nginx's reloader; nginx itself starts with the first
// snapshot (runNginx).
func (a *agent) buildNginx() error {
	cfg := a.cfg
	ropts := nginx.DefaultOptions(cfg.NginxDir)
	ropts.Group = cfg.Group
	ropts.HTTPPort, ropts.HTTPSPort, ropts.StatusPort = cfg.HTTPPort, cfg.HTTPSPort, cfg.StatusPort
	ropts.LivenessPort, ropts.LivenessAddr = cfg.LivenessPort, cfg.NodeIP
	ropts.DrainTimeout = cfg.NginxDrainTimeout
	ropts.AccessLog, ropts.AccessLogSample, ropts.Telemetry = cfg.AccessLog, cfg.AccessLogSample, !cfg.NoTelemetry
	a.served = &servedIngresses{group: cfg.Group, kick: make(chan struct{}, 1)}
	rcfg := nginx.ReloaderConfig{Dir: cfg.NginxDir, Render: ropts, OnServed: a.served.set}
	if cfg.L4SteerPort == 0 {
		if err := steer.Remove(cfg.PinPath); err != nil {
			return err
		}
	} else {
		st, err := loadSteering(cfg, a.log.Named("steer"), a.reg)
		if err != nil {
			return err
		}
		a.steer = st
		rcfg.Render.L4Steered = [2]uint16{cfg.L4SteerPort, cfg.L4SteerPort + 1}
		rcfg.SteerL4 = steerRoutes(st)
	}
	reloader, err := nginx.NewReloader(rcfg, nginx.Exec{Log: a.log.Named("nginx.master"), Stdout: os.Stdout}, a.log.Named("nginx"), a.reg)
	if err != nil {
		return err
	}
	a.reloader = reloader
	return nil
}

// runNginx runs nginx's reloader from the first snapshot on. nginx starts (or
// adopts the master a previous agent left running) only then: an adopted master
// must never be reloaded with an empty configuration while it serves traffic.
func (a *agent) runNginx(ctx context.Context) error {
	select {
	case <-a.l7.arrived:
		return a.reloader.Run(ctx)
	case <-ctx.Done():
		return nil
	}
}

// buildL4 makes the sink that writes snapshots to xdp_lb's maps.
func (a *agent) buildL4() {
	a.l4 = &l4Sink{dp: a.dp, group: a.cfg.Group, seed: a.cfg.Seed, log: a.log.Named("l4"),
		neigh: &neighbors{ifc: a.ifc, log: a.log.Named("neighbors"), resolved: map[netip.Addr]net.HardwareAddr{}}}
}

// buildHeld makes the held-connection reports (held.go), served and fetched
// on the metrics port.
func (a *agent) buildHeld() error {
	if a.cfg.NoHeld {
		return nil
	}
	_, port, err := net.SplitHostPort(a.cfg.MetricsAddr)
	if err != nil {
		return fmt.Errorf("held connections: metrics address %q: %w", a.cfg.MetricsAddr, err)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return fmt.Errorf("held connections: metrics address %q: want a port the peers can reach", a.cfg.MetricsAddr)
	}
	met := newHeldMetrics()
	for _, c := range met.collectors() {
		if err := a.reg.Register(c); err != nil {
			return fmt.Errorf("register held-connection metrics: %w", err)
		}
	}
	h := &heldReports{sink: a.l4, port: uint16(n), interval: heldEvery(a.cfg.Transition), budget: a.dp.FlowEntries() / 2, log: a.log.Named("held"), met: met, list: ownConnections, listUDP: a.dp.OwnUDP}
	h.client = &http.Client{Transport: &http.Transport{DialContext: h.dial, MaxIdleConnsPerHost: 1, IdleConnTimeout: 30 * time.Second}}
	a.held = h
	return nil
}

// buildSites joins the federation of cfg.Sites: the L4 sink hands flows over to
// the peer sites through this node's tunnel address, and spills to them above
// its capacity.
func (a *agent) buildSites() {
	l4 := a.l4
	l4.tunnel = a.cfg.Tunnel
	if !l4.tunnel.IsValid() {
		l4.tunnel = firstAddr(a.ifc, true)
	}
	l4.sites = &peerSites{path: a.cfg.Sites, ifc: a.ifc, neigh: l4.neigh, log: a.log.Named("sites")}
	l4.sites.reload()
	l4.spillGauge = newSpillGauge()
	a.reg.MustRegister(l4.spillGauge)
}

// buildLiveness makes the liveness checker, whose verdicts the L4 sink and
// nginx follow. Every node checks every replica, the VRRP backups too: a
// takeover starts with a ring that already leaves out a replica that died
// before it.
func (a *agent) buildLiveness() error {
	checker, err := liveness.New(liveness.Config{Port: a.cfg.LivenessPort, Iface: a.cfg.Iface, Timing: a.cfg.Liveness,
		Logger: a.log.Named("liveness"), Registerer: a.reg})
	if err != nil {
		return err
	}
	a.checker = checker
	a.l4.live = checker
	a.l4.publish = a.reloader.PushVerdicts
	return nil
}

// announcement is how the group's VIPs reach clients (Config.Announce): the
// sink the control plane drives and what the rest of the agent needs of it.
type announcement struct {
	sink       controlplane.Sink
	setHealthy func(context.Context, bool)
	// deprefer, when ctx ends, moves flows to the other edges while this one
	// still serves; nil: nothing to do before release.
	deprefer func()
	release  func() // gives the VIPs up
	parts    []part // its goroutines

	vrrpStates  func() map[string]vrrp.State
	vrrpSources func() []netip.Addr // nil: none published
	bgpStatus   func() *agentstatus.BGPState
}

// buildBGP announces the VIPs with BGP from every edge (Config.BGP).
func (a *agent) buildBGP() error {
	cfg := a.cfg
	routerID := firstAddr(a.ifc, true)
	scfg, err := SpeakerConfig(cfg.BGP, cfg.Node, routerID, cfg.NextHop6)
	if err != nil {
		return err
	}
	bmet, err := bgp.NewMetrics(a.reg)
	if err != nil {
		return err
	}
	blog := a.log.Named("bgp")
	speaker, err := bgp.New(scfg, blog, bmet)
	if err != nil {
		return err
	}
	bs := &bgpSink{group: cfg.Group, log: blog, speaker: speaker, setLoVIPs: a.host.setLoVIPs, localAddrs: localAddrs,
		withdrawAfter: withdrawAfter(cfg.BGP), siteUpAfter: defaultSiteUpAfter, now: time.Now, managed: a.host.managedVIPs()}
	if a.l4.sites != nil {
		bs.handover, bs.siteDrain = a.l4.handover, a.l4.sites.drainingNow
	}
	a.ann = announcement{sink: bs, setHealthy: bs.setHealthy, deprefer: bs.stop, release: bs.stop,
		parts:      []part{{"bgp", speaker.Run}, {"bgp-announce", bs.run}},
		vrrpStates: func() map[string]vrrp.State { return nil }, bgpStatus: bs.status}
	if !cfg.BGPPeerObjects {
		return nil
	}
	if len(scfg.Peers) == 0 {
		blog.Warn("no --bgp-config peer for this node: it announces nothing until a BGPPeer object selects it", zap.String("namespace", cfg.PodNamespace))
	}
	pmet := newPeerMetrics()
	for _, c := range pmet.collectors() {
		if err := a.reg.Register(c); err != nil {
			return fmt.Errorf("register bgp peer metrics: %w", err)
		}
	}
	po := &peerObjects{namespace: cfg.PodNamespace, node: cfg.Node, file: scfg.Peers, check: scfg.CheckPeer,
		apply: speaker.Reconfigure, log: blog.Named("peers"), met: pmet, events: true, retry: 5 * time.Second,
		reported: map[string]string{}}
	a.ann.parts = append(a.ann.parts, part{"bgp-peers", func(ctx context.Context) error { return po.run(ctx, a.client, a.dyn) }})
	return nil
}

// buildVRRP announces the VIPs with VRRP: one owner answers ARP/ND. ctx is the
// base of its routers, which outlive it (released at stop).
func (a *agent) buildVRRP(ctx context.Context) error {
	cfg := a.cfg
	vmet, err := vrrp.NewMetrics(a.reg)
	if err != nil {
		return err
	}
	vlog := a.log.Named("vrrp")
	vs := &vrrpSink{base: context.WithoutCancel(ctx), iface: cfg.Iface, group: cfg.Group,
		priority: cfg.VRRPPriority, degraded: cfg.VRRPDegraded,
		interval: cfg.VRRPInterval, version: cfg.VRRPVersion, log: vlog,
		newAnnouncer: newAnnouncer(vlog, vmet), setLoVIPs: a.host.setLoVIPs, managed: a.host.managedVIPs(),
		unicast: cfg.VRRPUnicast}
	a.ann = announcement{sink: vs, setHealthy: vs.setHealthy, release: vs.stop,
		vrrpStates: vs.states, bgpStatus: func() *agentstatus.BGPState { return nil }}
	if vs.unicast {
		a.ann.parts = []part{{"vrrp-peers", func(ctx context.Context) error {
			return followPeers(ctx, a.client, cfg.PodNamespace, vs, cfg.Node, a.log.Named("vrrp"))
		}}}
		a.ann.vrrpSources = func() []netip.Addr {
			srcs, err := vrrp.SourceAddrs(cfg.Iface, vs.vips())
			if err != nil {
				a.log.Warn("vrrp sources", zap.Error(err))
			}
			return srcs
		}
	}
	return nil
}

// buildControlplane makes the control plane that drives the sinks: xdp_lb's
// maps, nginx (from its first snapshot) and the announcer.
func (a *agent) buildControlplane() error {
	cfg := a.cfg
	a.l7 = &firstSnapshot{Sink: a.reloader, arrived: make(chan struct{})}
	ccfg := controlplaneConfig(cfg, a.client, a.dyn, a.log, a.reg)
	ccfg.Sinks, ccfg.Identity, ccfg.ReadOnly = []controlplane.Sink{a.l4, a.l7, a.ann.sink}, cfg.Node, cfg.ReadOnly
	ctrl, err := controlplane.New(ccfg)
	if err != nil {
		return err
	}
	a.ctrl = ctrl
	return nil
}

// buildHealth makes the node's health check: xdp_lb attached, the maps and
// nginx holding the latest snapshot.
func (a *agent) buildHealth() {
	a.health = &health{attached: a.dp.Attached, applied: a.l4.applied, checksum: a.reloader.Checksum, reason: "starting",
		statusURL: fmt.Sprintf("http://127.0.0.1:%d/healthz", a.cfg.StatusPort)}
	a.reg.MustRegister(healthCollector{a.health})
}

// publishStatus publishes this node's view in its status Lease until ctx ends.
func (a *agent) publishStatus(ctx context.Context) error {
	cfg, l4 := a.cfg, a.l4
	view := nodeView{node: cfg.Node, group: cfg.Group, iface: cfg.Iface, health: a.health.current, vrrp: a.ann.vrrpStates,
		vips: a.dp.VIPs, replicas: l4.replicas, bgp: a.ann.bgpStatus, served: a.served.get, tunnel: l4.tunnel,
		spill: l4.spillRatio, vrrpSources: a.ann.vrrpSources, attachMode: a.dp.AttachMode,
		load: newLoadMeter(a.reloader.Work, a.newFlows).sample}
	publishStatus(ctx, a.client, cfg.PodNamespace, view.collect, a.served.kick, a.log.Named("status"))
	return nil
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
