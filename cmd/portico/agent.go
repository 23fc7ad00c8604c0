package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/portico-edge/portico/agent"
	"github.com/portico-edge/portico/api/bgpfile"
	"github.com/portico-edge/portico/api/sites"
	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane"
	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/internal/version"
	"github.com/portico-edge/portico/liveness"
)

// agentFlags is everything `portico agent` is told, by flags or environment:
// the agent's Config (its Kube filled from kubeconfig) and the logging level.
type agentFlags struct {
	agent.Config
	kubeconfig string
	logLevel   logLevel
}

// parseAgentFlags reads flags; a flag not given on the command line falls back
// to the environment: PORTICO_<FLAG> (dashes as underscores), and NODE_NAME and
// POD_NAMESPACE as the DaemonSet's downward API sets them.
func parseAgentFlags(args []string, getenv func(string) string) (agentFlags, error) {
	return parseFlags("agent", args, getenv)
}

// parseFlags reads the flags of `portico agent`, or of `portico controller`
// (command "controller"), which takes the same ones so that it decides as the
// agents do, but runs on no node: no interface, node name or announcer.
func parseFlags(command string, args []string, getenv func(string) string) (agentFlags, error) {
	node := command == "agent"
	var (
		c                               agentFlags
		pools                           string
		seed, ringSize                  uint
		seedFile                        string
		httpPort, httpsPort, statusPort uint
		livenessPort, rise              uint
		steerPort                       uint
		priority, degraded, version     uint
		bgpConfig, nextHop6             string
		tunnel, reserved, groupNS       string
		claimSel                        string
		nodeIP                          string
		xdpMode                         string
		err                             error
	)
	fs := flag.NewFlagSet(command, flag.ContinueOnError)
	fs.StringVar(&c.Group, "group", "", "the group Service this node serves, namespace/name (required)")
	fs.StringVar(&c.Iface, "iface", "", "the edge interface: XDP, VRRP and ARP run on it (required); several separated by ',' are candidates, the first on the node is used; the node's annotation "+v1alpha1.AnnotationIface+" (the same form) replaces it")
	fs.StringVar(&c.Node, "node-name", "", "this node's name (env NODE_NAME)")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig path; empty: in-cluster config (env KUBECONFIG)")
	fs.StringVar(&c.APIServer, "apiserver", "", "with the in-cluster config: reach the API server at this URL (https://host:port) instead of the kubernetes Service, for clusters where Service addresses do not work before the edge does (no kube-proxy)")
	fs.StringVar(&c.Namespace, "namespace", "", "watch only this namespace; empty: all")
	fs.StringVar(&c.PodNamespace, "pod-namespace", "portico-system", "namespace of the leader Lease (env POD_NAMESPACE)")
	fs.StringVar(&pools, "vip-pool", "", "VIP pools the leader allocates from: CIDR[!excluded,...] separated by ';'")
	fs.UintVar(&seed, "hash-seed", legacySeed, "cluster-wide flow hash seed: must be equal on every node (-hash-seed-file, when it exists, wins)")
	fs.StringVar(&seedFile, "hash-seed-file", "", "file holding the flow hash seed (the chart's Secret <release>-hash-seed, random per install); absent: -hash-seed")
	fs.StringVar(&c.PinPath, "pin-path", dataplane.DefaultPinPath, "bpffs directory for xdp_lb's maps, program and link")
	fs.UintVar(&ringSize, "ring-size", uint(dataplane.DefaultRingSize), "Maglev table size (a prime), equal on every node")
	fs.StringVar(&xdpMode, "xdp-mode", string(dataplane.XDPBestEffort), "native: xdp_lb runs in native XDP mode (in the NIC driver) or the agent stops, saying why; "+
		"best-effort: native where the driver takes it, else generic mode (after the kernel allocated each packet: far slower), with a warning. "+
		"The mode in use is in portico status and the metric portico_xdp_attach_mode. An agent re-uses the XDP link an earlier one pinned and never detaches it: "+
		"with native, a node whose program runs in generic mode needs 'portico uninstall' first. "+
		"The agents the leader provisions for IngressClaims get the same")
	fs.StringVar(&c.NginxDir, "nginx-dir", "/var/lib/portico/nginx", "nginx prefix: configuration, certificates, pid file")
	fs.StringVar(&c.NginxDrainTimeout, "nginx-drain-timeout", "", `how long nginx workers a reload replaced keep serving the connections they hold ("30m", "12h"); empty: until those close`)
	fs.StringVar(&c.AccessLog, "access-log", "stdout", `where nginx writes one JSON line per request (time, client, host, method, path, status, bytes, durations, the Ingress and upstream that served it): "stdout" (the agent's standard output: the container's log, beside the agent's own log on standard error), a file, or "" for none`)
	fs.Float64Var(&c.AccessLogSample, "access-log-sample", 0.01, "the share of requests the access log writes, from 0.0001 to 1 (every request; each logged request costs nginx about 3 microseconds more)")
	fs.BoolVar(&c.NoTelemetry, "no-telemetry", false, "do not count requests by Ingress and upstream in nginx (the portico_http_* metrics)")
	fs.UintVar(&httpPort, "http-port", 80, "nginx HTTP port")
	fs.UintVar(&httpsPort, "https-port", 443, "nginx HTTPS port")
	fs.UintVar(&statusPort, "nginx-status-port", 10246, "nginx status port on 127.0.0.1 (health, stub_status)")
	fs.UintVar(&livenessPort, "liveness-port", 10247, "nginx answers every director's liveness checks on this port (on -node-ip alone when given, else on every address); 0 turns liveness checks off")
	fs.UintVar(&steerPort, "l4-steer-port", 10242, "nginx's two listeners for every L4 Service's TCP connections are on this port and the next (on the wildcard addresses, reachable only through the agent's sk_lookup program), so that a TCP Service that comes, changes or goes never reloads nginx; 0: a listener per TCP Service port, each new one a reload")
	fs.DurationVar(&c.Liveness.Interval, "liveness-interval", liveness.DefaultTiming.Interval, "time between two liveness checks of one replica")
	fs.DurationVar(&c.Liveness.DeadAfter, "liveness-dead-after", liveness.DefaultTiming.DeadAfter, "a replica with no good answer for this long gets no new flows")
	fs.UintVar(&rise, "liveness-rise", uint(liveness.DefaultTiming.Rise), "consecutive good answers that bring a dead replica back (doubled each time it dies again within -liveness-flap-window)")
	fs.DurationVar(&c.Liveness.FlapWindow, "liveness-flap-window", liveness.DefaultTiming.FlapWindow, "a replica that dies within this time of coming back needs twice as many good answers")
	fs.DurationVar(&c.Liveness.ReloadGrace, "liveness-reload-grace", liveness.DefaultTiming.ReloadGrace, "how long a replica whose nginx ended the probe connection itself (a reload) may take to answer on a new one before its silence counts (0: not at all)")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", ":9101", "address of /metrics, /healthz and /readyz")
	fs.StringVar(&nodeIP, "node-ip", "", "the node's own address (the chart gives status.hostIP): /metrics, /healthz and /readyz (on -metrics-addr's port) and nginx's liveness server listen on it alone, not on every address of the node; empty: -metrics-addr as it is, liveness on every address")
	fs.StringVar(&reserved, "reserved-ports", "", "ports other daemons of the edge nodes listen on, which no L4 Service may take, beyond ssh, BGP, BFD, the kubelet's and the agent's own: PORT/PROTOCOL separated by ',' (9100/tcp,53/udp)")
	fs.StringVar(&groupNS, "group-namespaces", "", "namespaces, beyond the agent's own and its group's, where a Service labelled portico.io/group=true is a group and IngressClaims are served, separated by ','; elsewhere they are refused with an Event")
	fs.BoolVar(&c.Pprof, "pprof", false, "also serve Go's profiles (/debug/pprof/) on the metrics address")
	fs.DurationVar(&c.Transition, "ring-transition", dataplane.DefaultTransition, "how long a VIP's earlier rings still count after its last change (a connection that sends nothing for that long is then carried by its holder's report, -held-reports)")
	var held bool
	fs.BoolVar(&held, "held-reports", true, "report this node's connections held off the ring (every one while the edges' liveness verdicts differ) on /held of the metrics port, and pin the other replicas' (keeps connections idle through a whole ring transition, and those of a director whose verdicts differ); the metrics port must be open between the group's nodes")
	fs.StringVar(&c.Announce, "announce", "vrrp", "how the VIPs reach clients: vrrp (one owner answers ARP/ND) or bgp (every edge announces them to the routers of -bgp-config)")
	fs.StringVar(&bgpConfig, "bgp-config", "", "with -announce=bgp: the BGP configuration file (YAML: asn, peers, bfdProfiles; see docs/bgp.md)")
	fs.BoolVar(&c.BGPPeerObjects, "bgp-peer-objects", true, "with -announce=bgp: also peer with the BGPPeer objects of -pod-namespace whose nodeSelectors match this node (with their BFDProfiles and password Secrets), following their changes live; false: the -bgp-config file's peers alone")
	fs.StringVar(&nextHop6, "bgp-nexthop6", "", "with -announce=bgp: this node's IPv6 next hop, to announce IPv6 VIPs")
	fs.StringVar(&c.Sites, "federation-peers", "", "with -announce=bgp, in a federation: the file naming the other sites' edges (YAML: site, peers; written by portico federation), for site hand-overs")
	fs.StringVar(&tunnel, "tunnel-address", "", "with -federation-peers: this node's IPv4 address for tunnels between sites; empty: the edge interface's first IPv4 address")
	fs.UintVar(&priority, "vrrp-priority", 100, "VRRP priority while healthy (1-254)")
	fs.UintVar(&degraded, "vrrp-degraded-priority", 10, "VRRP priority while unhealthy (XDP detached, maps stale, nginx down)")
	fs.UintVar(&version, "vrrp-version", 3, "VRRP version for IPv4 (2 for keepalived peers)")
	fs.DurationVar(&c.VRRPInterval, "vrrp-interval", 100*time.Millisecond, "VRRP advert interval")
	fs.BoolVar(&c.VRRPUnicast, "vrrp-unicast", true, "send VRRP adverts to the group's other agents (their status Leases name them) and accept adverts from them alone; false: multicast, from any source (for keepalived peers on the segment)")
	c.logLevel = logLevel{zapcore.InfoLevel}
	fs.Var(&c.logLevel, "log-level", "debug, info (the default), warn or error")
	fs.DurationVar(&c.ShutdownDelay, "shutdown-delay", 5*time.Second, "on SIGTERM, keep serving (unready) this long before releasing the VIP, so the replica's endpoint turns terminating everywhere first")
	fs.StringVar(&c.ClaimImage, "claim-image", "", "image of the agent DaemonSets the leader provisions for IngressClaims; empty: the built-in manifest's (deploy/agent.yaml)")
	fs.StringVar(&c.ClaimIface, "claim-iface", "", "edge interface of the agents the leader provisions for IngressClaims, as -iface (a claim's own is not used); empty: -iface")
	fs.StringVar(&claimSel, "claim-node-selector", "", "nodes the agents the leader provisions for IngressClaims run on, key=value separated by ','; a claim's own selector may narrow it, never widen it")
	fs.StringVar(&c.StateDir, "state-dir", agent.DefaultStateDir, "node-local directory recording what the agent changed on the host (to undo it) and holding the node's lock (one agent at a time); mount it from the host")
	fs.StringVar(&c.Pod, "pod", "", "this agent's own Pod, namespace/name (the chart gives the downward API's): when the DaemonSet that owns it is deleted (helm uninstall), the agent detaches xdp_lb and undoes the node as it stops; empty: it never does (portico uninstall does)")
	fs.BoolVar(&c.ReadOnly, "read-only", false, "only read the cluster: the controller Deployment (portico controller) makes the cluster-wide writes (allocations, statuses, Events, IngressClaims); without it this agent takes part in leader election and writes as leader")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	c.NoHeld = !held
	// Parsing stops at the first argument that is no flag: what follows it
	// (the chart's extraArgs come last) would be dropped unseen.
	if fs.NArg() > 0 {
		return c, fmt.Errorf("%q: not a flag (-name=value), and the flags after it would be ignored", fs.Arg(0))
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
				errs = append(errs, fmt.Errorf("environment for -%s, %q: %w", f.Name, v, err))
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
		c.Pools = append(c.Pools, pool)
	}
	if c.ClaimIface == "" {
		c.ClaimIface = c.Iface
	}
	c.ClaimLogLevel = c.logLevel.String()
	for _, f := range [][2]string{{"iface", c.Iface}, {"claim-iface", c.ClaimIface}} {
		if _, err := agent.ParseIfaces(f[1]); f[1] != "" && err != nil {
			return c, fmt.Errorf("-%s: %w", f[0], err)
		}
	}
	if c.ClaimNodeSelector, err = controlplane.ParseNodeSelector(claimSel); err != nil {
		return c, fmt.Errorf("-claim-node-selector: %w", err)
	}
	for _, ns := range strings.Split(groupNS, ",") {
		if ns = strings.TrimSpace(ns); ns != "" {
			c.GroupNamespaces = append(c.GroupNamespaces, ns)
		}
	}
	if nodeIP != "" {
		ip, perr := netip.ParseAddr(nodeIP)
		_, port, serr := net.SplitHostPort(c.MetricsAddr)
		if perr != nil || serr != nil {
			return c, fmt.Errorf("-node-ip %q with -metrics-addr %q: want an IP address and host:port", nodeIP, c.MetricsAddr)
		}
		c.NodeIP = ip.Unmap()
		c.MetricsAddr = net.JoinHostPort(c.NodeIP.String(), port)
	}
	if c.ReservedPorts, err = parsePorts(reserved); err != nil {
		return c, fmt.Errorf("-reserved-ports: %w", err)
	}
	if c.XDPMode, err = dataplane.ParseXDPMode(xdpMode); err != nil {
		return c, fmt.Errorf("-xdp-mode %q: want native or best-effort", xdpMode)
	}
	switch {
	case c.Group == "" || !strings.Contains(c.Group, "/"):
		return c, fmt.Errorf("-group namespace/name is required")
	case c.Iface == "" && node:
		return c, fmt.Errorf("-iface is required")
	case c.Pod != "" && !validPod(c.Pod):
		return c, fmt.Errorf("-pod %q: want namespace/name", c.Pod)
	case c.APIServer != "" && !validAPIServer(c.APIServer):
		return c, fmt.Errorf("-apiserver %q: want https://host:port", c.APIServer)
	case c.Node == "" && node:
		return c, fmt.Errorf("-node-name (or NODE_NAME) is required")
	case priority < 1 || priority > 254 || degraded < 1 || degraded >= priority:
		return c, fmt.Errorf("-vrrp-priority must be 1-254 and above -vrrp-degraded-priority (>= 1)")
	case httpPort > 65535 || httpsPort > 65535 || statusPort > 65535 || livenessPort > 65535:
		return c, fmt.Errorf("ports must be below 65536")
	case livenessPort != 0 && (c.Liveness.Interval <= 0 || c.Liveness.DeadAfter < c.Liveness.Interval || rise < 1 || rise > 1000):
		return c, fmt.Errorf("-liveness-interval must be positive, -liveness-dead-after at least one interval, -liveness-rise 1-1000")
	}
	switch {
	case !node:
		// The controller announces nothing: the BGP and tunnel files are the agents'.
		c.Announce, c.Sites = "", ""
	case c.Announce == "vrrp":
	case c.Announce == "bgp":
		if bgpConfig == "" {
			return c, fmt.Errorf("-announce=bgp needs -bgp-config")
		}
		f, err := bgpfile.Load(bgpConfig)
		if err != nil {
			return c, err
		}
		if nextHop6 != "" {
			if c.NextHop6, err = netip.ParseAddr(nextHop6); err != nil {
				return c, fmt.Errorf("-bgp-nexthop6: %w", err)
			}
		}
		// Checked now, with a placeholder router id: the agent fills in the node's.
		sc, err := agent.SpeakerConfig(f, c.Node, netip.MustParseAddr("192.0.2.1"), c.NextHop6)
		if err != nil {
			return c, fmt.Errorf("-bgp-config %s: %w", bgpConfig, err)
		}
		if len(sc.Peers) == 0 && !c.BGPPeerObjects {
			return c, fmt.Errorf("-bgp-config %s has no peer for node %s, and -bgp-peer-objects is off", bgpConfig, c.Node)
		}
		c.BGP = f
	default:
		return c, fmt.Errorf("-announce %q: want vrrp or bgp", c.Announce)
	}
	if c.Sites != "" && node {
		if c.Announce != "bgp" {
			return c, fmt.Errorf("-federation-peers needs -announce=bgp (anycast)")
		}
		// The file may come later (a ConfigMap the federation controller has not
		// written yet, mounted optional): the agent waits for it.
		if _, err := os.Stat(c.Sites); err == nil {
			if _, _, err := sites.Load(c.Sites); err != nil {
				return c, err
			}
		}
	}
	if tunnel != "" {
		a, err := netip.ParseAddr(tunnel)
		if err != nil || !a.Unmap().Is4() {
			return c, fmt.Errorf("-tunnel-address %q: want an IPv4 address", tunnel)
		}
		c.Tunnel = a.Unmap()
	}
	c.LivenessPort, c.Liveness.Rise = uint16(livenessPort), int(rise)
	if seed > math.MaxUint32 {
		return c, fmt.Errorf("-hash-seed %d: want at most %d", seed, uint32(math.MaxUint32))
	}
	c.Seed, c.RingSize = uint32(seed), uint32(ringSize)
	if seedFile != "" {
		s, ok, err := readSeed(seedFile)
		if err != nil {
			return c, err
		}
		if ok {
			c.Seed = s
		}
	}
	c.HTTPPort, c.HTTPSPort, c.StatusPort = uint16(httpPort), uint16(httpsPort), uint16(statusPort)
	if steerPort > math.MaxUint16-1 {
		return c, fmt.Errorf("-l4-steer-port %d: want at most %d (the next port is the PROXY listener's)", steerPort, math.MaxUint16-1)
	}
	c.L4SteerPort = uint16(steerPort)
	c.VRRPPriority, c.VRRPDegraded, c.VRRPVersion = uint8(priority), uint8(degraded), uint8(version)
	return c, nil
}

