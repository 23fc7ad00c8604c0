package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/internal/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

// root is the repository, seen from this package's folder.
const root = "../.."

// TestPortico installs Portico on a real cluster the way a user does and runs the
// failures a real cluster has, with clients running throughout: four kubelet nodes,
// three of them edges (labelled and tainted), Portico's image built by the project's
// own build and imported into every node, the chart installed with helm, backends
// as Deployments, Ingresses applied with kubectl.
func TestPortico(t *testing.T) {
	Require(t)
	if _, err := HelmBinary(root); err != nil {
		testenv.Unavailable(t, "%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	t0 := time.Now()
	archive, err := BuildPorticoImage(ctx, root, filepath.Join(t.TempDir(), "image"), "e2e-1")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("image built: %.1f s", time.Since(t0).Seconds())
	c, err := Start(ctx, Options{Nodes: 4, Images: []string{archive}})
	if err != nil {
		t.Fatalf("start the cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	t.Logf("4 nodes Ready: %.1f s", c.Timings.NodesReady.Seconds())
	edges, worker := c.Nodes[:3], c.Nodes[3]
	t1 := time.Now()
	p, err := c.InstallPortico(ctx, PorticoOptions{Root: root, Tag: "e2e-1", Edges: edges})
	if err != nil {
		t.Fatalf("install Portico: %v\n%s", err, c.tails())
	}
	t.Logf("Portico installed, every agent ready and the VIP answering: %.1f s", time.Since(t1).Seconds())
	owner, err := p.Owner(GroupVIP)
	if err != nil {
		t.Fatal(err)
	}
	// The edge that gets drained also runs backends, so the drain evicts pods
	// through the real EndpointSlice controller too. The owner dies last.
	drained := edges[0]
	if drained == owner {
		drained = edges[1]
	}
	t.Logf("VIP owner %s; backends on %s and %s", owner.Name, drained.Name, worker.Name)
	certs, err := c.DeployExample(ctx, []*Node{drained, worker})
	if err != nil {
		t.Fatal(err)
	}
	waitServed(t, p, "web.example", "/", edges)
	waitServed(t, p, "web.example", "/api/items", edges)

	t.Run("Routing", func(t *testing.T) { testRouting(t, ctx, p, certs, edges) })
	t.Run("Drain", func(t *testing.T) { testDrain(t, ctx, p, drained) })
	t.Run("RollingUpdate", func(t *testing.T) { testRollingUpdate(t, ctx, p) })
	t.Run("IngressClaim", func(t *testing.T) { testIngressClaim(t, ctx, p, worker) })
	t.Run("NodeDies", func(t *testing.T) { testNodeDies(t, ctx, p) })
}

// waitServed waits until 30 new connections in a row to host+path are answered
// and reach every edge in edges.
func waitServed(t *testing.T, p *Portico, host, path string, edges []*Node) {
	t.Helper()
	if err := p.ServedEverywhere(context.Background(), host, path, edges, time.Minute); err != nil {
		t.Fatalf("%s%s not served through every edge: %v", host, path, err)
	}
}

func testRouting(t *testing.T, ctx context.Context, p *Portico, certs map[string][]byte, edges []*Node) {
	hc := p.HTTPClient(false, 2*time.Second)
	perEdge := map[string]int{}
	for i := range 90 {
		path := "/"
		if i%3 == 0 {
			path = "/api/items"
		}
		r, err := p.Get(ctx, hc, "web.example", path)
		if err != nil {
			t.Fatalf("GET web.example%s: %v", path, err)
		}
		wantPod := "web-"
		if path != "/" {
			wantPod = "api-"
		}
		if !strings.HasPrefix(r.Pod, wantPod) || r.Path != path || r.Host != "web.example" {
			t.Errorf("GET web.example%s answered by %+v, want a %s pod", path, r, wantPod)
		}
		if r.Client != ClientAddr.String() {
			t.Errorf("the backend saw client %q, want the client's own %s", r.Client, ClientAddr)
		}
		perEdge[p.EdgeOf(r)]++
	}
	t.Logf("90 new connections per edge: %v", perEdge)
	for _, e := range edges {
		if perEdge[e.Name] < 10 {
			t.Errorf("edge %s served %d of 90 new connections, want a share (>= 10)", e.Name, perEdge[e.Name])
		}
	}
	if r, err := p.Get(ctx, hc, "unknown.example", "/"); err == nil {
		t.Errorf("a host no Ingress serves was answered: %+v", r)
	}

	// TLS by SNI: each host gets its own certificate (verified against it alone).
	// The TLS Ingress may reach the agents in a later configuration than web's.
	for host, wantPod := range map[string]string{"secure.example": "web-", "other.example": "api-"} {
		testenv.Eventually(t, 30*time.Second, func() string {
			r, names, err := p.GetTLS(ctx, host, certs[host])
			if err != nil || !strings.HasPrefix(r.Pod, wantPod) || r.Client != ClientAddr.String() || !slices.Equal(names, []string{host}) {
				return fmt.Sprintf("HTTPS %s: %+v, certificate for %v, %v; want a %s pod, client %s", host, r, names, err, wantPod, ClientAddr)
			}
			return ""
		})
	}
}

// slowAnswer is how long a request of the drain and rolling-update streams may
// take before it counts as failed: what a client with a short timeout tolerates,
// above a loaded machine's latency. A misrouted packet fails anyway (a reset, or
// a connection that is never made); the failover tests, which measure outages,
// use 500 ms.
const slowAnswer = 2 * time.Second

// heldConns opens n long-lived connections through the VIP to web.example.
func heldConns(t *testing.T, p *Portico, n int) traffic.KeepConns {
	t.Helper()
	held, err := p.OpenKeepConns(context.Background(), "web.example", n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(held.Close)
	return held
}

// failures logs and returns the stream's failed attempts (at or after from).
func failures(t *testing.T, atts []traffic.Attempt, from time.Time) traffic.Failures {
	t.Helper()
	f := traffic.FailuresAround(atts, from)
	t.Logf("new connections: %v", f)
	return f
}

// testDrain: kubectl drain of an edge node that also runs backends. Its web pods
// are evicted and turn terminating through the real EndpointSlice controller; its
// agent's replica drains (the node is cordoned): no new flows, its connections
// finish. Not one request fails. Uncordoned, it serves new flows again.
func testDrain(t *testing.T, ctx context.Context, p *Portico, node *Node) {
	held := heldConns(t, p, 60)
	onNode := 0
	for _, k := range held {
		if k.Edge == node.IP.String() {
			onNode++
		}
	}
	stream := p.StartStream(ctx, "web.example", traffic.StreamOptions{Every: 10 * time.Millisecond, Timeout: slowAnswer})
	time.Sleep(time.Second)
	start := time.Now()
	if _, err := p.C.Kubectl(ctx, nil, "drain", node.Name, "--ignore-daemonsets", "--timeout=90s"); err != nil {
		stream.Stop()
		t.Fatal(err)
	}
	t.Logf("kubectl drain %s: %.1f s", node.Name, time.Since(start).Seconds())
	// From when every edge's data plane holds the node's replica as draining, new
	// connections must avoid it.
	settled, err := p.WaitDraining(ctx, node, time.Minute)
	if err != nil {
		stream.Stop()
		t.Fatal(err)
	}
	t.Logf("every edge holds %s as draining %.1f s after the drain began", node.Name, settled.Sub(start).Seconds())
	time.Sleep(3 * time.Second)
	// Its held connections still work: it finishes what it has.
	total, kept, failed := p.checkHeld(held)
	if kept != total {
		t.Errorf("%d of %d long-lived connections kept working, want all; failed: %s", kept, total, strings.Join(failed, "; "))
		t.Logf("what the agents said:\n%s", p.AgentLogs(ctx, "portico-agent", "vrrp state", "liveness", "stalled", "data plane applied", "unhealthy", "healthy", "nginx"))
	}
	atts := stream.Stop()
	if f := failures(t, atts, start); f.Failed > 0 {
		t.Errorf("%d requests failed during the drain, want 0", f.Failed)
	}
	after := failures(t, atts, settled)
	t.Logf("%d held connections checked (%d through %s); new connections after the drain settled, per edge: %v", total, onNode, node.Name, after.PerEdge)
	if n := after.PerEdge[node.IP.String()]; n > 0 {
		t.Errorf("%d new connections went to the drained %s", n, node.Name)
	}
	slices0, err := p.C.Kube.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=web"})
	if err != nil {
		t.Fatal(err)
	}
	for _, es := range slices0.Items {
		for _, ep := range es.Endpoints {
			if ep.NodeName != nil && *ep.NodeName == node.Name {
				t.Errorf("web still has an endpoint on the drained node: %v", ep.Addresses)
			}
		}
	}

	if _, err := p.C.Kubectl(ctx, nil, "uncordon", node.Name); err != nil {
		t.Fatal(err)
	}
	waitServed(t, p, "web.example", "/", p.Edges)
}

// keepAliveLoad is a bounded load of requests on kept-alive connections, as browsers
// and API clients send them: workers with one HTTP client each (Go's, which retries
// an idempotent request when the server closed an idle connection first), until
// stopped, at most 3 minutes.
type keepAliveLoad struct {
	stop       chan struct{}
	wg         sync.WaitGroup
	ok, failed atomic.Int64
	mu         sync.Mutex
	errs       []string
}

func startKeepAliveLoad(ctx context.Context, p *Portico, workers int) *keepAliveLoad {
	ld := &keepAliveLoad{stop: make(chan struct{})}
	deadline := time.Now().Add(3 * time.Minute)
	for range workers {
		ld.wg.Add(1)
		go func() {
			defer ld.wg.Done()
			hc := p.HTTPClient(true, 3*time.Second)
			defer hc.CloseIdleConnections()
			for time.Now().Before(deadline) {
				select {
				case <-ld.stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				if _, err := p.Get(ctx, hc, "web.example", "/keepalive"); err != nil {
					ld.failed.Add(1)
					ld.mu.Lock()
					if len(ld.errs) < 10 {
						ld.errs = append(ld.errs, err.Error())
					}
					ld.mu.Unlock()
				} else {
					ld.ok.Add(1)
				}
			}
		}()
	}
	return ld
}

func (ld *keepAliveLoad) Stop() (ok, failed int64, errs []string) {
	close(ld.stop)
	ld.wg.Wait()
	return ld.ok.Load(), ld.failed.Load(), ld.errs
}

// testRollingUpdate: helm upgrade to a new image tag rolls the agents one node at a
// time under load. Not one request fails, and forwarding never stops: on every edge
// the pinned XDP link is the same before and after (the new agent replaced the
// program on it), so the old pod's exit never detached it.
func testRollingUpdate(t *testing.T, ctx context.Context, p *Portico) {
	before := map[string]XDPLink{}
	for _, n := range p.Edges {
		l, err := p.XDPLink(n)
		if err != nil {
			t.Fatal(err)
		}
		before[n.Name] = l
	}
	oldPods, err := p.Agents(ctx, "portico-agent")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.C.TagImage(ctx, p.Tag, "e2e-2"); err != nil {
		t.Fatal(err)
	}
	load := startKeepAliveLoad(ctx, p, 4)
	stream := p.StartStream(ctx, "web.example", traffic.StreamOptions{Every: 10 * time.Millisecond, Timeout: slowAnswer, For: 4 * time.Minute})
	time.Sleep(time.Second)
	start := time.Now()
	if err := p.Upgrade(ctx, 3*time.Minute, "image.tag=e2e-2"); err != nil {
		stream.Stop()
		load.Stop()
		t.Fatal(err)
	}
	p.Tag = "e2e-2"
	t.Logf("helm upgrade rolled %d agents out: %.1f s", len(p.Edges), time.Since(start).Seconds())
	time.Sleep(2 * time.Second)
	atts := stream.Stop()
	ok, failed, errs := load.Stop()
	t.Logf("kept-alive requests: %d answered, %d failed %v", ok, failed, errs)
	if f := failures(t, atts, start); f.Failed > 0 || failed > 0 {
		t.Errorf("during the rolling update %d new connections and %d kept-alive requests failed, want 0", f.Failed, failed)
		t.Logf("what xdp_lb counted:\n%s", p.AgentCommand(ctx, "portico-agent", "counters"))
		t.Logf("what the agents said:\n%s", p.AgentLogs(ctx, "portico-agent", "liveness", "unhealthy", "healthy", "data plane applied", "vrrp state"))
	}
	if ok == 0 {
		t.Error("no kept-alive request was answered")
	}
	newPods, err := p.Agents(ctx, "portico-agent")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range p.Edges {
		if newPods[n.Name] == "" || newPods[n.Name] == oldPods[n.Name] {
			t.Errorf("%s: agent pod %q, was %q: not replaced", n.Name, newPods[n.Name], oldPods[n.Name])
		}
		l, err := p.XDPLink(n)
		if err != nil {
			t.Fatal(err)
		}
		b := before[n.Name]
		if l.ID != b.ID {
			t.Errorf("%s: XDP link %d, was %d: the program was detached and attached again", n.Name, l.ID, b.ID)
		}
		if l.RingsID != b.RingsID || l.FlowsID != b.FlowsID {
			t.Errorf("%s: maps rings %d and flows %d, were %d and %d: the pinned maps did not survive", n.Name, l.RingsID, l.FlowsID, b.RingsID, b.FlowsID)
		}
		t.Logf("%s: XDP link %d and maps rings %d, flows %d kept; program %d -> %d", n.Name, l.ID, l.RingsID, l.FlowsID, b.ProgID, l.ProgID)
	}
	pods, err := p.C.Kube.CoreV1().Pods(PorticoNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=portico-agent"})
	if err != nil {
		t.Fatal(err)
	}
	for _, pod := range pods.Items {
		if img := pod.Spec.Containers[0].Image; img != PorticoRepository+":e2e-2" {
			t.Errorf("pod %s runs %s", pod.Name, img)
		}
	}
}

const claimYAML = `
apiVersion: portico.io/v1alpha1
kind: IngressClaim
metadata: {name: shop, namespace: portico-system}
spec:
  ingresses: [{name: shop}]
  template:
    nodeSelector: {portico.io/shop-edge: "true"}
    replicas: 1
  reclaimPolicy: Delete
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: shop, namespace: portico-system}
spec:
  rules:
  - host: shop.example
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: shopweb, port: {number: 80}}}}]}
`

// testIngressClaim: an IngressClaim whose node is a tainted edge node. The leader
// provisions the claim's agent DaemonSet from the chart's pod (tolerations
// included), the DaemonSet controller runs it on the tainted node, the group gets a
// VIP from the pool, and the claimed Ingress is served through it.
func testIngressClaim(t *testing.T, ctx context.Context, p *Portico, node *Node) {
	c := p.C
	if _, err := c.Kubectl(ctx, nil, "label", "node", node.Name, "portico.io/shop-edge=true"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Kubectl(ctx, nil, "taint", "node", node.Name, EdgeLabel+"=true:NoSchedule"); err != nil {
		t.Fatal(err)
	}
	// The claimed Ingress's backend lives in its namespace, on the same node.
	backend := strings.ReplaceAll(fmt.Sprintf(BackendYAML, "shopweb", 1, node.Name), "namespace: default", "namespace: "+PorticoNamespace)
	start := time.Now()
	if err := c.Apply(ctx, backend+"---"+claimYAML); err != nil {
		t.Fatal(err)
	}
	var vip netip.Addr
	testenv.Eventually(t, 2*time.Minute, func() string {
		ds, err := c.Kube.AppsV1().DaemonSets(PorticoNamespace).Get(ctx, "shop", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if st := ds.Status; st.DesiredNumberScheduled != 1 || st.NumberReady != 1 {
			return fmt.Sprintf("claim DaemonSet: desired %d, ready %d", st.DesiredNumberScheduled, st.NumberReady)
		}
		out, err := c.Kubectl(ctx, nil, "-n", PorticoNamespace, "get", "ingressclaim", "shop", "-o", "jsonpath={.status.phase} {.status.vips[0]}")
		if err != nil {
			return err.Error()
		}
		phase, addr, _ := strings.Cut(out, " ")
		if vip, err = netip.ParseAddr(addr); phase != "Bound" || err != nil {
			return "claim status: " + out
		}
		return ""
	})
	agents, err := p.Agents(ctx, "shop")
	if err != nil {
		t.Fatal(err)
	}
	if len(agents) != 1 || agents[node.Name] == "" {
		t.Fatalf("claim agents %v, want one on %s", agents, node.Name)
	}
	if !VIPPool.Contains(vip) {
		t.Errorf("claim VIP %s is not from the pool %s", vip, VIPPool)
	}
	if err := p.WaitVIP(ctx, vip, time.Minute); err != nil {
		t.Fatal(err)
	}
	shop := traffic.Target{NS: p.NS, VIP: vip}
	hc := shop.HTTPClient(false, 2*time.Second)
	testenv.Eventually(t, time.Minute, func() string {
		r, err := shop.Get(ctx, hc, "shop.example", "/cart")
		if err != nil {
			return err.Error()
		}
		if !strings.HasPrefix(r.Pod, "shopweb-") || p.EdgeOf(r) != node.Name || r.Client != ClientAddr.String() {
			return fmt.Sprintf("shop.example answered %+v, want a shopweb pod through %s", r, node.Name)
		}
		return ""
	})
	t.Logf("claim bound, its agent ready on tainted %s and shop.example served through VIP %s: %.1f s", node.Name, vip, time.Since(start).Seconds())
}

// testNodeDies: the VIP owner dies as a machine does (kubelet, containerd and the
// agent's processes killed, link cut). The VIP moves; held connections on the
// surviving replicas keep working; new connections stop failing within the VRRP
// takeover plus the liveness bound. Later the node controller marks the node
// NotReady and the EndpointSlice controller drops its agent: nothing changes for
// the clients.
func testNodeDies(t *testing.T, ctx context.Context, p *Portico) {
	// The owner dies within the ring transitions the earlier subtests left (a
	// drain, a rolling update, a claimed group's agent): the held connections
	// are opened in them, many in slots those changes moved, known only to the
	// owner that saw their SYNs; the new owner finds them along their chains
	// (bpf/README.md).
	if edges, err := p.InTransition(ctx); err != nil {
		t.Logf("ring transitions: %v", err)
	} else {
		t.Logf("edges in a ring transition as the owner dies: %d %v", len(edges), edges)
	}
	d, err := p.KillOwner(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s killed: %s", d.Node.Name, d)
	if d.New.Total < 1000 {
		t.Errorf("only %d new connections after the fault", d.New.Total)
	}
	if d.AfterBound.Failed > 0 {
		t.Errorf("%d new connections failed (could not connect, or were reset) after the bound (takeover %v + %v), some when Kubernetes caught up",
			d.AfterBound.Failed, d.Takeover.Round(time.Millisecond), LivenessBound)
	}
	if d.Unanswered > d.AfterBound.Total/20 {
		t.Errorf("%d of %d new connections after the bound connected but were not answered in 500 ms, want < 5%%", d.Unanswered, d.AfterBound.Total)
	}
	if d.Held < 30 || d.KeptAfterTakeover != d.Held || d.KeptAtEnd != d.Held {
		t.Errorf("of %d long-lived connections on surviving replicas, %d worked after the takeover and %d at the end; want all (and >= 30): %s",
			d.Held, d.KeptAfterTakeover, d.KeptAtEnd, strings.Join(d.HeldFailed, "; "))
	}
	if t.Failed() {
		t.Logf("what the agents said:\n%s", p.AgentLogs(ctx, "portico-agent", "vrrp state", "liveness", "stalled", "data plane applied", "unhealthy", "healthy", "new director"))
		t.Logf("what xdp_lb counted:\n%s", p.AgentCommand(ctx, "portico-agent", "counters"))
		t.Logf("what xdp_lb pinned:\n%s", p.AgentCommand(ctx, "portico-agent", "flows", "-n", "20"))
	}
}
