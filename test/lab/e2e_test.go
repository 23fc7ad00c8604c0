package lab

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/test/kapi"
	"github.com/portico-edge/portico/test/netlab"
	"github.com/portico-edge/portico/test/testcert"
	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

var porticoBin string

func TestMain(m *testing.M) { os.Exit(Main(m, &porticoBin)) }

// startLab brings the lab up with backends, an Ingress and every agent, and
// waits until HTTP through the VIP works.
func startLab(t *testing.T) *Lab {
	t.Helper()
	testenv.RequireRoot(t, "network namespaces, XDP, VRRP")
	return startLabWith(t, Options{Portico: porticoBin})
}

// startLabWith starts a lab of o and brings it up; the agents' logs are printed
// if the test fails, and the lab is closed when it ends.
func startLabWith(t *testing.T, o Options) *Lab {
	t.Helper()
	kapi.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l, err := Start(ctx, o)
	if err != nil {
		t.Fatalf("start lab: %v", err)
	}
	t.Cleanup(func() {
		for i := range l.Edges {
			if a := l.Agent(i); a != nil {
				keepLog(t, a.Edge.Name, a.Log())
			}
		}
		if t.Failed() {
			for i := range l.Edges {
				if a := l.Agent(i); a != nil {
					log := a.Log()
					t.Logf("agent %s warnings and errors (last 40):\n%s", a.Edge.Name, warnings(log, 40))
					if len(log) > 6000 {
						log = log[len(log)-6000:]
					}
					t.Logf("agent %s log (tail):\n%s", a.Edge.Name, log)
				}
			}
		}
		if err := l.Close(); err != nil {
			t.Errorf("close lab: %v", err)
		}
	})
	if err := l.Up(ctx, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	return l
}

// keepLog copies an agent's whole log into $PORTICO_LAB_LOGS, when set, as
// <test>-<edge>.log: for a failure the tail does not explain, or to compare a
// passing run with it.
func keepLog(t *testing.T, edge, log string) {
	dir := os.Getenv("PORTICO_LAB_LOGS")
	if dir == "" {
		return
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()) + "-" + edge + ".log"
	err := os.MkdirAll(dir, 0o755)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, name), []byte(log), 0o644)
	}
	if err != nil {
		t.Logf("keep agent %s log: %v", edge, err)
	}
}

// warnings returns the last max lines of log at level warn or above.
func warnings(log string, max int) string {
	var out []string
	for line := range strings.SplitSeq(log, "\n") {
		if strings.Contains(line, `"level":"warn"`) || strings.Contains(line, `"level":"error"`) {
			out = append(out, line)
		}
	}
	if len(out) > max {
		out = out[len(out)-max:]
	}
	return strings.Join(out, "\n")
}

// vipOwner returns the edge that owns the VIP, alone, or fails t.
func vipOwner(t *testing.T, l *Lab) *Node {
	t.Helper()
	owner, err := l.Owner()
	if err != nil {
		t.Fatal(err)
	}
	return owner
}

// waitNewOwner waits up to d for an edge other than old to own the VIP, alone, and
// returns it, or fails t.
func waitNewOwner(t *testing.T, l *Lab, old *Node, d time.Duration) *Node {
	t.Helper()
	var n *Node
	if _, err := testenv.Poll(context.Background(), d, 100*time.Millisecond, func() (err error) { n, err = l.newOwner(old); return err }); err != nil {
		t.Fatalf("no new owner within %v: %v", d, err)
	}
	return n
}

// ownerUnderLoad brings the lab up, starts requests to echo.lab and lets them run
// for a second; it returns the lab, the load and the edge that owns the VIP.
func ownerUnderLoad(t *testing.T) (*Lab, *traffic.Load, *Node) {
	t.Helper()
	l := startLab(t)
	owner := vipOwner(t, l)
	load := l.StartLoad(context.Background(), "echo.lab", 4)
	time.Sleep(time.Second)
	return l, load, owner
}

