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
	"sync"
	"syscall"
	"time"

	"github.com/cilium/ebpf/rlimit"
	"github.com/go-logr/zapr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/portico-edge/portico/controlplane"
	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/nginx"
	"github.com/portico-edge/portico/vrrp"
)

// agentConfig is everything `portico agent` is told, by flags or environment.
type agentConfig struct {
	group, iface, node, kubeconfig, namespace, podNamespace string
	pools                                                   []controlplane.Pool
	seed                                                    uint
	pinPath                                                 string
	ringSize                                                uint
	nginxDir                                                string
	httpPort, httpsPort, statusPort                         uint
	metricsAddr                                             string
	vrrpPriority, vrrpDegraded, vrrpVersion                 uint
	vrrpInterval                                            time.Duration
	logLevel                                                string
	stateDir                                                string
	shutdownDelay                                           time.Duration
}

const defaultStateDir = "/run/portico"

// parseAgentFlags reads flags; a flag not given on the command line falls back
// to the environment: PORTICO_<FLAG> (dashes as underscores), and NODE_NAME and
// POD_NAMESPACE as the DaemonSet's downward API sets them.
func parseAgentFlags(args []string, getenv func(string) string) (agentConfig, error) {
	var c agentConfig
	var pools string
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fs.StringVar(&c.group, "group", "", "the group Service this node serves, namespace/name (required)")
	fs.StringVar(&c.iface, "iface", "", "the edge interface: XDP, VRRP and ARP run on it (required)")
	fs.StringVar(&c.node, "node-name", "", "this node's name (env NODE_NAME)")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig path; empty: in-cluster config (env KUBECONFIG)")
	fs.StringVar(&c.namespace, "namespace", "", "watch only this namespace; empty: all")
	fs.StringVar(&c.podNamespace, "pod-namespace", "portico-system", "namespace of the leader Lease (env POD_NAMESPACE)")
	fs.StringVar(&pools, "vip-pool", "", "VIP pools the leader allocates from: CIDR[!excluded,...] separated by ';'")
	fs.UintVar(&c.seed, "hash-seed", 0x706f7274, "cluster-wide flow hash seed: must be equal on every node")
	fs.StringVar(&c.pinPath, "pin-path", dataplane.DefaultPinPath, "bpffs directory for xdp_lb's maps, program and link")
	fs.UintVar(&c.ringSize, "ring-size", uint(dataplane.DefaultRingSize), "Maglev table size (a prime), equal on every node")
	fs.StringVar(&c.nginxDir, "nginx-dir", "/var/lib/portico/nginx", "nginx prefix: configuration, certificates, pid file")
	fs.UintVar(&c.httpPort, "http-port", 80, "nginx HTTP port")
	fs.UintVar(&c.httpsPort, "https-port", 443, "nginx HTTPS port")
	fs.UintVar(&c.statusPort, "nginx-status-port", 10246, "nginx status port on 127.0.0.1 (health, stub_status)")
	fs.StringVar(&c.metricsAddr, "metrics-addr", ":9101", "address of /metrics, /healthz and /readyz")
	fs.UintVar(&c.vrrpPriority, "vrrp-priority", 100, "VRRP priority while healthy (1-254)")
	fs.UintVar(&c.vrrpDegraded, "vrrp-degraded-priority", 10, "VRRP priority while unhealthy (XDP detached, maps stale, nginx down)")
	fs.UintVar(&c.vrrpVersion, "vrrp-version", 3, "VRRP version for IPv4 (2 for keepalived peers)")
	fs.DurationVar(&c.vrrpInterval, "vrrp-interval", 100*time.Millisecond, "VRRP advert interval")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.DurationVar(&c.shutdownDelay, "shutdown-delay", 5*time.Second, "on SIGTERM, keep serving (unready) this long before releasing the VIP, so the replica's endpoint turns terminating everywhere first")
	fs.StringVar(&c.stateDir, "state-dir", defaultStateDir, "node-local directory recording what the agent changed on the host (for portico uninstall)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] {
			return
		}
		env := map[string]string{"node-name": "NODE_NAME", "pod-namespace": "POD_NAMESPACE", "kubeconfig": "KUBECONFIG"}[f.Name]
		v := getenv("PORTICO_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_")))
		if v == "" && env != "" {
			v = getenv(env)
		}
		if v != "" {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("environment for -%s: %w", f.Name, err))
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return c, err
	}
	if f := fs.Lookup("vip-pool"); f != nil {
		pools = f.Value.String()
	}
	for _, p := range strings.Split(pools, ";") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		pool, err := controlplane.ParsePool(p)
		if err != nil {
			return c, fmt.Errorf("-vip-pool %q: %w", p, err)
		}
		c.pools = append(c.pools, pool)
	}
	switch {
	case c.group == "" || !strings.Contains(c.group, "/"):
		return c, fmt.Errorf("-group namespace/name is required")
	case c.iface == "":
		return c, fmt.Errorf("-iface is required")
	case c.node == "":
		return c, fmt.Errorf("-node-name (or NODE_NAME) is required")
	case c.vrrpPriority < 1 || c.vrrpPriority > 254 || c.vrrpDegraded < 1 || c.vrrpDegraded >= c.vrrpPriority:
		return c, fmt.Errorf("-vrrp-priority must be 1-254 and above -vrrp-degraded-priority (>= 1)")
	case c.httpPort > 65535 || c.httpsPort > 65535 || c.statusPort > 65535:
		return c, fmt.Errorf("ports must be below 65536")
	}
	return c, nil
}

