package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

// testBesideKubeProxy: kube-proxy runs on every node (iptables mode). The hold
// Service, an L4 Service, reports ipMode Proxy (KEP-1860), so kube-proxy leaves
// its VIPs alone: a connection from the worker node to a VIP goes through an
// edge's nginx (the backend, on the worker, sees an edge's address), where with
// ipMode VIP the worker's kube-proxy would have taken it straight to the backend
// in the worker's OUTPUT chain. The Service's cluster IP is kube-proxy's: it
// answers from the worker without any edge.
func testBesideKubeProxy(t *testing.T, ctx context.Context, p *Portico, worker *Node) {
	svc, err := p.C.Kube.CoreV1().Services("default").Get(ctx, "hold", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(svc.Status.LoadBalancer.Ingress) != 2 {
		t.Fatalf("hold Service status: %+v, want its two VIPs", svc.Status.LoadBalancer.Ingress)
	}
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if in.IPMode == nil || *in.IPMode != corev1.LoadBalancerIPModeProxy {
			t.Errorf("hold Service status %s: ipMode %v, want Proxy", in.IP, in.IPMode)
		}
	}
	// kube-proxy writes a Service's NAT rules once it has ready endpoints.
	var rules string
	if _, err := testenv.Poll(ctx, 30*time.Second, 500*time.Millisecond, func() error {
		rules, err = worker.Exec("iptables-save", "-t", "nat")
		if err != nil {
			return err
		}
		if !strings.Contains(rules, "KUBE-SERVICES") || !strings.Contains(rules, svc.Spec.ClusterIP+"/32") {
			return fmt.Errorf("kube-proxy's NAT rules on %s lack the hold Service's cluster IP %s", worker.Name, svc.Spec.ClusterIP)
		}
		return nil
	}); err != nil {
		filter, _ := worker.Exec("iptables-save", "-t", "filter")
		log, _ := os.ReadFile(filepath.Join(worker.Dir, "kube-proxy.log"))
		if len(log) > 6000 {
			log = log[len(log)-6000:]
		}
		t.Fatalf("%v\nNAT:\n%s\nfilter:\n%s\nkube-proxy's log (tail):\n%s", err, rules, filter, log)
	}
	if strings.Contains(rules, HoldVIP.String()) {
		t.Errorf("kube-proxy's rules on %s name the VIP %s (ipMode Proxy: they must not)", worker.Name, HoldVIP)
	}

	edgeIPs := map[string]bool{}
	for _, e := range p.Edges {
		edgeIPs[e.IP.String()] = true
	}
	ask := func(what string, to netip.Addr) traffic.Reply {
		t.Helper()
		k, err := traffic.Target{NS: worker.Net.NS, VIP: to, Port: HoldPort}.OpenKeepConn(ctx, "hold")
		if err != nil {
			t.Fatalf("%s from %s: %v", what, worker.Name, err)
		}
		defer k.Close()
		r, err := k.Do("hold", "/", 3*time.Second)
		if err != nil {
			t.Fatalf("%s from %s, second request: %v", what, worker.Name, err)
		}
		return r
	}
	ip := netip.MustParseAddr(svc.Spec.ClusterIP)
	r := ask("the cluster IP", ip)
	t.Logf("cluster IP %s from %s: served by %s, seen from %s (kube-proxy)", ip, worker.Name, r.Pod, r.Edge)
	if edgeIPs[r.Edge] {
		t.Errorf("the cluster IP %s from %s went through the edge %s; kube-proxy on the node serves it", ip, worker.Name, r.Edge)
	}
	for _, vip := range []netip.Addr{HoldVIP, HoldVIP6} {
		r := ask("the VIP", vip)
		t.Logf("VIP %s from %s: served by %s through the edge %s", vip, worker.Name, r.Pod, r.Edge)
		if !edgeIPs[r.Edge] {
			t.Errorf("the VIP %s from %s reached %s from %s, not through an edge's nginx", vip, worker.Name, r.Pod, r.Edge)
		}
	}
}