// legacySeed is the flow hash seed of every install before per-install seeds
// (and of any without the seed Secret): a public constant, so anyone who knows
// a group's replicas can pick 5-tuples that land on one of them. Changing an
// installed group's seed moves every flow, so an upgrade keeps it.
const legacySeed = 0x706f7274

// readSeed reads a seed file: a decimal (leading zeros allowed) or 0x-hex
// number below 2^32. A file
// that does not exist is no seed (ok false); one that does not parse is an
// error, since starting with another seed than the other edges' would send
// their connections elsewhere.
func readSeed(path string) (seed uint32, ok bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("-hash-seed-file: %w", err)
	}
	text, base := strings.TrimSpace(string(b)), 10 // the chart's may start with 0: not octal
	if h, ok := strings.CutPrefix(strings.ToLower(text), "0x"); ok {
		text, base = h, 16
	}
	v, err := strconv.ParseUint(text, base, 32)
	if err != nil {
		return 0, false, fmt.Errorf("-hash-seed-file %s: %q is not a number below 2^32", path, strings.TrimSpace(string(b)))
	}
	return uint32(v), true, nil
}

// logLevel is a -log-level flag: debug, info, warn or error (the chart's
// logLevel). zap's other levels (dpanic, panic, fatal) would hide the errors an
// operator needs, and are refused with the rest.
type logLevel struct{ zapcore.Level }

