package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/api/agentstatus"
	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

// schedYAML is an Ingress that asks the leader for any group (every group
// Service has the label portico.io/group=true).
const schedYAML = `
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: %s
  namespace: portico-system
  annotations: {portico.io/group-selector: "portico.io/group=true"}
spec:
  ingressClassName: portico
  rules:
  - host: %s.example
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: shopweb, port: {number: 80}}}}]}
`

// testLoadAwareScheduling: two groups, the chart's (three edges, several
// Ingresses) and the IngressClaim's shop (one edge, one Ingress). With real
// traffic through shop's VIP, its agent reports the load, and a new Ingress that
// any group may serve goes to the chart's group, though it has more Ingresses
// (the count alone would choose shop); the Event says why. A bound Ingress stays
// where it is when the load moves.
func testLoadAwareScheduling(t *testing.T, ctx context.Context, p *Portico, shopNode *Node) {
	c := p.C
	out, err := c.Kubectl(ctx, nil, "-n", PorticoNamespace, "get", "ingressclaim", "shop", "-o", "jsonpath={.status.vips[0]}")
	if err != nil {
		t.Fatal(err)
	}
	vip, err := netip.ParseAddr(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("claim VIP %q: %v", out, err)
	}
	shop := traffic.Target{NS: p.NS, VIP: vip}
	load := shop.StartLoad(ctx, "shop.example", 4)
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			ok, failed, first := load.Stop()
			t.Logf("load through shop's VIP: %d requests, %d failed (first: %v)", ok, failed, first)
			if failed > 0 {
				t.Errorf("%d of %d requests through shop's VIP failed: %v", failed, ok+failed, first)
			}
		}
	}
	defer stop()

	// shop's agent reports the load it measures (every 3 s, averaged over 30 s).
	var shopLoad *agentstatus.Load
	testenv.Eventually(t, 45*time.Second, func() string {
		l, err := c.Kube.CoordinationV1().Leases(PorticoNamespace).Get(ctx, "portico-agent-"+shopNode.Name, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		var st agentstatus.State
		if err := json.Unmarshal([]byte(l.Annotations[agentstatus.AnnotationState]), &st); err != nil {
			return err.Error()
		}
		if shopLoad = st.Load; shopLoad == nil || shopLoad.Requests < 150 {
			return fmt.Sprintf("shop's agent on %s reports load %+v, want at least 150 requests/s", shopNode.Name, st.Load)
		}
		return ""
	})
	t.Logf("shop's agent reports %+v", *shopLoad)

	if err := c.Apply(ctx, fmt.Sprintf(schedYAML, "sched1", "sched1")); err != nil {
		t.Fatal(err)
	}
	defer c.Kubectl(context.Background(), nil, "-n", PorticoNamespace, "delete", "ingress", "sched1", "--ignore-not-found")
	group := func(name string) string {
		out, _ := c.Kubectl(ctx, nil, "-n", PorticoNamespace, "get", "ingress", name, "-o", `jsonpath={.metadata.annotations.portico\.io/group}`)
		return strings.TrimSpace(out)
	}
	var bound string
	testenv.Eventually(t, 30*time.Second, func() string {
		if bound = group("sched1"); bound == "" {
			return "sched1 is not bound to a group"
		}
		return ""
	})
	want := PorticoNamespace + "/edge" // the chart's group
	if bound != want {
		t.Errorf("sched1 bound to %s, want %s: shop is loaded", bound, want)
	}
	testenv.Eventually(t, 30*time.Second, func() string {
		evs, err := c.Kube.CoreV1().Events(PorticoNamespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=sched1"})
		if err != nil {
			return err.Error()
		}
		for _, e := range evs.Items {
			if e.Reason == "Scheduled" {
				if !strings.Contains(e.Message, "the most headroom") || !strings.Contains(e.Message, PorticoNamespace+"/shop") {
					return "Scheduled event: " + e.Message
				}
				t.Logf("Event: %s", e.Message)
				return ""
			}
		}
		return "no Scheduled Event on sched1"
	})

	// The load ends; sched1 stays bound where it is.
	stop()
	time.Sleep(5 * time.Second)
	if g := group("sched1"); g != bound {
		t.Errorf("sched1 moved from %s to %s once the load ended", bound, g)
	}
}
