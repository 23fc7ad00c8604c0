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
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/dataplane/xdpaux"
	"github.com/portico-edge/portico/test/kapi"
	"github.com/portico-edge/portico/test/netlab"
)

// The nodes share 10.216.0.0/24 on the bridge; the VIP is the one
// deploy/examples/group.yaml gives its group (the client reaches it on-link).
var VIP = netip.MustParseAddr("192.0.2.80")

const (
	// GroupNamespace and GroupName name the group Service the agents serve: the
	// one in deploy/examples/group.yaml, which the lab applies as it is.
	GroupNamespace = "portico-system"
	GroupName      = "edge"
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

// Agent is one `portico agent` process on an edge node.
type Agent struct {
	Edge    *Node
	PinPath string
	Dir     string // nginx prefix and log
	cmd     *exec.Cmd
	done    chan struct{}
}

// Lab is one running lab.
type Lab struct {
	Net     *netlab.Lab
	API     *kapi.Server
	Kube    kubernetes.Interface
	Client  *Node
	Edges   []*Node
	Pods    []*Node
	Portico string // the portico binary
	Dir     string

	apiPort string
	mu      sync.Mutex
	agents  map[int]*Agent
	closers []func() error
}

// Options size a lab.
type Options struct {
	Portico string // path of the portico binary (required)
	Edges   int    // default 3
	Pods    int    // backend pods, default 2
	// VRRPInterval is the agents' advert interval (default 100ms).
	VRRPInterval time.Duration
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
	l = &Lab{Portico: o.Portico, Dir: dir, agents: map[int]*Agent{}}
	defer func() {
		if err != nil {
			l.Close()
			l = nil
		}
	}()
	l.closers = append(l.closers, func() error { return os.RemoveAll(dir) })

	if l.API, err = kapi.Launch(ctx, kapi.Options{}); err != nil {
		return l, err
	}
	l.closers = append(l.closers, l.API.Stop)
	u, err := url.Parse(l.API.Config.Host)
	if err != nil {
		return l, err
	}
	l.apiPort = u.Port()
	if l.Kube, err = kubernetes.NewForConfig(l.API.Config); err != nil {
		return l, err
	}

	if l.Net, err = netlab.New("pl"); err != nil {
		return l, err
	}
	l.closers = append(l.closers, l.Net.Close)
	add := func(name string, host int) (*Node, error) {
		addr := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 216, 0, byte(host)}), 24)
		mac := net.HardwareAddr{0x02, 0, 10, 216, 0, byte(host)}
		n, err := l.Net.AddNode(name, addr, mac)
		if err != nil {
			return nil, err
		}
		return &Node{Node: n}, nil
	}
	if l.Client, err = add("cl", 2); err != nil {
		return l, err
	}
	// The VIP is outside the nodes' subnet: the client reaches it on-link, and
	// the VRRP master answers ARP for it.
	if err := netlab.IP("-n", l.Client.NS, "route", "add", VIP.String()+"/32", "dev", "eth0"); err != nil {
		return l, err
	}
	for i := range o.Edges {
		e, err := add(fmt.Sprintf("e%d", i+1), 11+i)
		if err != nil {
			return l, err
		}
		l.Edges = append(l.Edges, e)
		// xdp_lb's XDP_TX frames leave a veth only if its peer runs XDP.
		if err := netlab.Do(l.Net.Switch, func() error {
			c, err := xdpaux.AttachPass(e.Port)
			if err == nil {
				l.Net.OnClose(c.Close)
			}
			return err
		}); err != nil {
			return l, err
		}
		if err := l.forwardAPI(e); err != nil {
			return l, err
		}
	}
	for i := range o.Pods {
		p, err := add(fmt.Sprintf("p%d", i+1), 21+i)
		if err != nil {
			return l, err
		}
		l.Pods = append(l.Pods, p)
	}
	if err := l.createObjects(ctx); err != nil {
		return l, err
	}
	return l, nil
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