func (l *logLevel) Set(s string) error {
	switch s {
	case "debug", "info", "warn", "error":
		return l.Level.Set(s)
	}
	return errors.New("want debug, info, warn or error")
}

func newLogger(level logLevel) (*zap.Logger, error) {
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(level.Level)
	cfg.Sampling = nil
	return cfg.Build()
}

func runAgent(args []string) error {
	f, err := parseAgentFlags(args, os.Getenv)
	if err != nil {
		return err
	}
	return runWith(&f, func(ctx context.Context, log *zap.Logger) error {
		return agent.Run(ctx, f.Config, log.With(zap.String("node", f.Node), zap.String("group", f.Group)))
	})
}

// runWith sets up what `portico agent` and `portico controller` share (the
// logger, client-go's logging through it, the API server's configuration into
// f.Kube) and runs run until SIGINT or SIGTERM.
func runWith(f *agentFlags, run func(context.Context, *zap.Logger) error) error {
	log, err := newLogger(f.logLevel)
	if err != nil {
		return err
	}
	defer log.Sync()
	log.Info("portico", zap.String("version", version.Get().String()))
	klog.SetLogger(zapr.NewLogger(log.Named("k8s")))
	if f.Kube, err = kubeConfig(f.kubeconfig, f.APIServer); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return run(ctx, log)
}

