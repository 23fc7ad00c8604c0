package cluster

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/test/traffic"
)

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