func ptr[T any](v T) *T { return &v }

// createObjects writes the cluster state the lab starts from: the group Service
// and its EndpointSlice (every edge node, ready), and the Lease namespace.
func (l *Lab) createObjects(ctx context.Context) error {
	for _, f := range []string{"namespace.yaml", "examples/group.yaml"} {
		if err := l.ApplyFile(ctx, f); err != nil {
			return err
		}
	}
	svc, err := l.Kube.CoreV1().Services(GroupNamespace).Get(ctx, GroupName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("example group: %w", err)
	}
	if v := svc.Annotations["portico.io/vip"]; v != VIP.String() {
		return fmt.Errorf("deploy/examples/group.yaml gives the group VIP %q, the lab expects %s: update lab.VIP", v, VIP)
	}
	if _, err := l.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: AppNamespace}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", AppNamespace, err)
	}
	// No kubelet runs: the lab writes the endpoints of the example's Services.
	if err := l.writeSlice(ctx, GroupNamespace, "web", l.Pods...); err != nil {
		return err
	}
	return l.SetGroupEndpoints(ctx, nil)
}

// SetGroupEndpoints writes the group's EndpointSlice: every edge node, ready,
// except those marked "terminating" (not ready, terminating) or "gone" (left out).
func (l *Lab) SetGroupEndpoints(ctx context.Context, state map[*Node]string) error {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: GroupNamespace, Name: GroupName + "-lab", Labels: map[string]string{discoveryv1.LabelServiceName: GroupName}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(80)), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	for _, e := range l.Edges {
		st := state[e]
		if st == "gone" {
			continue
		}
		ready, term := st != "terminating", st == "terminating"
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{e.Addr.Addr().String()},
			NodeName:   ptr(e.Name),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready), Serving: ptr(true), Terminating: ptr(term)},
		})
	}
	c := l.Kube.DiscoveryV1().EndpointSlices(GroupNamespace)
	old, err := c.Get(ctx, es.Name, metav1.GetOptions{})
	if err == nil {
		es.ResourceVersion = old.ResourceVersion
		_, err = c.Update(ctx, es, metav1.UpdateOptions{})
	} else {
		_, err = c.Create(ctx, es, metav1.CreateOptions{})
	}
	if err != nil {
		return fmt.Errorf("write group endpoints: %w", err)
	}
	return nil
}

// Backend is an app Service whose endpoints are lab pods listening on BackendPort.
func (l *Lab) Backend(ctx context.Context, name string, pods ...*Node) error {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: AppNamespace, Name: name},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
	if _, err := l.Kube.CoreV1().Services(AppNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create service %s: %w", name, err)
	}
	return l.writeSlice(ctx, AppNamespace, name, pods...)
}

// writeSlice creates the EndpointSlice of a Service whose port "http" the given
// pods serve on BackendPort.
func (l *Lab) writeSlice(ctx context.Context, ns, name string, pods ...*Node) error {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name + "-lab", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(BackendPort)), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	for _, p := range pods {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{p.Addr.Addr().String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}})
	}
	if _, err := l.Kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create endpoints of %s/%s: %w", ns, name, err)
	}
	return nil
}

// Route sends a Prefix path to a backend Service's "http" port.
type Route struct{ Path, Service string }

// Ingress routes host (all paths, Prefix "/") to a backend Service, bound to the
// lab's group.
func (l *Lab) Ingress(ctx context.Context, name, host, service string) error {
	return l.IngressRoutes(ctx, name, host, "", Route{Path: "/", Service: service})
}

