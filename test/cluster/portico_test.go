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

	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

// root is the repository, seen from this package's folder.
const root = "../.."

// TestPortico installs Portico on a real cluster the way a user does and runs the
// failures a real cluster has, alone and overlapping, with clients running
// throughout: five kubelet nodes, four of them edges (labelled and tainted),
// Portico's image built by the project's own build and imported into every node,
// the chart installed with helm, backends as Deployments, Ingresses applied with
// kubectl. The group has an IPv4 and an IPv6 VIP, and an L4 Service (hold) two more:
// the held connections go through all four, some of them idle for 90 s before
// their event.
//
// The sequence: the VIP owner dies within the transition the install left; an
// edge drains; an IngressClaim; a rolling update with another edge draining
// during it (every connection opened during it answers); within that
// transition a liveness false positive on a healthy replica, and right after it
// the new owner dies.
func TestPortico(t *testing.T) {
	Require(t)
	if _, err := HelmBinary(root); err != nil {
		testenv.Unavailable(t, "%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	t0 := time.Now()
	archive, err := BuildPorticoImage(ctx, root, filepath.Join(t.TempDir(), "image"), "e2e-1")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("image built: %.1f s", time.Since(t0).Seconds())
	c, err := Start(ctx, Options{Nodes: 5, Images: []string{archive}})
	if err != nil {
		t.Fatalf("start the cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	t.Logf("5 nodes Ready: %.1f s", c.Timings.NodesReady.Seconds())
	edges, worker := c.Nodes[:4], c.Nodes[4]
	t1 := time.Now()
	p, err := c.InstallPortico(ctx, PorticoOptions{Root: root, Tag: "e2e-1", Edges: edges})
	if err != nil {
		t.Fatalf("install Portico: %v\n%s", err, c.tails())
	}
	t.Logf("Portico installed, every agent ready and the VIP answering: %.1f s", time.Since(t1).Seconds())
	if p.Resets, err = p.CaptureResets(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Resets.Stop)
	if p.Traffic, err = p.C.Net.StartCaptureOf(t.TempDir(), fmt.Sprintf("tcp port 80 and host %s", GroupVIP)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Traffic.Stop)
	// VRRP settles first (the agents came up one by one: for a moment the
	// owner may be any edge). The backends start on the worker: the owner's
	// death must not take any with it, and VRRP may move the VIP to any edge
	// until then (a loaded node's late adverts, the higher address winning).
	owner, err := p.SettledOwner(ctx, 2*time.Second, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("VIP owner %s; backends on %s", owner.Name, worker.Name)
	certs, err := c.DeployExample(ctx, []*Node{worker})
	if err != nil {
		t.Fatal(err)
	}
	waitServed(t, p, "web.example", "/", edges)
	waitServed(t, p, "web.example", "/api/items", edges)
	if err := p.DeployHold(ctx, worker, edges); err != nil {
		t.Fatal(err)
	}

	t.Run("InstallThenOwnerDies", func(t *testing.T) { testInstallThenOwnerDies(t, ctx, p) })
	// The edge that gets drained also runs backends, so the drain evicts pods
	// through the real EndpointSlice controller too: a surviving edge that
	// does not own the VIP now.
	drained := nonOwner(t, p)
	if err := c.PlaceBackend(ctx, "web", 3, []*Node{drained, worker}); err != nil {
		t.Fatal(err)
	}
	t.Logf("backends now on %s (not the VIP's owner) and %s", drained.Name, worker.Name)
	waitServed(t, p, "web.example", "/", p.Edges)
	t.Run("Routing", func(t *testing.T) { testRouting(t, ctx, p, certs, p.Edges) })
	t.Run("TenantAttacks", func(t *testing.T) { testTenant(t, ctx, p) })
	t.Run("AgentTokenRootOnly", func(t *testing.T) { testAgentTokenRootOnly(t, ctx, p) })
	t.Run("Drain", func(t *testing.T) { testDrain(t, ctx, p, drained) })
	t.Run("IngressClaim", func(t *testing.T) { testIngressClaim(t, ctx, p, worker) })
	t.Run("RollingUpdateWithDrain", func(t *testing.T) { testRollingUpdate(t, ctx, p, drained) })
	// Idle connections for the next two events, opened in the rolling update's
	// transition (a rolling update restarts every edge's nginx: what was opened
	// before it is gone).
	idle, err := p.OpenHeld(ctx, 0, 40)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(idle.Close)
	idle2, err := p.OpenHeld(ctx, 0, 40)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(idle2.Close)
	idleSince := time.Now()
	// Then, within the rollout's transition (each change extends it), a false
	// verdict on a healthy edge, and the owner's death right after it: the
	// wrongly called edge learns the others' verdict and every restarted agent
	// replayed its own down (bpf/README.md), so every edge's chains agree.
	t.Run("LivenessFalsePositive", func(t *testing.T) { testFalsePositive(t, ctx, p, idle2, idleSince) })
	t.Run("FalsePositiveThenNodeDies", func(t *testing.T) { testNodeDies(t, ctx, p, idle, idleSince) })
}

// nonOwner is an edge of p that does not own the group's VIP now.
func nonOwner(t *testing.T, p *Portico) *Node {
	t.Helper()
	owner, err := p.Owner(GroupVIP)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range p.Edges {
		if n != owner {
			return n
		}
	}
	t.Fatalf("no edge but the VIP's owner %s", owner.Name)
	return nil
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

// openHeld opens the HTTP and idle TCP connections of OpenHeld, closed when
// the test ends.
func openHeld(t *testing.T, p *Portico, http, idle int) Held {
	t.Helper()
	if err := p.WaitConfigQuiet(context.Background(), 3*time.Second, time.Minute); err != nil {
		t.Fatal(err)
	}
	held, err := p.OpenHeld(context.Background(), http, idle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(held.Close)
	return held
}

// checkHeld fails the test unless every held connection on a surviving replica
// answers within timeout (asked at once), and logs what it found.
func checkHeld(t *testing.T, ctx context.Context, p *Portico, what string, held Held, timeout time.Duration, excluded ...*Node) HeldCheck {
	t.Helper()
	c := p.Check(ctx, held, timeout, excluded...)
	t.Logf("held connections %s: %v", what, c)
	if c.Kept != c.Total || len(c.Failed) > 0 {
		t.Errorf("held connections %s: %v, want all to answer within %v; failed: %s", what, c, timeout, strings.Join(c.Failed, "; "))
		t.Logf("where they go:\n%s", p.Diagnose(ctx, c.FailedConns))
	}
	return c
}

// idleFor waits until the idle connections opened at since have been idle for
// d, so they meet the next event as a database's pooled connection would.
func idleFor(t *testing.T, since time.Time, d time.Duration) {
	wait := time.Until(since.Add(d))
	if wait > 0 {
		t.Logf("the idle connections wait %.0f s more (idle for %v before the event)", wait.Seconds(), d)
		time.Sleep(wait)
	}
}

// failures logs and returns the stream's failed attempts (at or after from),
// with the captured frames of the first few.
func failures(t *testing.T, p *Portico, atts []traffic.Attempt, from time.Time) traffic.Failures {
	t.Helper()
	f := traffic.FailuresAround(atts, from)
	t.Logf("new connections: %v", f)
	if f.Failed == 0 || p.Traffic == nil {
		return f
	}
	t.Log(p.MACs(context.Background()))
	shown := 0
	for _, a := range atts {
		if a.Err == nil || a.SPort == 0 || a.Start.Before(from) {
			continue
		}
		if shown++; shown > diagnosed {
			break
		}
		t.Logf("frames of the failed connection from port %d on the bridge (epoch seconds, MACs first):\n%s", a.SPort, p.Traffic.Show(fmt.Sprintf("tcp port %d", a.SPort), 80))
	}
	return f
}

// testDrain: kubectl drain of an edge node that also runs backends. Its web pods
// are evicted and turn terminating through the real EndpointSlice controller; its
// agent's replica drains (the node is cordoned): no new flows, its connections
// finish. Not one request fails. Uncordoned, it serves new flows again.
func testDrain(t *testing.T, ctx context.Context, p *Portico, node *Node) {
	held := openHeld(t, p, 60, 20)
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
	if c := checkHeld(t, ctx, p, "after the drain", held, 3*time.Second); c.Kept != c.Total {
		t.Logf("what the agents said:\n%s", p.AgentLogs(ctx, "portico-agent", "vrrp state", "liveness", "stalled", "data plane applied", "unhealthy", "healthy", "nginx"))
	}
	atts := stream.Stop()
	if f := failures(t, p, atts, start); f.Failed > 0 {
		t.Errorf("%d requests failed during the drain, want 0", f.Failed)
	}
	after := failures(t, p, atts, settled)
	t.Logf("%d held connections through %s; new connections after the drain settled, per edge: %v", onNode, node.Name, after.PerEdge)
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
// time under load, and an edge is drained (kubectl drain: cordoned, its replica
// draining) while it does. Not one request fails, and forwarding never stops: on
// every edge the pinned XDP link is the same before and after (the new agent
// replaced the program on it), so the old pod's exit never detached it. Every
// connection opened during the rollout to an agent that is not replaced later
// keeps working (a replaced agent's nginx closes its idle connections, which
// clients open again: the kept-alive load counts that).
func testRollingUpdate(t *testing.T, ctx context.Context, p *Portico, drainedBefore *Node) {
	owner, err := p.Owner(GroupVIP)
	if err != nil {
		t.Fatal(err)
	}
	drain := drainedBefore
	for _, n := range p.Edges {
		if n != owner && n != drainedBefore {
			drain = n
			break
		}
	}
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
	// What every agent says, the old ones' last words included, for a failure's report.
	logs := p.RecordAgentLogs(ctx, "portico-agent")
	defer logs.Stop()
	load := startKeepAliveLoad(ctx, p, 4)
	stream := p.StartStream(ctx, "web.example", traffic.StreamOptions{Every: 10 * time.Millisecond, Timeout: slowAnswer, For: 4 * time.Minute})
	time.Sleep(time.Second)
	start := time.Now()
	upgraded := make(chan error, 1)
	go func() { upgraded <- p.Upgrade(ctx, 4*time.Minute, "image.tag=e2e-2") }()
	// Held connections opened all through the rollout, and the drain once the
	// first agent was replaced.
	var held Held
	t.Cleanup(func() { held.Close() })
	var upErr error
	drainedAt := time.Duration(0)
	for done := false; !done; {
		select {
		case upErr = <-upgraded:
			done = true
		case <-time.After(time.Second):
		}
		// HTTP only: nginx's graceful stop waits up to 60 s for a stream
		// connection, and the rollout for the old pod with it.
		h, err := p.OpenHeld(ctx, 4, 0)
		if err != nil {
			t.Errorf("open held connections during the rollout: %v", err)
			continue
		}
		held = append(held, h...)
		if drainedAt > 0 {
			continue
		}
		pods, err := p.Agents(ctx, "portico-agent")
		if err == nil && slices.ContainsFunc(p.Edges, func(n *Node) bool { return pods[n.Name] != oldPods[n.Name] }) {
			drainedAt = time.Since(start)
			if _, err := p.C.Kubectl(ctx, nil, "drain", drain.Name, "--ignore-daemonsets", "--timeout=90s"); err != nil {
				t.Errorf("drain %s: %v", drain.Name, err)
			}
		}
	}
	if upErr != nil {
		stream.Stop()
		load.Stop()
		t.Fatal(upErr)
	}
	p.Tag = "e2e-2"
	t.Logf("helm upgrade rolled %d agents out: %.1f s; %s drained from %.1f s", len(p.Edges), time.Since(start).Seconds(), drain.Name, drainedAt.Seconds())
	if drainedAt == 0 {
		t.Errorf("%s was not drained during the rollout", drain.Name)
	}
	time.Sleep(2 * time.Second)
	c := checkHeld(t, ctx, p, "opened during the rollout", held, 3*time.Second)
	if c.Total < 20 {
		t.Errorf("only %d connections opened during the rollout are on agents it did not replace later, want >= 20", c.Total)
	}
	if c.Kept != c.Total {
		t.Logf("what xdp_lb counted:\n%s", p.AgentCommand(ctx, "portico-agent", "counters"))
		t.Logf("what the agents said:\n%s", logs.Lines(`"level":"info"`, `"level":"warn"`, `"level":"error"`))
	}
	atts := stream.Stop()
	ok, failed, errs := load.Stop()
	t.Logf("kept-alive requests: %d answered, %d failed %v", ok, failed, errs)
	if f := failures(t, p, atts, start); f.Failed > 0 || failed > 0 {
		t.Errorf("during the rolling update %d new connections and %d kept-alive requests failed, want 0", f.Failed, failed)
		for i, a := range slices.DeleteFunc(slices.Clone(atts), func(a traffic.Attempt) bool { return a.Err == nil }) {
			if i < 10 {
				t.Logf("failed at %.3f (the agents' ts), source port %d: %v", float64(a.Start.UnixNano())/1e9, a.SPort, a.Err)
			}
		}
		t.Logf("what xdp_lb counted:\n%s", p.AgentCommand(ctx, "portico-agent", "counters"))
		t.Logf("what the agents said:\n%s", logs.Lines(`"level":"info"`, `"level":"warn"`, `"level":"error"`))
	}
	if ok == 0 {
		t.Error("no kept-alive request was answered")
	}
	if _, err := p.C.Kubectl(ctx, nil, "uncordon", drain.Name); err != nil {
		t.Fatal(err)
	}
	waitServed(t, p, "web.example", "/", p.Edges)
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
		if pod.Spec.NodeName == "" || !slices.ContainsFunc(p.Edges, func(n *Node) bool { return n.Name == pod.Spec.NodeName }) {
			continue // the dead node's pod
		}
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

// testInstallThenOwnerDies: the VIP owner dies within the ring transition the
// install left (each agent that joined changed every edge's rings), with 60
// connections held (half over IPv6), 20 TCP connections through the L4 Service
// and a stream of new connections.
func testInstallThenOwnerDies(t *testing.T, ctx context.Context, p *Portico) {
	held := openHeld(t, p, 60, 20)
	in, err := p.InTransition(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("edges in a ring transition as the owner dies: %d %v", len(in), in)
	if len(in) == 0 {
		t.Error("no edge is in the install's ring transition: the owner would not die within it")
	}
	dead := nodeDies(t, ctx, p, held)
	// The operator removes the dead machine, as after any node that will not
	// come back (its DaemonSet pod would hold every later rollout).
	if _, err := p.C.Kubectl(ctx, nil, "delete", "node", dead.Name); err != nil {
		t.Fatal(err)
	}
}

// testFalsePositive: the liveness checks of a healthy replica fail for 300 ms
// (its probe port blocked, more than liveness.deadAfter): every other edge calls
// it down, then up again, within the transitions of a rolling update and a
// node's death. It keeps every
// connection it has (a replica wrongly called dead must), the others keep
// theirs, and no new connection fails.
func testFalsePositive(t *testing.T, ctx context.Context, p *Portico, idle Held, idleSince time.Time) {
	node := nonOwner(t, p)
	idleFor(t, idleSince, 90*time.Second)
	held := append(openHeld(t, p, 60, 0), idle...)
	on := 0
	for _, h := range held {
		if h.Edge == node.IP.String() {
			on++
		}
	}
	stream := p.StartStream(ctx, "web.example", traffic.StreamOptions{Every: 10 * time.Millisecond, Timeout: slowAnswer, For: time.Minute})
	time.Sleep(time.Second)
	start := time.Now()
	if err := p.BlockProbes(node, 300*time.Millisecond); err != nil {
		stream.Stop()
		t.Fatal(err)
	}
	checkHeld(t, ctx, p, "as the false verdict clears", held, HeldAnswer)
	time.Sleep(3 * time.Second)
	checkHeld(t, ctx, p, "3 s later", held, 3*time.Second)
	if f := failures(t, p, stream.Stop(), start); f.Failed > 0 {
		t.Errorf("%d new connections failed, want 0", f.Failed)
	}
	// The verdict happened: an edge's ring left the replica out.
	said := p.AgentLogs(ctx, "portico-agent", "ring follows replica liveness")
	if !strings.Contains(said, node.IP.String()) {
		t.Errorf("no edge called %s down: the false positive did not happen\n%s", node.Name, said)
	}
	// And it learned that the others called it down: its own rings followed.
	learned := p.AgentLogs(ctx, "portico-agent", "verdict on this node's replica changed")
	if !strings.Contains(learned, `"called down":["`+node.IP.String()+`"]`) {
		t.Errorf("%s never learned that the other edges called it down (its rings would differ from theirs)\n%s", node.Name, learned)
	}
	t.Logf("%s called down wrongly, %d held connections through it; what the agents said:\n%s%s", node.Name, on, said, learned)
}

// testNodeDies: the VIP owner dies within the transition of a rolling update
// (with a drain), with connections held that were idle for 90 s.
func testNodeDies(t *testing.T, ctx context.Context, p *Portico, idle Held, idleSince time.Time) {
	idleFor(t, idleSince, 90*time.Second)
	held := append(openHeld(t, p, 60, 0), idle...)
	if in, err := p.InTransition(ctx); err != nil {
		t.Logf("ring transitions: %v", err)
	} else {
		t.Logf("edges in a ring transition as the owner dies: %d %v", len(in), in)
	}
	nodeDies(t, ctx, p, held)
}

// nodeDies kills the VIP owner as a machine dies (KillOwner) with the held
// connections and a stream of new ones: the VIP moves; every held connection on
// a surviving replica answers within HeldAnswer of the takeover, and still at
// the end; new connections stop failing within the VRRP takeover plus the
// liveness bound. Later the node controller marks the node NotReady and the
// EndpointSlice controller drops its agent: nothing changes for the clients.
func nodeDies(t *testing.T, ctx context.Context, p *Portico, held Held) *Node {
	d, err := p.KillOwner(ctx, held, true)
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
	for _, c := range []struct {
		what string
		c    HeldCheck
	}{{"within " + HeldAnswer.String() + " of the takeover", d.AfterTakeover}, {"at the end", d.AtEnd}} {
		if c.c.Total < 30 || c.c.Kept != c.c.Total {
			t.Errorf("long-lived connections on surviving replicas %s: %v; want all (and >= 30): %s", c.what, c.c, strings.Join(c.c.Failed, "; "))
		}
	}
	if t.Failed() {
		t.Logf("what the agents said:\n%s", p.AgentLogs(ctx, "portico-agent", "vrrp state", "liveness", "stalled", "data plane applied", "unhealthy", "healthy", "new director"))
		t.Logf("what xdp_lb counted:\n%s", p.AgentCommand(ctx, "portico-agent", "counters"))
		t.Logf("what xdp_lb pinned:\n%s", p.AgentCommand(ctx, "portico-agent", "flows", "-n", "20"))
		t.Logf("where the failed held connections go:\n%s", p.Diagnose(ctx, d.AtEnd.FailedConns))
	}
	return d.Node
}
