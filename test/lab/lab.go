// Package lab is Portico's whole system on one machine: network namespaces as
// three edge nodes, a client and backend "pods", all on one bridge; a real etcd +
// kube-apiserver; one `portico agent` process per edge node. It is what the
// end-to-end tests, `make lab` and `make demo` stand on.
//
// The API server listens on the root namespace's loopback; inside each edge
// namespace the lab forwards 127.0.0.1:<port> to it, so agents use the same
// kubeconfig (and its certificate) as the tests. No kubelet or controllers run:
// the lab writes the EndpointSlices itself.
package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/dataplane/xdpaux"
	"github.com/portico-edge/portico/test/kapi"
	"github.com/portico-edge/portico/test/netlab"
	"github.com/portico-edge/portico/test/traffic"
)

// The nodes share 10.216.0.0/24 on the bridge; the VIP is the one
// deploy/examples/group.yaml gives its group (the client reaches it on-link).
var VIP = netip.MustParseAddr("192.0.2.80")

const (
	// GroupNamespace and GroupName name the group Service the agents serve: the
	// one in deploy/examples/group.yaml, which the lab applies as it is.
	GroupNamespace = "portico-system"
	GroupName      = "edge"
	// AgentNamespace is the agents' own (-pod-namespace's default): their
	// status Leases, and the BGPPeer objects they follow.
	AgentNamespace = "portico-system"
	// ExampleHost is the host of the example Ingress (bound through the
	// example IngressClass), served by the example Service "web".
	ExampleHost = "web.example.com"
	// AppNamespace holds the backend Services and Ingresses.
	AppNamespace = "apps"
	// BackendPort is where the backend pods listen.
	BackendPort = 8080
)

// Node is one namespace of the lab.
type Node struct {
	*netlab.Node
}

// Lab is one running lab.
type Lab struct {
	Net    *netlab.Lab
	API    *kapi.Server
	Kube   kubernetes.Interface
	Client *Node
	Edges  []*Node
	Pods   []*Node
	// Router is the BGP lab's router (Options.BGP), nil otherwise.
	Router  *Router
	Portico string // the portico binary
	Dir     string
	// Target sends the client's traffic to the VIP (Dial, Get, OpenKeepConn,
	// StartStream, StartLoad, ...).
	traffic.Target

	apiPort string
	bgp     *BGPOptions
	// subnet is the second octet of the nodes' 10.x.0.0/24 (216 unless the
	// lab is one site of several, test/lab/sites); name prefixes the site's nodes.
	subnet byte
	// transition is the agents' -ring-transition (0: their default).
	transition time.Duration
	name       string
	// SitesFile, for a site of several (test/lab/sites), is the agents' --federation-peers.
	SitesFile string
	mu        sync.Mutex
	agents    map[int]*Agent
	closers   []func() error
	// routes: the gatewayed routes of each edge KillEdge took down (a cut
	// link drops them), which reviveEdge puts back as a rebooted node's
	// network configuration would.
	routes map[*Node][]string
}

// Options size a lab.
type Options struct {
	Portico string // path of the portico binary (required)
	Edges   int    // default 3
	Pods    int    // backend pods, default 2
	// VRRPInterval is the agents' advert interval (default 100ms).
	VRRPInterval time.Duration
	// BGP, if set, puts the client behind a router (FRR) and runs the agents with
	// --announce=bgp: see BGPOptions.
	BGP *BGPOptions
	// Transition is the agents' -ring-transition (0: their default, 2 min).
	Transition time.Duration
	// GatewayAPI installs Gateway API's CRDs before the agents start (their
	// controllers watch Gateways only when the CRDs are served at start).
	GatewayAPI bool
}

