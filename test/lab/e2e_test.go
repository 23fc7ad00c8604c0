package lab

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/test/netlab"
	"github.com/portico-edge/portico/test/testcert"
	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

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

	// The same as kubectl's plugin (the binary named kubectl-portico), reading
	// the kubeconfig kubectl would (KUBECONFIG), as JSON.
	plugin := filepath.Join(t.TempDir(), "kubectl-portico")
	if err := os.Symlink(porticoBin, plugin); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(plugin, "status", "-o", "json")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+l.API.Kubeconfig)
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl-portico status -o json: %v", err)
	}
	var doc struct {
		Agents []struct {
			Node, XDPAttachMode string
			Healthy, Stale      bool
		}
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("kubectl-portico status -o json: %v\n%s", err, b)
	}
	if len(doc.Agents) != len(l.Edges) {
		t.Fatalf("kubectl-portico status -o json lists %d agents, want %d:\n%s", len(doc.Agents), len(l.Edges), b)
	}
	for _, a := range doc.Agents {
		if !a.Healthy || a.Stale || a.XDPAttachMode == "" {
			t.Errorf("kubectl-portico status -o json: agent %+v, want healthy, fresh, with its XDP mode", a)
		}
	}
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
