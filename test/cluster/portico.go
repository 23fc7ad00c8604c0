package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/portico-edge/portico/test/netlab"
	"github.com/portico-edge/portico/test/traffic"
)

// Portico on the cluster, installed as a user installs it: its image built by the
// project's own build (build/image, as make image) and imported into every node's
// containerd, the edge nodes labelled and tainted with kubectl, the chart installed
// with helm, everything else done by Kubernetes' own controllers.

var (
	// GroupVIP is the VIP InstallPortico gives the chart's group: a free address of
	// the bridge's subnet, so the client reaches it on-link and the VRRP owner
	// answers ARP for it.
	GroupVIP = netip.MustParseAddr("10.251.0.200")
	// VIPPool is the chart's vipPool in the lab, where IngressClaims' groups get
	// their VIPs.
	VIPPool = netip.MustParsePrefix("10.251.0.208/28")
)

const (
	// PorticoRepository is the image repository of the chart's defaults.
	PorticoRepository = "ghcr.io/portico-edge/portico"
	// PorticoNamespace is where InstallPortico installs the chart.
	PorticoNamespace = "portico-system"
	// EdgeLabel marks (value "true") and taints (NoSchedule) the edge nodes, as the
	// chart's nodeSelector and tolerations expect.
	EdgeLabel = "portico.io/edge"
	// pinPath is the agents' bpffs folder (dataplane.DefaultPinPath).
	pinPath = "/sys/fs/bpf/portico"
)

// BuildPorticoImage builds Portico's image from the repository at root as make image
// does (go run ./build/image), named PorticoRepository:tag, into dir, and returns
// the OCI archive every node can import (Options.Images); env is added to the
// build's environment.
func BuildPorticoImage(ctx context.Context, root, dir, tag string, env ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "run", "./build/image", "-name", PorticoRepository+":"+tag, "-out", dir)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the image: %w: %s", err, out)
	}
	return filepath.Join(dir, "portico.tar"), nil
}

// HelmBinary returns the helm that hack/helm.sh under root builds (make helm),
// or an error when it is not built.
func HelmBinary(root string) (string, error) {
	out, err := exec.Command(filepath.Join(root, "hack/helm.sh"), "path").Output()
	if err != nil {
		return "", fmt.Errorf("hack/helm.sh path: %w", err)
	}
	p := strings.TrimSpace(string(out))
	if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("helm is not built (make helm): %s", p)
	}
	return p, nil
}

// PorticoOptions say how to install Portico.
type PorticoOptions struct {
	Root  string  // the repository: its chart and hack/helm.sh
	Chart string  // the chart to install, if not Root's (an earlier release's)
	Tag   string  // the image tag (PorticoRepository:Tag), imported on every node
	Edges []*Node // the edge nodes: labelled and tainted EdgeLabel
	Set   []string
	// Timeout bounds the wait for every agent to be ready and the VIP to answer
	// (default 3 min).
	Timeout time.Duration
}

// Portico is Portico installed on a cluster. Its embedded Target sends the client's
// traffic to GroupVIP.
type Portico struct {
	traffic.Target
	C     *Cluster
	Edges []*Node
	Tag   string // the image tag the agents run
	// Resets, once started, records every TCP reset on the bridge (Diagnose).
	Resets *ResetCapture
	// Traffic, when set, captures every frame of the VIP's HTTP traffic on
	// the bridge: a failed new connection's frames tell which director and
	// which replica each packet reached (by MAC), and when.
	Traffic *netlab.Capture
	root    string
	helm    string
}

