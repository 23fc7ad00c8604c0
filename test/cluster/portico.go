package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/agent/lease"

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
// the OCI archive every node can import (Options.Images).
func BuildPorticoImage(ctx context.Context, root, dir, tag string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "run", "./build/image", "-name", PorticoRepository+":"+tag, "-out", dir)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the image: %w: %s", err, out)
	}
	return filepath.Join(dir, "portico.tar"), nil
}

// HelmBinary returns the helm that test/tools/helm.sh under root builds (make helm),
// or an error when it is not built.
func HelmBinary(root string) (string, error) {
	out, err := exec.Command(filepath.Join(root, "test/tools/helm.sh"), "path").Output()
	if err != nil {
		return "", fmt.Errorf("test/tools/helm.sh path: %w", err)
	}
	p := strings.TrimSpace(string(out))
	if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("helm is not built (make helm): %s", p)
	}
	return p, nil
}

// PorticoOptions say how to install Portico.
type PorticoOptions struct {
	Root  string  // the repository: its chart and test/tools/helm.sh
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
// as README's "Installing in a cluster" says, with the lab's values: the nodes' NIC
// eth0, GroupVIP and VIPPool, the image imported on the nodes (never pulled), and the
// API server's address (the lab runs no kube-proxy, so the in-cluster Service address
// goes nowhere). It returns when every agent and the controller are ready and the
// VIP answers.
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
	args := []string{"install", "portico", filepath.Join(o.Root, "deploy/helm/portico"), "-n", PorticoNamespace, "--create-namespace",
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

// WaitVIP waits until the VIP takes a TCP connection on port 80 (nginx's HTTP,
// the chart's default) from the client: some edge node owns it and serves. (Not
// the liveness port: a VIP answers only on the ports it serves.)
func (p *Portico) WaitVIP(ctx context.Context, vip netip.Addr, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		c, err := p.Dial(dctx, "tcp", netip.AddrPortFrom(vip, 80).String())
		cancel()
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("VIP %s does not answer after %s: %w", vip, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Owner returns the node whose MAC address the client has for the VIP: the one its
// traffic goes to (the VRRP owner's, from its gratuitous ARP or the client's
// question).
func (p *Portico) Owner(vip netip.Addr) (*Node, error) {
	out, err := exec.Command("ip", "-n", p.NS, "-j", "neigh", "show", vip.String()).Output()
	if err != nil {
		return nil, fmt.Errorf("ip neigh in %s: %w", p.NS, err)
	}
	var neigh []struct {
		LLAddr string   `json:"lladdr"`
		State  []string `json:"state"`
	}
	if err := json.Unmarshal(out, &neigh); err != nil {
		return nil, fmt.Errorf("ip neigh: %w", err)
	}
	for _, e := range neigh {
		for _, n := range p.C.Nodes {
			if strings.EqualFold(e.LLAddr, n.Net.MAC.String()) {
				return n, nil
			}
		}
	}
	return nil, fmt.Errorf("the client has no MAC of a node for %s: %s", vip, out)
}

// EdgeOf returns the node whose nginx sent a backend the request a reply answers:
// the reply's edge address is that node's (or, for a backend pod on the same node,
// the node's pod gateway).
func (p *Portico) EdgeOf(r traffic.Reply) string {
	ip, err := netip.ParseAddr(r.Edge)
	if err != nil {
		return ""
	}
	for i, n := range p.C.Nodes {
		if ip == n.IP || ip == PodCIDR(i+1).Addr().Next() {
			return n.Name
		}
	}
	return ""
}

// XDPLink is the pinned BPF link by which an edge node's xdp_lb is attached, the
// program it runs, and the pinned maps every program of it uses (rings, flows).
type XDPLink struct{ ID, ProgID, RingsID, FlowsID int }

// XDPLink reads the link pinned in node n's bpffs (bpftool in the node's
// namespaces, where the agent pod's hostPath sees it).
func (p *Portico) XDPLink(n *Node) (XDPLink, error) {
	out, err := n.Exec("bpftool", "-j", "link", "show", "pinned", pinPath+"/link")
	if err != nil {
		return XDPLink{}, err
	}
	var l struct {
		ID     int `json:"id"`
		ProgID int `json:"prog_id"`
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		return XDPLink{}, fmt.Errorf("bpftool link show on %s: %w: %s", n.Name, err, out)
	}
	x := XDPLink{ID: l.ID, ProgID: l.ProgID}
	for m, id := range map[string]*int{"rings": &x.RingsID, "flows": &x.FlowsID} {
		out, err := n.Exec("bpftool", "-j", "map", "show", "pinned", pinPath+"/"+m)
		if err != nil {
			return x, err
		}
		var v struct {
			ID int `json:"id"`
		}
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			return x, fmt.Errorf("bpftool map show on %s: %w: %s", n.Name, err, out)
		}
		*id = v.ID
	}
	return x, nil
}

// Agents returns the name of the agent pod on each node, for DaemonSet name.
func (p *Portico) Agents(ctx context.Context, name string) (map[string]string, error) {
	pods, err := p.C.Kube.CoreV1().Pods(PorticoNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, pod := range pods.Items {
		if ownedBy(&pod, name) && pod.DeletionTimestamp == nil {
			out[pod.Spec.NodeName] = pod.Name
		}
	}
	return out, nil
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

// get returns the body of GET url, which must answer 200.
func get(c *http.Client, url string) (string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	return string(body), nil
}

// LivenessBound is what the agents' liveness defaults promise: a replica that can no
// longer serve gets no new flows 300 ms after the fault.
const LivenessBound = 300 * time.Millisecond

// NodeDeath is what the clients saw when the VIP owner died (KillOwner).
type NodeDeath struct {
	Node *Node
	// Takeover is how long after the fault the client sent to another node (its
	// ARP entry for the VIP changed with the new owner's gratuitous ARP).
	Takeover time.Duration
	// CaughtUp is how long after the fault Kubernetes saw the death: the node
	// NotReady and its agent's endpoint not ready (0 when not waited for).
	CaughtUp time.Duration
	// AfterTakeover is what a request on every held connection on a surviving
	// replica found right after the takeover, each with HeldAnswer to answer;
	// AtEnd, after Kubernetes caught up.
	AfterTakeover, AtEnd HeldCheck
	// New counts the new connections (one every 5 ms, 500 ms to answer) from the
	// fault on; AfterBound those from Takeover + LivenessBound after it on, less
	// the ones that connected and were answered late (Unanswered: slowness under
	// load, not a lost flow: a flow sent to a replica without it is reset, and
	// one sent to the dead node never connects).
	New, AfterBound traffic.Failures
	// Unanswered is how many after the bound connected but got no answer in time.
	Unanswered int
}

// HeldAnswer is how soon after the takeover every held connection on a surviving
// replica must answer.
const HeldAnswer = time.Second

func (d NodeDeath) String() string {
	s := fmt.Sprintf("takeover %v; long-lived connections on surviving replicas: %v within %v of the takeover, %v at the end; %v",
		d.Takeover.Round(time.Millisecond), d.AfterTakeover, HeldAnswer, d.AtEnd, d.New)
	if d.CaughtUp > 0 {
		s += fmt.Sprintf("; Kubernetes saw it %.1f s after the fault, and from %v after it %v (and %d answered late)",
			d.CaughtUp.Seconds(), (d.Takeover + LivenessBound).Round(time.Millisecond), d.AfterBound, d.Unanswered)
	}
	return s
}

// KillOwner kills the VIP owner as a machine dies (Cluster.Kill: kubelet and
// containerd killed, link cut; its pods' processes never get a signal) with clients
// running: the held connections and a stream of new ones. It waits for the client
// to send to a new owner, then asks every held connection on a surviving replica
// at once (HeldAnswer each), and, with waitCaughtUp, waits for Kubernetes to mark
// the node NotReady and its agent's endpoint not ready, then 5 s more, and asks
// them again. The dead node leaves p.Edges.
func (p *Portico) KillOwner(ctx context.Context, held Held, waitCaughtUp bool) (NodeDeath, error) {
	owner, err := p.Owner(GroupVIP)
	if err != nil {
		return NodeDeath{}, err
	}
	d := NodeDeath{Node: owner}
	stream := p.StartStream(ctx, "web.example", traffic.StreamOptions{Every: 5 * time.Millisecond, For: 3 * time.Minute})
	stopped := false
	defer func() {
		if !stopped {
			stream.Stop()
		}
	}()
	time.Sleep(time.Second)
	fault := time.Now()
	if err := p.C.Kill(owner); err != nil {
		return d, err
	}
	p.Edges = slices.DeleteFunc(slices.Clone(p.Edges), func(n *Node) bool { return n == owner })
	if err := until(ctx, fault.Add(5*time.Second), func() error {
		n, err := p.Owner(GroupVIP)
		if err == nil && n == owner {
			err = fmt.Errorf("the client still sends to %s", owner.Name)
		}
		return err
	}); err != nil {
		return d, err
	}
	d.Takeover = time.Since(fault)
	d.AfterTakeover = p.Check(ctx, held, HeldAnswer, owner)
	if waitCaughtUp {
		if err := until(ctx, fault.Add(time.Minute), func() error { return p.deadToKubernetes(ctx, owner) }); err != nil {
			return d, err
		}
		d.CaughtUp = time.Since(fault)
		time.Sleep(5 * time.Second)
	}
	atts := stream.Stop()
	stopped = true
	d.New = traffic.FailuresAround(atts, fault)
	after := traffic.FailuresAround(atts, fault.Add(d.Takeover+LivenessBound))
	d.AfterBound = traffic.FailuresAround(traffic.Hard(atts), fault.Add(d.Takeover+LivenessBound))
	d.Unanswered = after.Unanswered
	d.AtEnd = p.Check(ctx, held, 3*time.Second, owner)
	return d, nil
}

// deadToKubernetes returns nil once node n is NotReady and its agent is not a ready
// endpoint of the group.
func (p *Portico) deadToKubernetes(ctx context.Context, n *Node) error {
	node, err := p.C.Kube.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if NodeReady(node) {
		return fmt.Errorf("%s is still Ready", n.Name)
	}
	list, err := p.C.Kube.DiscoveryV1().EndpointSlices(PorticoNamespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=edge"})
	if err != nil {
		return err
	}
	for _, es := range list.Items {
		for _, ep := range es.Endpoints {
			if ep.NodeName != nil && *ep.NodeName == n.Name && (ep.Conditions.Ready == nil || *ep.Conditions.Ready) {
				return fmt.Errorf("the agent on %s is still a ready endpoint", n.Name)
			}
		}
	}
	return nil
}

// until polls cond every 20 ms until it returns nil, ctx ends or deadline passes
// (then it returns cond's last error).
func until(ctx context.Context, deadline time.Time, cond func() error) error {
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// AgentLogs returns the lines of every running agent's log (DaemonSet name) that
// match one of the words, for a failing test to show what the agents saw.
func (p *Portico) AgentLogs(ctx context.Context, name string, words ...string) string {
	agents, err := p.Agents(ctx, name)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for node, pod := range agents {
		out, err := p.C.Kubectl(ctx, nil, "-n", PorticoNamespace, "logs", pod, "--tail=400")
		if err != nil {
			fmt.Fprintf(&b, "--- %s (%s): %v\n", pod, node, err)
			continue
		}
		fmt.Fprintf(&b, "--- %s (%s)\n", pod, node)
		for _, l := range strings.Split(out, "\n") {
			if slices.ContainsFunc(words, func(w string) bool { return strings.Contains(l, w) }) {
				b.WriteString(l + "\n")
			}
		}
	}
	return b.String()
}

// AgentCommand runs `portico args...` in every agent pod it can reach and returns
// the outputs, for a failure's report (what xdp_lb counted, which flows it pinned).
func (p *Portico) AgentCommand(ctx context.Context, name string, args ...string) string {
	agents, err := p.Agents(ctx, name)
	if err != nil {
		return err.Error()
	}
	nodes := slices.Sorted(maps.Keys(agents))
	var b strings.Builder
	for _, node := range nodes {
		pod := agents[node]
		out, err := p.C.Kubectl(ctx, nil, append([]string{"-n", PorticoNamespace, "exec", pod, "-c", "agent", "--", "portico"}, args...)...)
		if err != nil {
			fmt.Fprintf(&b, "--- %s (%s): portico %s: %v\n", pod, node, strings.Join(args, " "), err)
			continue
		}
		fmt.Fprintf(&b, "--- %s (%s): portico %s\n%s\n", pod, node, strings.Join(args, " "), out)
	}
	return b.String()
}

// WaitDraining waits until every edge's agent reports (its status Lease, what
// portico status reads) that its data plane holds node n's replica as draining for
// the group's VIP, and returns when it saw that: from then on no director gives n
// new flows.
func (p *Portico) WaitDraining(ctx context.Context, n *Node, timeout time.Duration) (time.Time, error) {
	var seen time.Time
	err := until(ctx, time.Now().Add(timeout), func() error {
		states, stale, err := lease.ReadStates(ctx, p.C.Kube, PorticoNamespace)
		if err != nil {
			return err
		}
		reported := 0
		for _, st := range states {
			if stale[st.Node] || !slices.ContainsFunc(p.Edges, func(e *Node) bool { return e.Name == st.Node }) {
				continue
			}
			reported++
			draining := false
			for _, v := range st.VIPs {
				for _, r := range v.Replicas {
					if v.VIP == GroupVIP.String() && r.Addr == n.IP.String() && r.State == "draining" {
						draining = true
					}
				}
			}
			if !draining {
				return fmt.Errorf("%s does not hold %s as draining yet", st.Node, n.Name)
			}
		}
		if reported != len(p.Edges) {
			return fmt.Errorf("%d of %d edges reported", reported, len(p.Edges))
		}
		seen = time.Now()
		return nil
	})
	return seen, err
}

// InTransition returns the edges that report a ring transition of the group's
// VIP under way, with how long it lasts still.
func (p *Portico) InTransition(ctx context.Context) ([]string, error) {
	states, stale, err := lease.ReadStates(ctx, p.C.Kube, PorticoNamespace)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, st := range states {
		if stale[st.Node] {
			continue
		}
		for _, v := range st.VIPs {
			if v.VIP == GroupVIP.String() && v.TransitionSeconds > 0 {
				out = append(out, fmt.Sprintf("%s (%.0f s more)", st.Node, v.TransitionSeconds))
			}
		}
	}
	return out, nil
}

// ServedEverywhere returns nil once 30 new connections in a row to host+path are
// answered and reach every edge of edges, or the last reason they did not.
func (p *Portico) ServedEverywhere(ctx context.Context, host, path string, edges []*Node, timeout time.Duration) error {
	hc := p.HTTPClient(false, 2*time.Second)
	return until(ctx, time.Now().Add(timeout), func() error {
		seen := map[string]bool{}
		for range 30 {
			r, err := p.Get(ctx, hc, host, path)
			if err != nil {
				return err
			}
			seen[p.EdgeOf(r)] = true
		}
		for _, e := range edges {
			if !seen[e.Name] {
				return fmt.Errorf("no answer through %s in 30 (%v)", e.Name, seen)
			}
		}
		return nil
	})
}

// GetTLS requests https://VIP/ for host (its SNI and Host), trusting certPEM
// alone, and returns the backend's reply and the certificate's names.
func (p *Portico) GetTLS(ctx context.Context, host string, certPEM []byte) (traffic.Reply, []string, error) {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	hc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: p.Dial, DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{ServerName: host, RootCAs: pool}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+GroupVIP.String()+"/", nil)
	if err != nil {
		return traffic.Reply{}, nil, err
	}
	req.Host = host
	resp, err := hc.Do(req)
	if err != nil {
		return traffic.Reply{}, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 512))
	if err != nil {
		return traffic.Reply{}, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return traffic.Reply{}, nil, fmt.Errorf("https://%s/: %s", host, resp.Status)
	}
	r, err := traffic.ParseReply(string(body))
	return r, resp.TLS.PeerCertificates[0].DNSNames, err
}