func newLogger(level string) (*zap.Logger, error) {
	var l zapcore.Level
	if err := l.Set(level); err != nil {
		return nil, fmt.Errorf("-log-level: %w", err)
	}
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(l)
	cfg.Sampling = nil
	return cfg.Build()
}

func runAgent(args []string) error {
	cfg, err := parseAgentFlags(args, os.Getenv)
	if err != nil {
		return err
	}
	log, err := newLogger(cfg.logLevel)
	if err != nil {
		return err
	}
	defer log.Sync()
	log = log.With(zap.String("node", cfg.node), zap.String("group", cfg.group))
	klog.SetLogger(zapr.NewLogger(log.Named("k8s")))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return agentMain(ctx, cfg, log)
}

func agentMain(ctx context.Context, cfg agentConfig, log *zap.Logger) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	restCfg, err := kubeConfig(cfg.kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	ifc, err := net.InterfaceByName(cfg.iface)
	if err != nil {
		return fmt.Errorf("edge interface: %w", err)
	}
	host := hostState{dir: cfg.stateDir}
	if err := host.setupDSR(cfg.iface); err != nil {
		return fmt.Errorf("direct server return sysctls: %w", err)
	}

	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("remove memlock rlimit: %w", err)
	}
	dp, err := dataplane.Load(dataplane.Options{PinPath: cfg.pinPath, RingSize: uint32(cfg.ringSize), Logger: log.Named("dataplane")})
	if err != nil {
		return err
	}
	defer dp.Close() // pins stay: forwarding goes on while the agent restarts
	if err := dp.Attach(cfg.iface); err != nil {
		return err
	}
	reg.MustRegister(dataplane.NewCollector(dp))

	ropts := nginx.DefaultOptions(cfg.nginxDir)
	ropts.Group = cfg.group
	ropts.HTTPPort, ropts.HTTPSPort, ropts.StatusPort = uint16(cfg.httpPort), uint16(cfg.httpsPort), uint16(cfg.statusPort)
	reloader, err := nginx.NewReloader(nginx.ReloaderConfig{Dir: cfg.nginxDir, Render: ropts},
		nginx.Exec{Log: log.Named("nginx.master")}, log.Named("nginx"), reg)
	if err != nil {
		return err
	}

	l4 := &l4Sink{dp: dp, group: cfg.group, seed: uint32(cfg.seed), log: log.Named("l4"),
		neigh: &neighbors{ifc: ifc, log: log.Named("neighbors"), resolved: map[netip.Addr]net.HardwareAddr{}}}
	vmet, err := vrrp.NewMetrics(reg)
	if err != nil {
		return err
	}
	vs := &vrrpSink{base: context.WithoutCancel(ctx), iface: cfg.iface, group: cfg.group,
		priority: uint8(cfg.vrrpPriority), degraded: uint8(cfg.vrrpDegraded),
		interval: cfg.vrrpInterval, version: uint8(cfg.vrrpVersion), log: log.Named("vrrp"), met: vmet,
		setLoVIPs: host.setLoVIPs, managed: host.managedVIPs()}

	// nginx starts (or adopts the master a previous agent left running) only
	// with the first real snapshot: an adopted master must never be reloaded
	// with an empty configuration while it serves traffic.
	l7 := &firstSnapshot{Sink: reloader, arrived: make(chan struct{})}
	ctrl, err := controlplane.New(controlplane.Config{
		Client: client, Dynamic: dyn, Logger: log.Named("controlplane"), Registerer: reg,
		Namespace: cfg.namespace, Pools: cfg.pools, Sinks: []controlplane.Sink{l4, l7, vs},
		Identity: cfg.node, LeaseNamespace: cfg.podNamespace, ReleaseOnCancel: true,
	})
	if err != nil {
		return err
	}

	h := &health{attached: dp.Attached, l4: l4, reloader: reloader, reason: "starting", statusURL: fmt.Sprintf("http://127.0.0.1:%d/healthz", cfg.statusPort)}
	srv := &http.Server{Handler: h.mux(reg), ReadHeaderTimeout: 5 * time.Second}
	ln, err := net.Listen("tcp", cfg.metricsAddr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.metricsAddr, err)
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
	goRun("health", func(ctx context.Context) error { h.loop(ctx, vs, log); return nil })
	goRun("status", func(ctx context.Context) error {
		publishStatus(ctx, client, cfg.podNamespace, func() agentState {
			return collectState(cfg.node, cfg.group, cfg.iface, dp, h, vs)
		}, log.Named("status"))
		return nil
	})
	go srv.Serve(ln)
	log.Info("agent started", zap.String("iface", cfg.iface), zap.String("metrics", cfg.metricsAddr))

	var runErr error
	select {
	case <-ctx.Done():
		// Unready first, still serving: Kubernetes marks the endpoint terminating,
		// every edge stops giving this replica new flows, its flows finish.
		h.stopping.Store(true)
		log.Info("agent stopping: unready, still serving", zap.Duration("delay", cfg.shutdownDelay))
		select {
		case <-time.After(cfg.shutdownDelay):
		case runErr = <-errc:
		}
	case runErr = <-errc:
		log.Error("agent stopping", zap.Error(runErr))
	}
	// Then priority-0 release (a Backup takes over after its skew time), then
	// nginx finishes in-flight requests, then the rest.
	h.stopping.Store(true)
	log.Info("releasing VIPs")
	vs.stop()
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

func kubeConfig(path string) (*rest.Config, error) {
	if path == "" {
		c, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config (set -kubeconfig outside a cluster): %w", err)
		}
		return c, nil
	}
	c, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return c, nil
}