// InstallPortico labels and taints the edge nodes and installs the chart with helm,
// as the README's quick start says, with the lab's values: the nodes' NIC
// eth0, GroupVIP and VIPPool, the image imported on the nodes (never pulled), and the
// API server's address (the in-cluster Service address
// is kube-proxy's, which an edge should not need to reach its API server). It
// returns when every agent and the controller are ready and the VIP answers.
func (c *Cluster) InstallPortico(ctx context.Context, o PorticoOptions) (*Portico, error) {
	helm, err := HelmBinary(o.Root)
	if err != nil {
		return nil, err
	}
	if o.Timeout == 0 {
		o.Timeout = 3 * time.Minute
	}
	p := &Portico{Target: traffic.Target{NS: c.Client.NS, VIP: GroupVIP}, C: c, Edges: o.Edges, Tag: o.Tag, root: o.Root, helm: helm}
	for _, n := range o.Edges {
		if _, err := c.Kubectl(ctx, nil, "label", "node", n.Name, EdgeLabel+"=true"); err != nil {
			return nil, err
		}
		if _, err := c.Kubectl(ctx, nil, "taint", "node", n.Name, EdgeLabel+"=true:NoSchedule"); err != nil {
			return nil, err
		}
	}
	chart := o.Chart
	if chart == "" {
		chart = filepath.Join(o.Root, "deploy/helm/portico")
	}
	args := []string{"install", "portico", chart, "-n", PorticoNamespace, "--create-namespace",
		"--set", "iface=eth0", "--set", "group.vip=" + GroupVIP.String() + `\,` + GroupVIP6.String(), "--set", "vipPool=" + VIPPool.String(),
		"--set", fmt.Sprintf("apiServer=https://%s:%d", APIAddr, apiPort),
		"--set", "image.repository=" + PorticoRepository, "--set", "image.tag=" + o.Tag, "--set", "image.pullPolicy=Never"}
	for _, s := range o.Set {
		args = append(args, "--set", s)
	}
	if _, err := p.Helm(ctx, args...); err != nil {
		return nil, err
	}
	if err := p.WaitRollout(ctx, "portico-agent", o.Timeout); err != nil {
		return nil, err
	}
	// The controller Deployment writes the statuses and allocations the tests read.
	if _, err := c.Kubectl(ctx, nil, "-n", PorticoNamespace, "rollout", "status", "deployment/portico-controller",
		"--timeout="+o.Timeout.String()); err != nil {
		return nil, err
	}
	return p, p.WaitVIP(ctx, GroupVIP, o.Timeout)
}

// Helm runs helm against the cluster, from inside the switch namespace, and returns
// its standard output; a failure carries its standard error.
func (p *Portico) Helm(ctx context.Context, args ...string) (string, error) {
	argv := append([]string{"nsenter", "--net=/run/netns/" + p.C.Net.Switch, "--", p.helm, "--kubeconfig", p.C.Kubeconfig}, args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(p.C.Dir, "helm", "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(p.C.Dir, "helm", "config"), "HELM_DATA_HOME="+filepath.Join(p.C.Dir, "helm", "data"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Upgrade runs helm upgrade on the release with its values and set, as a user
// upgrading Portico does (e.g. image.tag=<new>), and waits for the rollout.
func (p *Portico) Upgrade(ctx context.Context, timeout time.Duration, set ...string) error {
	args := []string{"upgrade", "portico", filepath.Join(p.root, "deploy/helm/portico"), "-n", PorticoNamespace, "--reuse-values"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	if _, err := p.Helm(ctx, args...); err != nil {
		return err
	}
	return p.WaitRollout(ctx, "portico-agent", timeout)
}

// WaitRollout waits until DaemonSet name in PorticoNamespace has every pod updated,
// available and ready (kubectl rollout status).
func (p *Portico) WaitRollout(ctx context.Context, name string, timeout time.Duration) error {
	_, err := p.C.Kubectl(ctx, nil, "-n", PorticoNamespace, "rollout", "status", "daemonset/"+name, "--timeout="+timeout.String())
	return err
}

// TagImage gives the image PorticoRepository:from a second name, PorticoRepository:to,
// in every running node's containerd: a "new version" to roll out without building
// one.
func (c *Cluster) TagImage(ctx context.Context, from, to string) error {
	var errs []error
	for _, n := range c.Nodes {
		if n.kubelet == nil || !n.kubelet.alive() {
			continue
		}
		out, err := exec.CommandContext(ctx, "ctr", "-a", n.socket(), "-n", "k8s.io", "images", "tag", "--force",
			PorticoRepository+":"+from, PorticoRepository+":"+to).CombinedOutput()
		if err != nil {
			errs = append(errs, fmt.Errorf("node %s: ctr images tag: %w: %s", n.Name, err, out))
		}
	}
	return errors.Join(errs...)
}

// Apply applies YAML with kubectl apply -f -.
func (c *Cluster) Apply(ctx context.Context, yaml string) error {
	_, err := c.Kubectl(ctx, strings.NewReader(yaml), "apply", "-f", "-")
	return err
}