// runController runs `portico controller`: the control plane that makes the
// cluster-wide writes, off the edges (the chart's controller Deployment), with
// the agents' own flags so that it decides as they do. Its identity in the
// leader Lease is POD_NAME (the Deployment's downward API), else the host name.
func runController(args []string) error {
	f, err := parseFlags("controller", args, os.Getenv)
	if err != nil {
		return err
	}
	identity := os.Getenv("POD_NAME")
	if identity == "" {
		if identity, err = os.Hostname(); err != nil {
			return fmt.Errorf("identity: %w", err)
		}
	}
	return runWith(&f, func(ctx context.Context, log *zap.Logger) error {
		return agent.RunController(ctx, f.Config, identity, log.With(zap.String("controller", identity)))
	})
}

// kubeConfig reads the kubeconfig at path, or without one the in-cluster config,
// whose API server apiServer replaces when set (-apiserver). Its client may make
// 50 requests a second (bursts of 100), not client-go's 5: the leader writes the
// status of every Ingress that changed, and a thousand new ones would otherwise
// wait minutes for their addresses.
func kubeConfig(path, apiServer string) (*rest.Config, error) {
	c, err := readKubeConfig(path, apiServer)
	if err != nil {
		return nil, err
	}
	c.QPS, c.Burst = 50, 100
	return c, nil
}

