package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf/rlimit"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/portico-edge/portico/api/agentstatus"
	"github.com/portico-edge/portico/api/bgpfile"
	"github.com/portico-edge/portico/bgp"
	"github.com/portico-edge/portico/controlplane"
	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/liveness"
	"github.com/portico-edge/portico/nginx"
	"github.com/portico-edge/portico/vrrp"
)

// Config is everything the agent is told (cmd/portico fills it from flags and
// the environment, and checks it).
type Config struct {
	Kube         *rest.Config        // the API server
	Group        string              // the group Service this node serves, namespace/name
	Iface        string              // the edge interface: XDP, VRRP and ARP run on it
	Node         string              // this node's name
	Namespace    string              // watch only this namespace; empty: all
	PodNamespace string              // namespace of the leader Lease and the status Leases
	Pools        []controlplane.Pool // VIP pools the leader allocates from
	Seed         uint32              // cluster-wide flow hash seed: equal on every node
	PinPath      string              // bpffs directory for xdp_lb's maps, program and link
	RingSize     uint32              // Maglev table size (a prime), equal on every node
	NginxDir     string              // nginx prefix: configuration, certificates, pid file
	// NginxDrainTimeout bounds how long nginx workers replaced by a reload keep
	// the connections they hold (nginx.Options.DrainTimeout); "" until they close.
	NginxDrainTimeout string

	HTTPPort, HTTPSPort uint16
	StatusPort          uint16 // nginx status port on 127.0.0.1 (health, stub_status)
	// LivenessPort is where nginx answers the liveness checks of every
	// director; 0 turns liveness checks off (Kubernetes' view only).
	LivenessPort uint16
	Liveness     liveness.Timing // zero: liveness.DefaultTiming
	MetricsAddr  string          // address of /metrics, /healthz and /readyz
	// NodeIP, when valid, is the node's own address: nginx's liveness server
	// listens on it alone (MetricsAddr names it too).
	NodeIP netip.Addr
	Pprof  bool // also Go's /debug/pprof/ there
	// ReservedPorts are ports the node's other daemons listen on, beyond
	// NodePorts and the agent's own (ReservedPorts): no L4 Service may take them.
	ReservedPorts []model.Port
	// GroupNamespaces are namespaces beyond the agent's own (PodNamespace) and
	// its group's where groups and IngressClaims are served (GroupNamespaces).
	GroupNamespaces []string
	// ReadOnly agents only read the cluster: the controller Deployment
	// (RunController) makes the cluster-wide writes, under its own
	// ServiceAccount (controlplane.Config.ReadOnly).
	ReadOnly bool

	// Announce is how the group's VIPs reach clients: "vrrp" (the default: one
	// owner answers ARP/ND) or "bgp" (every edge announces them to BGP, with BGP).
	Announce string
	BGP      bgpfile.File // --announce=bgp: the peers and timers (--bgp-config)
	NextHop6 netip.Addr   // --announce=bgp: this node's IPv6 next hop for IPv6 VIPs

	VRRPPriority uint8 // VRRP priority while healthy
	VRRPDegraded uint8 // VRRP priority while unhealthy
	VRRPVersion  uint8 // for IPv4 (2 for keepalived peers); IPv6 is always 3
	VRRPInterval time.Duration
	// VRRPUnicast sends adverts to the group's other agents and accepts them
	// from those alone (their status Leases name them); false: multicast, from
	// any source (keepalived peers on the segment need it).
	VRRPUnicast bool

	// ClaimImage is the image of the agent DaemonSets the leader provisions for
	// IngressClaims; empty: deploy/agent.yaml's.
	ClaimImage string
	// ClaimIface and ClaimNodeSelector place those DaemonSets' agents
	// (controlplane.Config): the operator's, never a claim's.
	ClaimIface        string
	ClaimNodeSelector map[string]string
	// APIServer is the API server this agent was told to use instead of the
	// in-cluster Service (--apiserver); the agents of the IngressClaims it provisions
	// are told the same.
	APIServer string

	// Sites is the federation peers file (--federation-peers, api/sites);
	// empty: no site hand-over. Tunnel is this node's tunnel address for it.
	Sites  string
	Tunnel netip.Addr

	StateDir      string        // records what the agent changed on the host
	ShutdownDelay time.Duration // serving, unready, after ctx ends and before the VIP is released
}

