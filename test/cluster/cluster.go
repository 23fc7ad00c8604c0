// Package cluster is a real Kubernetes cluster on one machine, under Portico's
// end-to-end tests of the installed system: etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler, and N nodes, each a real kubelet with
// its own containerd, all built from the Go module proxy and Debian packages.
//
// Everything lives in namespaces with a per-run prefix (test/netlab): the control
// plane runs in the switch namespace, which holds the bridge and its address
// (APIAddr); each node is a network namespace on that bridge plus a mount namespace
// (its own sysfs with the cgroup hierarchies mounted again, its own bpffs at
// /sys/fs/bpf, a private /run, /var/log and /var/lib, files of its own over the
// host-wide /proc/sys entries the kubelet writes) and a UTS namespace (hostname = node
// name), entered with nsenter and unshare, not `ip netns exec`, which remounts /sys
// and loses the cgroup mounts. A hostNetwork pod of node N therefore sees node N's
// links, hostname and bpffs. A client namespace outside the cluster sits on the same
// bridge. The bridge side of every node's link runs an XDP_PASS program, so frames
// an edge node's XDP program sends back out (XDP_TX) leave the veth. Each node's processes (containerd, its shims, the kubelet and every
// container) live under the node's cgroup, which Close empties by PID.
//
// Not isolated per node: PID and IPC namespaces, /etc, and the kernel.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/portico-edge/portico/dataplane/xdpaux"
	"github.com/portico-edge/portico/test/kapi"
	"github.com/portico-edge/portico/test/netlab"
	"github.com/portico-edge/portico/test/testenv"
)

// KubeVersion is the version of kubelet, kube-controller-manager and kube-scheduler
// that hack/kube.sh builds (hack/kube/go.mod); the API server's is kapi.KubeVersion.
const KubeVersion = "v1.36.3"

// BinDir is where hack/kube.sh caches kubelet, kube-controller-manager and kube-scheduler:
// $PORTICO_CLUSTER_DIR if set, else
// ${PORTICO_CLUSTER_CACHE:-${XDG_CACHE_HOME:-~/.cache}/portico/cluster}/k8s-<v>.
func BinDir() string {
	if d := os.Getenv("PORTICO_CLUSTER_DIR"); d != "" {
		return d
	}
	return filepath.Join(kapi.CacheDir("PORTICO_CLUSTER_CACHE", "cluster"), "k8s-"+KubeVersion)
}

// programs are what a cluster needs from the machine (hack/deps.sh installs them).
var programs = []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "nsenter", "unshare", "ip", "go"}

// Available reports whether a cluster can start here, and if not, why.
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (namespaces, mounts, cgroups)")
	}
	if err := kapi.Available(); err != nil {
		return err
	}
	for _, b := range []string{"kubelet", "kube-proxy", "kube-controller-manager", "kube-scheduler"} {
		if st, err := os.Stat(filepath.Join(BinDir(), b)); err != nil || st.Mode()&0o111 == 0 {
			return fmt.Errorf("%s not built (run make kube)", b)
		}
	}
	for _, p := range programs {
		if _, err := exec.LookPath(p); err != nil {
			return fmt.Errorf("%s is not installed (run make deps)", p)
		}
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		return errors.New("the CNI plugins are not installed (run make deps)")
	}
	return nil
}

// Require skips t when a cluster cannot start here, unless CI is set (then it fails).
func Require(t testing.TB) {
	t.Helper()
	if err := Available(); err != nil {
		testenv.Unavailable(t, "no real-cluster lab: %v", err)
	}
}

// Options size a cluster; the zero value gives one node.
type Options struct {
	Nodes int // kubelet nodes (default 1, at most 200)
	// NodeMonitorGracePeriod is how long kube-controller-manager's node lifecycle
	// controller waits for a silent node before marking it NotReady (default 16 s, a
	// lab value: Kubernetes' default is 50 s). The kubelets renew their leases every
	// 2.5 s (nodeLeaseDurationSeconds 10).
	NodeMonitorGracePeriod time.Duration
	// ReadyTimeout bounds the wait for the control plane and for every node to be
	// Ready (default 3 min).
	ReadyTimeout time.Duration
	// Images are OCI archives (e.g. Portico's image) every node imports besides the
	// lab's pause and echo images.
	Images []string
}