// Start builds the lab. Close removes everything, also after a failed Start.
func Start(ctx context.Context, o Options) (l *Lab, err error) {
	if o.Edges == 0 {
		o.Edges = 3
	}
	if o.Pods == 0 {
		o.Pods = 2
	}
	if o.VRRPInterval == 0 {
		o.VRRPInterval = 100 * time.Millisecond
	}
	if _, err := os.Stat(o.Portico); err != nil {
		return nil, fmt.Errorf("portico binary: %w", err)
	}
	dir, err := os.MkdirTemp("", "portico-lab-")
	if err != nil {
		return nil, err
	}
	// nginx's workers (an unprivileged user) read the L4 endpoint files under
	// each agent's nginx directory, as they do under /var/lib/portico.
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, err
	}
	l = &Lab{Portico: o.Portico, Dir: dir, agents: map[int]*Agent{}, bgp: o.BGP, subnet: 216, transition: o.Transition}
	defer func() {
		if err != nil {
			l.Close()
			l = nil
		}
	}()
	l.closers = append(l.closers, func() error { return os.RemoveAll(dir) })
	if l.Net, err = netlab.New("pl"); err != nil {
		return l, err
	}
	l.closers = append(l.closers, l.Net.Close)
	if o.BGP != nil {
		var edges []netip.Addr
		for i := range o.Edges {
			edges = append(edges, l.EdgeAddr(i))
		}
		if err := l.startRouter(o.BGP, []byte{l.subnet}, edges); err != nil {
			return l, err
		}
	} else {
		if l.Client, err = l.add("cl", 2); err != nil {
			return l, err
		}
		l.Target = traffic.Target{NS: l.Client.NS, VIP: VIP}
		// The VIP is outside the nodes' subnet: the client reaches it on-link, and
		// the VRRP master answers ARP for it.
		if err := netlab.IP("-n", l.Client.NS, "route", "add", VIP.String()+"/32", "dev", "eth0"); err != nil {
			return l, err
		}
	}
	return l, l.BuildSite(ctx, o)
}

// add creates the node 10.<subnet>.0.<host>/24 on the lab's bridge.
func (l *Lab) add(name string, host int) (*Node, error) {
	addr := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, l.subnet, 0, byte(host)}), 24)
	mac := net.HardwareAddr{0x02, 0, 10, l.subnet, 0, byte(host)}
	n, err := l.Net.AddNode(l.name+name, addr, mac)
	if err != nil {
		return nil, err
	}
	return &Node{Node: n}, nil
}

// BuildSite builds one cluster on the lab's network: its API server, its edges
// and pods, and the objects it starts from. The network (and, for BGP, the router
// and the client) is there already.
func (l *Lab) BuildSite(ctx context.Context, o Options) (err error) {
	if l.API, err = kapi.Launch(ctx, kapi.Options{}); err != nil {
		return err
	}
	l.closers = append(l.closers, l.API.Stop)
	u, err := url.Parse(l.API.Config.Host)
	if err != nil {
		return err
	}
	l.apiPort = u.Port()
	if l.Kube, err = kubernetes.NewForConfig(l.API.Config); err != nil {
		return err
	}
	for i := range o.Edges {
		e, err := l.add(fmt.Sprintf("e%d", i+1), 11+i)
		if err != nil {
			return err
		}
		l.Edges = append(l.Edges, e)
		if o.BGP != nil {
			// Replies (direct server return) go to the client through the router.
			if err := netlab.IP("-n", e.NS, "route", "add", ClientSubnet.String(), "via", l.RouterAddr().String()); err != nil {
				return err
			}
		}
		// xdp_lb's XDP_TX frames leave a veth only if its peer runs XDP.
		if err := netlab.Do(l.Net.Switch, func() error {
			c, err := xdpaux.AttachPass(e.Port)
			if err == nil {
				l.Net.OnClose(c.Close)
			}
			return err
		}); err != nil {
			return err
		}
		if err := l.forwardAPI(e); err != nil {
			return err
		}
	}
	for i := range o.Pods {
		p, err := l.add(fmt.Sprintf("p%d", i+1), 21+i)
		if err != nil {
			return err
		}
		l.Pods = append(l.Pods, p)
	}
	if o.GatewayAPI {
		for _, f := range []string{"gatewayclasses", "gateways", "httproutes", "referencegrants"} {
			if err := l.ApplyFile(ctx, "crds/gateway-api/gateway.networking.k8s.io_"+f+".yaml"); err != nil {
				return err
			}
		}
	}
	return l.createObjects(ctx)
}