// DefaultStateDir is the node-local directory where the agent records what it
// changed on the host (see UndoHost).
const DefaultStateDir = "/run/portico"

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
		l4.sites = &peerSites{path: cfg.Sites, ifc: ifc, neigh: l4.neigh, log: log.Named("sites")}
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
		bgpStatus  = func() *agentstatus.BGPState { return nil }
	)
	switch cfg.Announce {
	case "bgp":
		routerID := firstAddr(ifc, true)
		scfg, err := SpeakerConfig(cfg.BGP, cfg.Node, routerID, cfg.NextHop6)
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
			withdrawAfter: withdrawAfter(cfg.BGP), siteUpAfter: defaultSiteUpAfter, now: time.Now, managed: host.managedVIPs()}
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

// start makes what the agent and the controller both begin with: a registry with
// the Go and process collectors, and the API server's clients.
func start(cfg Config) (*prometheus.Registry, kubernetes.Interface, dynamic.Interface, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
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

// controlplaneConfig is the control plane's configuration for cfg: an agent's
// and the controller's decide alike from the same flags (the same pools,
// reserved ports and group namespaces).
func controlplaneConfig(cfg Config, client kubernetes.Interface, dyn dynamic.Interface, log *zap.Logger, reg prometheus.Registerer) controlplane.Config {
	return controlplane.Config{
		Client: client, Dynamic: dyn, Logger: log.Named("controlplane"), Registerer: reg,
		Namespace: cfg.Namespace, Pools: cfg.Pools, ReservedPorts: ReservedPorts(cfg), GroupNamespaces: GroupNamespaces(cfg),
		LeaseNamespace: cfg.PodNamespace, ReleaseOnCancel: true, AgentImage: cfg.ClaimImage, AgentAPIServer: cfg.APIServer,
		ClaimIface: cfg.ClaimIface, ClaimNodeSelector: cfg.ClaimNodeSelector,
	}
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

// NodePorts are the ports an edge node's own daemons listen on, on every
// address, whatever the agent's flags: ssh, BGP, BFD (single and multihop),
// the kubelet's API and read-only port, kube-proxy's health check.
var NodePorts = map[model.Port]string{
	{Protocol: model.TCP, Port: 22}:    "ssh",
	{Protocol: model.TCP, Port: 179}:   "BGP",
	{Protocol: model.UDP, Port: 3784}:  "BFD",
	{Protocol: model.UDP, Port: 3785}:  "BFD echo",
	{Protocol: model.UDP, Port: 4784}:  "BFD multihop",
	{Protocol: model.TCP, Port: 10250}: "the kubelet",
	{Protocol: model.TCP, Port: 10255}: "the kubelet's read-only port",
	{Protocol: model.TCP, Port: 10256}: "kube-proxy's health check",
}

// ReservedPorts are the ports no L4 Service may take on cfg's edges, with what
// uses each: NodePorts, cfg.ReservedPorts and the agent's own (nginx's HTTP,
// HTTPS, status and liveness ports, the metrics address). Every edge of a group
// runs with the same flags, so every edge reserves the same ports.
func ReservedPorts(cfg Config) map[model.Port]string {
	out := maps.Clone(NodePorts)
	for _, p := range cfg.ReservedPorts {
		out[p] = "reserved by the operator (-reserved-ports)"
	}
	tcp := func(port uint16, what string) {
		if port != 0 {
			out[model.Port{Protocol: model.TCP, Port: port}] = what
		}
	}
	tcp(cfg.HTTPPort, "nginx's HTTP")
	tcp(cfg.HTTPSPort, "nginx's HTTPS")
	tcp(cfg.StatusPort, "nginx's status")
	tcp(cfg.LivenessPort, "the liveness checks")
	if _, port, err := net.SplitHostPort(cfg.MetricsAddr); err == nil {
		if n, err := strconv.ParseUint(port, 10, 16); err == nil {
			tcp(uint16(n), "the agent's metrics")
		}
	}
	return out
}

// GroupNamespaces are the namespaces where a Service labelled portico.io/group
// is a group and IngressClaims are served: the agent's own (the release's), its
// group's and cfg.GroupNamespaces, sorted. Anywhere else a tenant could make a
// group, or have privileged agents provisioned.
func GroupNamespaces(cfg Config) []string {
	ns := slices.Clone(cfg.GroupNamespaces)
	if g, _, ok := strings.Cut(cfg.Group, "/"); ok {
		ns = append(ns, g)
	}
	if cfg.PodNamespace != "" {
		ns = append(ns, cfg.PodNamespace)
	}
	slices.Sort(ns)
	return slices.Compact(ns)
}
