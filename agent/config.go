package agent

import (
	"github.com/portico-edge/portico/api/bgpfile"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/portico-edge/portico/controlplane"
	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/liveness"
)

// Config is everything the agent is told (cmd/portico fills it from flags and
// the environment, and checks it).
type Config struct {
	Kube  *rest.Config // the API server
	Group string       // the group Service this node serves, namespace/name
	// Iface is the edge interface: XDP, VRRP and ARP run on it. Several
	// separated by "," are candidates, the first present on the node is used;
	// the node's portico.io/iface annotation, when set, replaces it (ChooseIface).
	Iface        string
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
	// AccessLog is where nginx writes its JSON access log ("stdout", a file, or
	// "" for none) and AccessLogSample the share of requests it logs
	// (nginx.Options.AccessLog). NoTelemetry turns off the per-Ingress
	// portico_http_* counts (nginx.Options.Telemetry).
	AccessLog       string
	AccessLogSample float64
	NoTelemetry     bool
	// L4SteerPort, when not 0, is the first of the two ports of nginx's fixed
	// listeners for L4 Services' TCP connections (plain, then PROXY), which an
	// sk_lookup program steers each VIP:port to (nginx.Options.L4Steered): a
	// TCP Service then never reloads nginx. 0 gives each TCP port a listener.
	L4SteerPort uint16
	// XDPMode is which attach modes xdp_lb may run in (native or best-effort,
	// dataplane.Options.XDPMode); the agents this one provisions for
	// IngressClaims get the same.
	XDPMode dataplane.XDPMode

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
	// Transition is how long a VIP's earlier rings count after its last
	// change (dataplane.Options.Transition; 0: dataplane.DefaultTransition).
	Transition time.Duration
	// NoHeld turns the held-connection reports off (held.go): this agent
	// neither serves its list nor pins its peers'. Every agent of a group
	// serves its list on its metrics port, which the others must reach.
	NoHeld bool
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
	// BGPPeerObjects (--announce=bgp): the agent also peers with the BGPPeer
	// objects of PodNamespace that select its node, followed live (bgppeers.go).
	BGPPeerObjects bool
	NextHop6       netip.Addr // --announce=bgp: this node's IPv6 next hop for IPv6 VIPs

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
	// ClaimLogLevel is those DaemonSets' agents' --log-level: this process's
	// own (debug, info, warn or error); empty: deploy/agent.yaml's.
	ClaimLogLevel string
	// APIServer is the API server this agent was told to use instead of the
	// in-cluster Service (--apiserver); the agents of the IngressClaims it provisions
	// are told the same.
	APIServer string

	// Sites is the federation peers file (--federation-peers, api/sites);
	// empty: no site hand-over. Tunnel is this node's tunnel address for it.
	Sites  string
	Tunnel netip.Addr

	StateDir string // records what the agent changed on the host; holds the node's lock
	// Pod is the agent's own Pod, namespace/name: when its DaemonSet is deleted
	// the agent undoes the node as it stops (owner.go). Empty: it never does.
	Pod           string
	ShutdownDelay time.Duration // serving, unready, after ctx ends and before the VIP is released
}

// DefaultStateDir is the node-local directory where the agent records what it
// changed on the host (see UndoHost).
const DefaultStateDir = "/run/portico"

// controlplaneConfig is the control plane's configuration for cfg: an agent's
// and the controller's decide alike from the same flags (the same pools,
// reserved ports and group namespaces).
func controlplaneConfig(cfg Config, client kubernetes.Interface, dyn dynamic.Interface, log *zap.Logger, reg prometheus.Registerer) controlplane.Config {
	return controlplane.Config{
		Client: client, Dynamic: dyn, Logger: log.Named("controlplane"), Registerer: reg,
		Namespace: cfg.Namespace, Pools: cfg.Pools, ReservedPorts: ReservedPorts(cfg), GroupNamespaces: GroupNamespaces(cfg),
		AgentXDPMode:   string(cfg.XDPMode),
		LeaseNamespace: cfg.PodNamespace, ReleaseOnCancel: true, AgentImage: cfg.ClaimImage, AgentAPIServer: cfg.APIServer,
		AgentLogLevel: cfg.ClaimLogLevel, ClaimIface: cfg.ClaimIface, ClaimNodeSelector: cfg.ClaimNodeSelector,
	}
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