// forwardAPI listens on 127.0.0.1:<api port> inside the edge's namespace and
// relays each connection to the API server on the root namespace's loopback.
func (l *Lab) forwardAPI(e *Node) error {
	var ln net.Listener
	if err := netlab.Do(e.NS, func() (err error) {
		ln, err = net.Listen("tcp", "127.0.0.1:"+l.apiPort)
		return err
	}); err != nil {
		return fmt.Errorf("api forwarder in %s: %w", e.NS, err)
	}
	l.Net.OnClose(ln.Close)
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer in.Close()
				out, err := net.DialTimeout("tcp", "127.0.0.1:"+l.apiPort, 5*time.Second)
				if err != nil {
					return
				}
				defer out.Close()
				go func() { io.Copy(out, in); out.(*net.TCPConn).CloseWrite() }()
				io.Copy(in, out)
			}()
		}
	}()
	return nil
}

// Close stops every agent (SIGTERM, then SIGKILL), removes their pins, and tears
// the lab down, reporting every failure.
func (l *Lab) Close() error {
	var errs []error
	l.mu.Lock()
	agents := l.agents
	l.agents = map[int]*Agent{}
	l.mu.Unlock()
	for _, a := range agents {
		if err := a.Kill(syscall.SIGTERM, 10*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	for i := range l.Edges {
		pin := "/sys/fs/bpf/" + l.Net.Prefix + l.Edges[i].Name
		if err := dataplane.Uninstall(pin); err != nil {
			errs = append(errs, err)
		}
		// nginx outlives an agent killed with -9 (the next agent adopts it): stop
		// any master an agent of this lab left.
		if err := l.stopNginx(filepath.Join(l.Dir, l.Edges[i].Name, "nginx")); err != nil {
			errs = append(errs, err)
		}
	}
	for i := len(l.closers) - 1; i >= 0; i-- {
		if err := l.closers[i](); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// StartEcho is the bring-up Up and test/lab/sites' Sites.Up share: it serves the backend pods,
// creates the "echo" Service over them, routes echo.lab to it with route (an
// Ingress or a FederatedIngress) and starts every edge's agent.
func (l *Lab) StartEcho(ctx context.Context, route func(ctx context.Context, name, host, service string) error) error {
	if err := l.ServePods(); err != nil {
		return err
	}
	if err := l.Backend(ctx, "echo", l.Pods...); err != nil {
		return err
	}
	if err := route(ctx, "echo", "echo.lab", "echo"); err != nil {
		return err
	}
	for i := range l.Edges {
		if _, err := l.StartAgent(i); err != nil {
			return err
		}
	}
	return nil
}

// AgentExited names the first edge whose agent has exited, with its last log
// line; nil while every started agent runs.
func (l *Lab) AgentExited() error {
	for i := range l.Edges {
		if a := l.Agent(i); a != nil && a.Exited() {
			return fmt.Errorf("agent on %s exited: %s", a.Edge.Name, a.LastLogLine())
		}
	}
	return nil
}

// AgentsReady returns Ready's error for the first edge that is not ready, or
// nil when every edge is.
func (l *Lab) AgentsReady() error {
	for i := range l.Edges {
		if err := l.Ready(i); err != nil {
			return err
		}
	}
	return nil
}

// Up serves the backend pods, creates the "echo" Service over them and an Ingress
// for echo.lab, starts every agent and waits until every agent is ready, one edge
// owns the VIP, and both the example's host and echo.lab are served through it.
func (l *Lab) Up(ctx context.Context, timeout time.Duration) error {
	if err := l.StartEcho(ctx, l.Ingress); err != nil {
		return err
	}
	c := l.HTTPClient(false, 2*time.Second)
	deadline := time.Now().Add(timeout)
	for {
		if err := l.AgentExited(); err != nil {
			return err
		}
		err := func() error {
			if err := l.AgentsReady(); err != nil {
				return err
			}
			if l.Router != nil {
				if err := l.Router.Announced(len(l.Edges)); err != nil {
					return err
				}
			} else if _, err := l.Owner(); err != nil {
				return err
			}
			if _, err := l.Get(ctx, c, ExampleHost, "/"); err != nil {
				return err
			}
			_, err := l.Get(ctx, c, "echo.lab", "/")
			return err
		}()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lab not serving after %v: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