// IngressRoutes creates an Ingress for host with the given routes, bound to the
// lab's group, with TLS from tlsSecret when it is not "".
func (l *Lab) IngressRoutes(ctx context.Context, name, host, tlsSecret string, routes ...Route) error {
	pt := networkingv1.PathTypePrefix
	rule := networkingv1.IngressRule{Host: host, IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{}}}
	for _, r := range routes {
		rule.HTTP.Paths = append(rule.HTTP.Paths, networkingv1.HTTPIngressPath{Path: r.Path, PathType: &pt,
			Backend: networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: r.Service, Port: networkingv1.ServiceBackendPort{Name: "http"}}}})
	}
	ing := &networkingv1.Ingress{
		ObjectMeta: metav1.ObjectMeta{Namespace: AppNamespace, Name: name,
			Annotations: map[string]string{"portico.io/group": GroupNamespace + "/" + GroupName}},
		Spec: networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{rule}},
	}
	if tlsSecret != "" {
		ing.Spec.TLS = []networkingv1.IngressTLS{{Hosts: []string{host}, SecretName: tlsSecret}}
	}
	if _, err := l.Kube.NetworkingV1().Ingresses(AppNamespace).Create(ctx, ing, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create ingress %s: %w", name, err)
	}
	return nil
}

// TLSSecret stores a certificate and key as a kubernetes.io/tls Secret.
func (l *Lab) TLSSecret(ctx context.Context, name string, certPEM, keyPEM []byte) error {
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: AppNamespace, Name: name}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}}
	if _, err := l.Kube.CoreV1().Secrets(AppNamespace).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create secret %s: %w", name, err)
	}
	return nil
}

// StartAgent starts `portico agent` on edge i (0-based) and returns once the
// process runs; use WaitReady for readiness.
func (l *Lab) StartAgent(i int) (*Agent, error) {
	e := l.Edges[i]
	a := &Agent{Edge: e, PinPath: "/sys/fs/bpf/" + l.Net.Prefix + e.Name, Dir: filepath.Join(l.Dir, e.Name), done: make(chan struct{})}
	if err := os.MkdirAll(a.Dir, 0o755); err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(filepath.Join(a.Dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	// nsenter --net, not `ip netns exec`: the latter gives the agent a private
	// mount namespace with a fresh /sys, hiding the node's bpffs, where pins must
	// outlive the agent (as the DaemonSet's /sys/fs/bpf hostPath does).
	a.cmd = exec.Command("nsenter", "--net=/run/netns/"+e.NS, l.Portico, "agent",
		"-group", GroupNamespace+"/"+GroupName, "-iface", "eth0", "-node-name", e.Name,
		"-kubeconfig", l.API.Kubeconfig, "-pin-path", a.PinPath, "-nginx-dir", filepath.Join(a.Dir, "nginx"),
		"-metrics-addr", "127.0.0.1:9101", "-vrrp-interval", "100ms", "-log-level", "debug",
		"-state-dir", filepath.Join(a.Dir, "state"), "-shutdown-delay", "1500ms")
	a.cmd.Stdout, a.cmd.Stderr = logf, logf
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start agent on %s: %w", e.Name, err)
	}
	go func() { a.cmd.Wait(); logf.Close(); close(a.done) }()
	l.mu.Lock()
	l.agents[i] = a
	l.mu.Unlock()
	return a, nil
}

// Kill sends sig to the agent and waits for it to exit.
func (a *Agent) Kill(sig syscall.Signal, timeout time.Duration) error {
	if err := a.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-a.done:
		return nil
	case <-time.After(timeout):
		a.cmd.Process.Kill()
		<-a.done
		return fmt.Errorf("agent on %s did not exit within %v of %v", a.Edge.Name, timeout, sig)
	}
}

// Ready asks edge i's agent for /readyz from inside its namespace.
func (l *Lab) Ready(i int) error {
	ns := l.Edges[i].NS
	dial := func(ctx context.Context, network, addr string) (c net.Conn, err error) {
		var d net.Dialer
		err = netlab.Do(ns, func() error { c, err = d.DialContext(ctx, network, addr); return err })
		return c, err
	}
	c := http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: dial}}
	resp, err := c.Get("http://127.0.0.1:9101/readyz")
	if err != nil {
		return fmt.Errorf("agent on %s: %w", l.Edges[i].Name, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("agent on %s not ready: %s", l.Edges[i].Name, strings.TrimSpace(string(body)))
	}
	return nil
}

