package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

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