// waitServed waits until host+path is served through every edge node: 30
// consecutive new connections succeed, pass check, and reach all edges.
func (l *Lab) waitServed(ctx context.Context, d time.Duration, host, path string, check func(traffic.Reply) error) error {
	c := l.HTTPClient(false, 2*time.Second)
	_, err := testenv.Poll(ctx, d, 100*time.Millisecond, func() error {
		edges := map[string]bool{}
		for range 30 {
			r, err := l.Get(ctx, c, host, path)
			if err == nil && check != nil {
				err = check(r)
			}
			if err != nil {
				return err
			}
			edges[r.Edge] = true
		}
		if len(edges) != len(l.Edges) {
			return fmt.Errorf("%s%s served through %d edges", host, path, len(edges))
		}
		return nil
	})
	return err
}

// TestRoutingTLSAndSpread: HTTP by host and path and HTTPS with SNI reach the
// right backends through the VIP, with the client's address intact, and new
// connections spread evenly over the three edge replicas.
func TestRoutingTLSAndSpread(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	if err := l.Backend(ctx, "api", l.Pods[1]); err != nil {
		t.Fatal(err)
	}
	if err := l.IngressRoutes(ctx, "shop", "shop.lab", "", Route{Path: "/", Service: "echo"}, Route{Path: "/api", Service: "api"}); err != nil {
		t.Fatal(err)
	}
	cert, key, err := testcert.ECDSA("secure.lab")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.TLSSecret(ctx, "secure-tls", cert, key); err != nil {
		t.Fatal(err)
	}
	if err := l.IngressRoutes(ctx, "secure", "secure.lab", "secure-tls", Route{Path: "/", Service: "api"}); err != nil {
		t.Fatal(err)
	}
	c := l.HTTPClient(false, 2*time.Second)
	client := l.Client.Addr.Addr().String()

	// Host and path: /api and /api/... go to the api backend (pod p2 only).
	if err := l.waitServed(ctx, 30*time.Second, "shop.lab", "/api/items", func(r traffic.Reply) error {
		if r.Pod != "p2" {
			return fmt.Errorf("/api/items served by %s", r.Pod)
		}
		return nil
	}); err != nil {
		t.Fatalf("shop.lab/api never routed on every edge: %v", err)
	}
	pods := map[string]int{}
	for range 40 {
		r, err := l.Get(ctx, c, "shop.lab", "/apix") // not /api: Prefix matches whole path elements
		if err != nil {
			t.Fatal(err)
		}
		pods[r.Pod]++
		if r.Client != client || r.Path != "/apix" {
			t.Fatalf("reply %+v: want client %s, path /apix", r, client)
		}
	}
	if pods["p1"] == 0 || pods["p2"] == 0 {
		t.Errorf("shop.lab/apix reached %v, want both echo pods", pods)
	}
	// An unknown host has its connection closed (return 444).
	if _, err := l.Get(ctx, c, "nobody.lab", "/"); err == nil {
		t.Error("an unknown host was answered")
	}

	// HTTPS with SNI: the right certificate, the right backend.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cert)
	tc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: l.Dial, DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{ServerName: "secure.lab", RootCAs: pool}}}
	if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error {
		req, _ := http.NewRequest(http.MethodGet, "https://"+VIP.String()+"/tls", nil)
		req.Host = "secure.lab"
		resp, err := tc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		r, err := traffic.ParseReply(string(body))
		if err != nil {
			return err
		}
		if r.Pod != "p2" || r.Client != client || resp.TLS.PeerCertificates[0].Subject.CommonName != "secure.lab" {
			return fmt.Errorf("https reply %+v with certificate %s", r, resp.TLS.PeerCertificates[0].Subject.CommonName)
		}
		return nil
	}); err != nil {
		t.Fatalf("HTTPS with SNI: %v", err)
	}

	// The example Ingress (deploy/examples/web.yaml, bound by its IngressClass)
	// is served, and its status shows the group's VIP.
	if _, err := l.Get(ctx, c, ExampleHost, "/"); err != nil {
		t.Fatalf("example host: %v", err)
	}
	if _, err := testenv.Poll(ctx, 10*time.Second, 100*time.Millisecond, func() error {
		ing, err := l.Kube.NetworkingV1().Ingresses(GroupNamespace).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if lb := ing.Status.LoadBalancer.Ingress; len(lb) != 1 || lb[0].IP != VIP.String() {
			return fmt.Errorf("example Ingress status %+v, want %s", lb, VIP)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// Spread: new connections over the three replicas, each within ±15% of a third.
	const conns = 3000
	var mu sync.Mutex
	edges := map[string]int{}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < conns; i += 8 {
				r, err := l.Get(ctx, c, "shop.lab", "/")
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				edges[r.Edge]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("spread: %v", err)
	}
	t.Logf("%d connections per edge: %v", conns, edges)
	if len(edges) != 3 {
		t.Fatalf("connections reached %d edges: %v", len(edges), edges)
	}
	for e, n := range edges {
		if third := float64(conns) / 3; float64(n) < 0.85*third || float64(n) > 1.15*third {
			t.Errorf("edge %s served %d of %d connections, want %.0f ±15%%", e, n, conns, third)
		}
	}

	// portico status: every node reports, one owner, equal table digests.
	owner := vipOwner(t, l)
	var out string
	if _, err := testenv.Poll(ctx, 15*time.Second, 100*time.Millisecond, func() error {
		b, err := exec.Command(porticoBin, "status", "-kubeconfig", l.API.Kubeconfig).CombinedOutput()
		out = string(b)
		if err != nil {
			return fmt.Errorf("portico status: %v", err)
		}
		for _, want := range []string{"owner " + owner.Name + "\n", "all nodes agree", "e1 ", "e2 ", "e3 "} {
			if !strings.Contains(out, want) {
				return fmt.Errorf("portico status lacks %q", want)
			}
		}
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) > 2 && strings.HasPrefix(f[0], "e") && f[2] != "ok" {
				return fmt.Errorf("node %s is not healthy", f[0])
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	t.Logf("portico status:\n%s", out)
}

// TestDirectorFailover: with 200+ long-lived connections open through the VIP,
// the owner's agent is killed (-9) and its link cut. Another edge takes the VIP
// within the VRRP bound, and the connections held by the surviving replicas keep
// working: the new owner's identical Maglev table sends each one where it was.
func TestDirectorFailover(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	owner := vipOwner(t, l)
	conns, err := l.OpenKeepConns(ctx, "echo.lab", 240)
	if err != nil {
		t.Fatal(err)
	}
	defer conns.Close()
	ownerIP := owner.Addr.Addr().String()
	byEdge := map[string]int{}
	for _, k := range conns {
		byEdge[k.Edge]++
	}
	t.Logf("owner %s; connections per edge: %v", owner.Name, byEdge)

	newOwner, takeover := l.killOwner(t, owner)
	// Master down interval at 100 ms adverts: 3 × 100 ms + skew (< 100 ms).
	if takeover > 2*time.Second {
		t.Errorf("takeover took %v", takeover)
	}

	survived, OnSurvivors := 0, 0
	for _, k := range conns {
		if k.Edge == ownerIP {
			continue
		}
		OnSurvivors++
		if _, err := k.Do("echo.lab", "/after", 3*time.Second); err == nil {
			survived++
		} else {
			t.Logf("connection via %s: %v", k.Edge, err)
		}
	}
	t.Logf("new owner %s after %v; %d of %d connections on surviving replicas kept working", newOwner.Name, takeover.Round(time.Millisecond), survived, OnSurvivors)
	if OnSurvivors < 100 {
		t.Fatalf("only %d connections on surviving replicas", OnSurvivors)
	}
	if float64(survived) < 0.99*float64(OnSurvivors) {
		t.Errorf("%d of %d connections survived, want >= 99%%", survived, OnSurvivors)
	}
}

// killOwner kills the VIP owner's agent (-9) and cuts its link, and waits for
// another edge to take the VIP: the new owner, and how long it took.
func (l *Lab) killOwner(t *testing.T, owner *Node) (*Node, time.Duration) {
	t.Helper()
	start := time.Now()
	l.killAndCut(t, owner)
	newOwner := waitNewOwner(t, l, owner, 5*time.Second)
	return newOwner, time.Since(start)
}

// killAndCut kills an edge's agent (-9) and cuts its link.
func (l *Lab) killAndCut(t *testing.T, n *Node) {
	t.Helper()
	if err := l.Agent(l.EdgeNo(n)).Kill(syscall.SIGKILL, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := netlab.Exec(n.NS, "ip", "link", "set", "eth0", "down"); err != nil {
		t.Fatal(err)
	}
}

// ownerMaps reads the owner's pinned maps: the replica states it steers with.
func (l *Lab) ownerBackends(owner *Node) (map[string]dataplane.BackendView, error) {
	in, err := dataplane.OpenPinned("/sys/fs/bpf/" + l.Net.Prefix + owner.Name)
	if err != nil {
		return nil, err
	}
	defer in.Close()
	vips, err := in.VIPs()
	if err != nil {
		return nil, err
	}
	out := map[string]dataplane.BackendView{}
	for _, v := range vips {
		if v.Addr == VIP {
			for _, b := range v.Backends {
				out[b.Addr.String()] = b
			}
		}
	}
	return out, nil
}

// TestReplicaDrain: a replica marked terminating finishes its connections and
// gets no new ones; once removed, no connection to the others breaks.
func TestReplicaDrain(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	owner := vipOwner(t, l)
	conns, err := l.OpenKeepConns(ctx, "echo.lab", 90)
	if err != nil {
		t.Fatal(err)
	}
	defer conns.Close()
	// Drain an edge that is not the owner.
	var drained *Node
	for _, e := range l.Edges {
		if e != owner {
			drained = e
			break
		}
	}
	dIP := drained.Addr.Addr().String()
	if err := l.SetGroupEndpoints(ctx, map[*Node]string{drained: "terminating"}); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(ctx, 10*time.Second, 100*time.Millisecond, func() error {
		bs, err := l.ownerBackends(owner)
		if err != nil {
			return err
		}
		// Apply writes the backend entry before it swaps the ring: wait for both.
		if !bs[dIP].Draining || bs[dIP].Slots != 0 {
			return fmt.Errorf("%s not draining, or still holding ring slots, in the owner's maps: %+v", dIP, bs[dIP])
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	c := l.HTTPClient(false, 2*time.Second)
	for range 300 {
		r, err := l.Get(ctx, c, "echo.lab", "/new")
		if err != nil {
			t.Fatal(err)
		}
		if r.Edge == dIP {
			t.Fatalf("a new connection reached the draining replica %s", drained.Name)
		}
	}
	onDrained := 0
	for _, k := range conns {
		if _, err := k.Do("echo.lab", "/during-drain", 3*time.Second); err != nil {
			t.Errorf("connection via %s broke while %s drained: %v", k.Edge, drained.Name, err)
		}
		if k.Edge == dIP {
			onDrained++
		}
	}
	if onDrained == 0 {
		t.Fatal("no connection was on the drained replica: the test proves nothing")
	}

	// Removed: connections to the other replicas keep working.
	if err := l.SetGroupEndpoints(ctx, map[*Node]string{drained: "gone"}); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(ctx, 10*time.Second, 100*time.Millisecond, func() error {
		bs, err := l.ownerBackends(owner)
		if err != nil {
			return err
		}
		if _, ok := bs[dIP]; ok {
			return fmt.Errorf("%s still in the owner's maps", dIP)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	others := 0
	for _, k := range conns {
		if k.Edge == dIP {
			continue
		}
		others++
		if _, err := k.Do("echo.lab", "/after-removal", 3*time.Second); err != nil {
			t.Errorf("connection via %s broke after %s was removed: %v", k.Edge, drained.Name, err)
		}
	}
	t.Logf("%d connections on the drained replica completed; %d on the others kept working after its removal", onDrained, others)
}

// TestIngressPropagation: a new host is served within 2 s of its Ingress being
// created; a bad Ingress gets an Event and everything else is still served.
func TestIngressPropagation(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	c := l.HTTPClient(false, 2*time.Second)
	start := time.Now()
	if err := l.Ingress(ctx, "fresh", "fresh.lab", "echo"); err != nil {
		t.Fatal(err)
	}
	if err := l.waitServed(ctx, 10*time.Second, "fresh.lab", "/", nil); err != nil {
		t.Fatal(err)
	}
	// Includes the 30 checking requests (tens of milliseconds).
	took := time.Since(start)
	t.Logf("fresh.lab served through every edge %v after its Ingress was created", took.Round(time.Millisecond))
	if took > 2*time.Second {
		t.Errorf("propagation took %v, want < 2s", took)
	}

	bad := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Namespace: AppNamespace, Name: "bad",
		Annotations: map[string]string{"portico.io/group": GroupNamespace + "/" + GroupName, "portico.io/ssl-redirect": "perhaps"}},
		Spec: networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{{Host: "bad.lab", IngressRuleValue: networkingv1.IngressRuleValue{
			HTTP: &networkingv1.HTTPIngressRuleValue{Paths: []networkingv1.HTTPIngressPath{{Path: "/x;return", PathType: ptr(networkingv1.PathTypePrefix),
				Backend: networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: "echo", Port: networkingv1.ServiceBackendPort{Name: "http"}}}}}}}}}}}
	if _, err := l.Kube.NetworkingV1().Ingresses(AppNamespace).Create(ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(ctx, 10*time.Second, 100*time.Millisecond, func() error {
		evs, err := l.Kube.CoreV1().Events(AppNamespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=bad"})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Type == corev1.EventTypeWarning {
				t.Logf("event on the bad Ingress: %s: %s", e.Reason, e.Message)
				return nil
			}
		}
		return fmt.Errorf("no warning event on the bad Ingress (%d events)", len(evs.Items))
	}); err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"echo.lab", "fresh.lab"} {
		if _, err := l.Get(ctx, c, host, "/still"); err != nil {
			t.Errorf("%s after the bad Ingress: %v", host, err)
		}
	}
}

// TestIngressAddressAfterServing: a new Ingress gets its address in status only
// once every edge's nginx serves it, so a client that waits for the address (as
// kubectl wait, CD pipelines and conformance runners do) never sees a request
// fail: 100 new connections right after the address appears, spread over every
// replica, all answered.
func TestIngressAddressAfterServing(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	c := l.HTTPClient(false, 2*time.Second)
	created := time.Now()
	if err := l.Ingress(ctx, "fresh", "fresh.lab", "echo"); err != nil {
		t.Fatal(err)
	}
	// First answer through the VIP, polled beside the status.
	firstServed := make(chan time.Duration, 1)
	pollCtx, stopPoll := context.WithTimeout(ctx, 30*time.Second)
	defer stopPoll()
	go func() {
		for pollCtx.Err() == nil {
			if _, err := l.Get(pollCtx, c, "fresh.lab", "/probe"); err == nil {
				firstServed <- time.Since(created)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	var status time.Duration
	if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error {
		ing, err := l.Kube.NetworkingV1().Ingresses(AppNamespace).Get(ctx, "fresh", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if lb := ing.Status.LoadBalancer.Ingress; len(lb) != 1 || lb[0].IP != VIP.String() {
			return fmt.Errorf("status %+v, want %s", lb, VIP)
		}
		status = time.Since(created)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	failed, replicas := 0, map[string]int{}
	var first error
	for range 100 {
		r, err := l.Get(ctx, c, "fresh.lab", "/after-status")
		if err != nil {
			failed++
			if first == nil {
				first = err
			}
			continue
		}
		replicas[r.Edge]++
	}
	var served time.Duration
	select {
	case served = <-firstServed:
	case <-time.After(5 * time.Second):
		t.Error("the poller never got an answer")
	}
	t.Logf("Ingress created: first answer through the VIP after %v, address in status after %v; then %d of 100 requests failed (per replica %v)",
		served.Round(time.Millisecond), status.Round(time.Millisecond), failed, replicas)
	if failed > 0 {
		t.Errorf("%d of 100 requests failed after the address appeared (first: %v)", failed, first)
	}
	if len(replicas) != len(l.Edges) {
		t.Errorf("requests reached replicas %v, want all %d: the test proves less than it says", replicas, len(l.Edges))
	}
}

// waitIngressAddrs waits until Ingress name's status lists want, in order.
func (l *Lab) waitIngressAddrs(ctx context.Context, d time.Duration, name string, want ...netip.Addr) error {
	_, err := testenv.Poll(ctx, d, 100*time.Millisecond, func() error {
		ing, err := l.Kube.NetworkingV1().Ingresses(AppNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var got []netip.Addr
		for _, e := range ing.Status.LoadBalancer.Ingress {
			a, _ := netip.ParseAddr(e.IP)
			got = append(got, a)
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("Ingress %s's status lists %v, want %v", name, got, want)
		}
		return nil
	})
	return err
}

// annotateIngress sets an annotation on Ingress name.
func (l *Lab) annotateIngress(ctx context.Context, name, key, value string) error {
	c := l.Kube.NetworkingV1().Ingresses(AppNamespace)
	ing, err := c.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	ing.Annotations[key] = value
	_, err = c.Update(ctx, ing, metav1.UpdateOptions{})
	return err
}

// TestSeveralVIPs: a group with two IPv4 VIPs (portico.io/vip lists both) serves
// an Ingress on each, steered by the same data plane over every replica, and the
// Ingress's status lists both addresses.
func TestSeveralVIPs(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	second := VIP.Next()
	svc, err := l.Kube.CoreV1().Services(GroupNamespace).Get(ctx, GroupName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Annotations["portico.io/vip"] = VIP.String() + "," + second.String()
	if _, err := l.Kube.CoreV1().Services(GroupNamespace).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := netlab.IP("-n", l.Client.NS, "route", "add", second.String()+"/32", "dev", "eth0"); err != nil {
		t.Fatal(err)
	}
	if err := l.waitIngressAddrs(ctx, 30*time.Second, "echo", VIP, second); err != nil {
		t.Fatal(err)
	}
	for _, vip := range []netip.Addr{VIP, second} {
		target := traffic.Target{NS: l.Client.NS, VIP: vip}
		c := target.HTTPClient(false, 2*time.Second)
		replicas := map[string]int{}
		if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error {
			_, err := target.Get(ctx, c, "echo.lab", "/first")
			return err
		}); err != nil {
			t.Fatalf("%s: %v", vip, err)
		}
		for range 150 {
			r, err := target.Get(ctx, c, "echo.lab", "/several")
			if err != nil {
				t.Fatalf("%s: %v", vip, err)
			}
			replicas[r.Edge]++
		}
		t.Logf("%s: 150 requests answered, per replica %v", vip, replicas)
		if len(replicas) != len(l.Edges) {
			t.Errorf("%s: requests reached replicas %v, want all %d", vip, replicas, len(l.Edges))
		}
	}
}