// Exited reports whether the agent process has ended.
func (a *Agent) Exited() bool {
	select {
	case <-a.done:
		return true
	default:
		return false
	}
}

// LastLogLine returns the last non-empty line of the agent's log.
func (a *Agent) LastLogLine() string {
	lines := strings.Split(strings.TrimSpace(a.Log()), "\n")
	return lines[len(lines)-1]
}

// Log returns the agent's log.
func (a *Agent) Log() string {
	b, _ := os.ReadFile(filepath.Join(a.Dir, "agent.log"))
	return string(b)
}

// EdgeNo returns n's position in Edges (the i of StartAgent, Agent and Ready).
func (l *Lab) EdgeNo(n *Node) int {
	for i, e := range l.Edges {
		if e == n {
			return i
		}
	}
	panic("lab: " + n.Name + " is not an edge node")
}

// Agent returns the agent on edge i, if one was started.
func (l *Lab) Agent(i int) *Agent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.agents[i]
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

// stopNginx stops the nginx master whose pid file is in dir, if it is still
// running and is this lab's (its command line names dir).
func (l *Lab) stopNginx(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "nginx.pid"))
	if err != nil {
		return nil
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return nil
	}
	running := func() bool {
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		return err == nil && strings.Contains(string(cmd), dir)
	}
	if !running() {
		return nil
	}
	syscall.Kill(pid, syscall.SIGTERM)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if !running() {
			return nil
		}
	}
	syscall.Kill(pid, syscall.SIGKILL)
	return fmt.Errorf("nginx %d in %s did not stop on SIGTERM; killed", pid, dir)
}

// Owner returns the edge whose eth0 holds the VIP (the VRRP master), if exactly
// one does.
func (l *Lab) Owner() (*Node, error) {
	var owners []*Node
	for _, e := range l.Edges {
		out, err := netlab.Exec(e.NS, "ip", "-4", "-o", "addr", "show", "dev", "eth0")
		if err != nil {
			return nil, err
		}
		if containsAddr(out, VIP) {
			owners = append(owners, e)
		}
	}
	if len(owners) != 1 {
		return nil, fmt.Errorf("%d edges own %s", len(owners), VIP)
	}
	return owners[0], nil
}

func containsAddr(ipOutput string, a netip.Addr) bool {
	for _, f := range strings.Fields(ipOutput) {
		if p, err := netip.ParsePrefix(f); err == nil && p.Addr() == a {
			return true
		}
	}
	return false
}

// Up serves the backend pods, creates the "echo" Service over them and an Ingress
// for echo.lab, starts every agent and waits until every agent is ready, one edge
// owns the VIP, and both the example's host and echo.lab are served through it.
func (l *Lab) Up(ctx context.Context, timeout time.Duration) error {
	if err := l.ServePods(); err != nil {
		return err
	}
	if err := l.Backend(ctx, "echo", l.Pods...); err != nil {
		return err
	}
	if err := l.Ingress(ctx, "echo", "echo.lab", "echo"); err != nil {
		return err
	}
	for i := range l.Edges {
		if _, err := l.StartAgent(i); err != nil {
			return err
		}
	}
	c := l.HTTPClient(false, 2*time.Second)
	deadline := time.Now().Add(timeout)
	for {
		for i := range l.Edges {
			if a := l.Agent(i); a != nil && a.Exited() {
				return fmt.Errorf("agent on %s exited: %s", a.Edge.Name, a.LastLogLine())
			}
		}
		err := func() error {
			for i := range l.Edges {
				if err := l.Ready(i); err != nil {
					return err
				}
			}
			if _, err := l.Owner(); err != nil {
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
