package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/portico-edge/portico/test/testenv"
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
// the new owner dies; last, helm uninstall leaves every live node as it was before
// the install.
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
	// What the nodes are before any agent changed them, for the uninstall.
	before := readNodeStates(t, c)
	for name, s := range before {
		if d := nodeLeft(s, s); d != "" {
			t.Fatalf("%s before the install: %s", name, d)
		}
	}
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

	t.Run("BesideKubeProxy", func(t *testing.T) { testBesideKubeProxy(t, ctx, p, worker) })
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
	t.Run("LoadAwareScheduling", func(t *testing.T) { testLoadAwareScheduling(t, ctx, p, worker) })
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
	// Last: nothing of Portico is left to test after it. The idle connections
	// are still open, so nginx's graceful stop takes its longest (30 s).
	t.Run("Uninstall", func(t *testing.T) { testUninstall(t, ctx, p, before) })
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