// Timings are how long the steps of Start took, from its call.
type Timings struct {
	ControlPlane time.Duration // API server ready, controllers and scheduler started
	NodesReady   time.Duration // every node Ready
}

// Cluster is one running cluster. Close tears it down.
type Cluster struct {
	Prefix string // every namespace, link and cgroup name starts with it
	Dir    string // the run's files: certificates, logs, node state (removed by Close)
	Net    *netlab.Lab
	// Config reaches the API server as a system:masters user from this process: it
	// dials from inside the switch namespace.
	Config *rest.Config
	Kube   kubernetes.Interface
	// Kubeconfig has the same credentials, with the server on the bridge: use it
	// from inside a namespace of the lab (ip netns exec <Net.Switch> kubectl …).
	Kubeconfig string
	Nodes      []*Node
	Client     *netlab.Node // outside the cluster, on the bridge
	Images     []string     // the OCI archives every node imported
	Timings    Timings

	opts    Options
	pki     *pki
	tokens  map[string]string // node name -> bearer token
	mu      sync.Mutex
	control []*proc // etcd, kube-apiserver, kube-controller-manager, kube-scheduler
	closed  bool
}

// adminToken is the bearer token of the lab's administrator (system:masters). It is
// valid only inside the run's switch namespace.
const adminToken = "portico-cluster-admin"

// Start brings a cluster up and returns when every node is Ready. On failure it tears
// down what it made and returns the error with the tails of the logs.
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	t0 := time.Now()
	if err := Available(); err != nil {
		return nil, err
	}
	if opts, err = opts.withDefaults(); err != nil {
		return nil, err
	}
	c = &Cluster{opts: opts, tokens: map[string]string{}}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w\n%s", err, c.tails())
			_ = c.Close()
		}
	}()
	if err := c.makeBridge(); err != nil {
		return c, err
	}
	images := c.buildImages()
	if err := c.startControlPlane(ctx); err != nil {
		<-images
		return c, err
	}
	c.Timings.ControlPlane = time.Since(t0)
	if err := <-images; err != nil {
		return c, err
	}
	if err := c.addNodes(); err != nil {
		return c, err
	}
	if err := c.addClient(); err != nil {
		return c, err
	}
	if err := c.routePods(); err != nil {
		return c, err
	}
	if err := c.startNodes(ctx); err != nil {
		return c, err
	}
	if err := c.waitNodesReady(ctx, t0.Add(opts.ReadyTimeout)); err != nil {
		return c, err
	}
	c.Timings.NodesReady = time.Since(t0)
	return c, nil
}

// withDefaults checks o and fills in its defaults.
func (o Options) withDefaults() (Options, error) {
	if o.Nodes == 0 {
		o.Nodes = 1
	}
	if o.Nodes < 0 || o.Nodes > 200 {
		return o, fmt.Errorf("%d nodes: want 1-200", o.Nodes)
	}
	if o.NodeMonitorGracePeriod == 0 {
		o.NodeMonitorGracePeriod = 16 * time.Second
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 3 * time.Minute
	}
	for _, img := range o.Images {
		if _, err := os.Stat(img); err != nil {
			return o, fmt.Errorf("image archive: %w", err)
		}
	}
	return o, nil
}

// makeBridge makes the run's folder and its namespaces: the switch with the
// bridge, which holds APIAddr.
func (c *Cluster) makeBridge() (err error) {
	if c.Dir, err = os.MkdirTemp("", "portico-cluster-"); err != nil {
		return fmt.Errorf("create the run's folder: %w", err)
	}
	if c.Net, err = netlab.New("pc"); err != nil {
		return fmt.Errorf("create the bridge: %w", err)
	}
	c.Prefix = c.Net.Prefix
	return netlab.IP("-n", c.Net.Switch, "addr", "add", netip.PrefixFrom(APIAddr, bridgeBits).String(), "dev", "br0")
}