func readKubeConfig(path, apiServer string) (*rest.Config, error) {
	if path == "" {
		c, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config (set -kubeconfig outside a cluster): %w", err)
		}
		if apiServer != "" {
			c.Host = apiServer
		}
		return c, nil
	}
	if apiServer != "" {
		return nil, errors.New("-apiserver goes with the in-cluster config, not with -kubeconfig")
	}
	c, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return c, nil
}

// validAPIServer reports whether s is an https URL with a host and nothing after it.
func validAPIServer(s string) bool {
	u, err := url.Parse(s)
	return err == nil && u.Scheme == "https" && u.Host != "" && (u.Path == "" || u.Path == "/") && u.RawQuery == ""
}

// validPod reports whether s is namespace/name, both non-empty.
func validPod(s string) bool {
	ns, name, ok := strings.Cut(s, "/")
	return ok && ns != "" && name != "" && !strings.Contains(name, "/")
}

// parsePorts parses a list of PORT/PROTOCOL (tcp or udp) separated by ','.
func parsePorts(list string) ([]model.Port, error) {
	var out []model.Port
	for _, f := range strings.Split(list, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		num, proto, _ := strings.Cut(f, "/")
		n, err := strconv.ParseUint(num, 10, 16)
		p := model.Port{Protocol: model.Protocol(strings.ToUpper(proto)), Port: uint16(n)}
		if err != nil || n == 0 || (p.Protocol != model.TCP && p.Protocol != model.UDP) {
			return nil, fmt.Errorf("%q is not PORT/tcp or PORT/udp", f)
		}
		out = append(out, p)
	}
	return out, nil
}