// buildImages builds the lab's images (c.Images, with Options.Images) while the
// control plane starts; the channel gets the result.
func (c *Cluster) buildImages() <-chan error {
	images := make(chan error, 1)
	go func() {
		dir := filepath.Join(c.Dir, "images")
		err := os.MkdirAll(dir, 0o755)
		if err == nil {
			c.Images, err = BuildImages(dir)
			c.Images = append(c.Images, c.opts.Images...)
		}
		images <- err
	}()
	return images
}

// addNodes makes the nodes' namespaces on the bridge.
func (c *Cluster) addNodes() error {
	for i := 1; i <= c.opts.Nodes; i++ {
		n, err := c.addNode(i)
		if err != nil {
			return err
		}
		c.Nodes = append(c.Nodes, n)
		// An edge node's XDP_TX frames leave its veth only if the peer runs XDP too.
		if err := netlab.Do(c.Net.Switch, func() error {
			l, err := xdpaux.AttachPass(n.Net.Port)
			if err == nil {
				c.Net.OnClose(l.Close)
			}
			return err
		}); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	return nil
}

// addClient makes the client's namespace on the bridge, outside the cluster.
func (c *Cluster) addClient() (err error) {
	if c.Client, err = c.Net.AddNode("cl", netip.PrefixFrom(ClientAddr, bridgeBits), mac(0xfe)); err != nil {
		return fmt.Errorf("add the client namespace: %w", err)
	}
	return addAddr6(c.Client.NS, ClientAddr6)
}

// startNodes starts every node's containerd and kubelet, all at once.
func (c *Cluster) startNodes(ctx context.Context) error {
	var err error
	errs := make(chan error, len(c.Nodes))
	for _, n := range c.Nodes {
		go func() { errs <- c.startNode(ctx, n) }()
	}
	for range c.Nodes {
		if e := <-errs; e != nil {
			err = errors.Join(err, e)
		}
	}
	return err
}

// waitNodesReady polls until every node reports Ready.
func (c *Cluster) waitNodesReady(ctx context.Context, deadline time.Time) error {
	for {
		var notReady []string
		list, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err == nil {
			ready := map[string]bool{}
			for _, n := range list.Items {
				ready[n.Name] = NodeReady(&n)
			}
			for _, n := range c.Nodes {
				if !ready[n.Name] {
					notReady = append(notReady, n.Name)
				}
			}
			if len(notReady) == 0 {
				return nil
			}
		}
		for _, p := range c.control {
			if !p.alive() {
				return fmt.Errorf("%s exited: %s", p.name, p.cmd.ProcessState)
			}
		}
		for _, n := range c.Nodes {
			for _, p := range []*proc{n.containerd, n.kubelet} {
				if !p.alive() {
					return fmt.Errorf("%s exited: %s", p.name, p.cmd.ProcessState)
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nodes %s not Ready after %s (last error: %v)", strings.Join(notReady, ", "), c.opts.ReadyTimeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// NodeReady reports whether n's Ready condition is True.
func NodeReady(n *corev1.Node) bool {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Close tears the cluster down: each node's kubelet, containerd, shims and containers
// by PID (everything in the node's cgroup), then the control plane, the namespaces and
// the run's folder. It is safe to call more than once.
func (c *Cluster) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for _, n := range c.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.stop(); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for i := len(c.control) - 1; i >= 0; i-- {
		c.control[i].kill()
	}
	if c.Net != nil {
		if err := c.Net.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Dir != "" && os.Getenv("PORTICO_CLUSTER_KEEP_DIR") == "" {
		if err := os.RemoveAll(c.Dir); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", c.Dir, err))
		}
	}
	return errors.Join(errs...)
}

// tails returns the last lines of every log of the run, for failures.
func (c *Cluster) tails() string {
	if c.Dir == "" {
		return ""
	}
	var b strings.Builder
	logs, _ := filepath.Glob(filepath.Join(c.Dir, "*.log"))
	more, _ := filepath.Glob(filepath.Join(c.Dir, "*", "*.log"))
	for _, p := range append(logs, more...) {
		data, err := os.ReadFile(p)
		if err != nil || len(data) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) > 12 {
			lines = lines[len(lines)-12:]
		}
		rel, _ := filepath.Rel(c.Dir, p)
		fmt.Fprintf(&b, "--- %s (tail)\n%s\n", rel, strings.Join(lines, "\n"))
	}
	return b.String()
}
