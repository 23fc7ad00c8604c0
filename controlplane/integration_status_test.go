package controlplane

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/api/agentstatus"
	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/testenv"
)

// TestIntegrationLeaderFailover runs two controllers on one Lease: only the leader
// writes; when it is killed (Lease not released), the other takes over the writes.
func TestIntegrationLeaderFailover(t *testing.T) {
	e := newEnv(t)
	pool, _ := ParsePool("192.0.2.0/28")
	cfg := func(id string) func(*Config) {
		return func(c *Config) { c.Pools = []Pool{pool}; c.Identity = id; c.ReleaseOnCancel = false }
	}
	a := e.start(cfg("a"))
	b := e.start(cfg("b"))
	var leader, follower *running
	testenv.Eventually(t, converge, func() string {
		switch {
		case a.ctl.IsLeader() && !b.ctl.IsLeader():
			leader, follower = a, b
		case b.ctl.IsLeader() && !a.ctl.IsLeader():
			leader, follower = b, a
		default:
			return fmt.Sprintf("leaders: a=%v b=%v", a.ctl.IsLeader(), b.ctl.IsLeader())
		}
		return ""
	})
	e.svc(groupSvc("", "g1", 0))
	testenv.Eventually(t, converge, func() string {
		if v := annotations(t, e, "Service", "g1")[v1alpha1.AnnotationVIP]; v != "192.0.2.1" {
			return "g1 VIP " + v
		}
		return ""
	})
	// Both read: the follower's sink has the allocated VIP too.
	waitSnapshot(t, follower, func() model.Snapshot {
		return model.Snapshot{Groups: []model.Group{{Name: e.ns + "/g1", VIPs: addrs("192.0.2.1"), VRID: 1,
			Ports: []model.Port{{Protocol: model.TCP, Port: 80}, {Protocol: model.TCP, Port: 443}}, HTTPPort: 80, HTTPSPort: 443}}}
	})

	// A write is counted once its request returns, which can be after the informers
	// have shown the annotation: the leader's count is waited for.
	testenv.Eventually(t, converge, func() string {
		if n := leader.metric(t, "portico_controlplane_writes_total", map[string]string{"write": "annotate-service", "result": "ok"}); n < 2 {
			return fmt.Sprintf("the leader made %v annotation writes, want VRID and VIP", n)
		}
		return ""
	})
	if n := follower.metric(t, "portico_controlplane_writes_total", nil); n > 0 {
		t.Errorf("the follower made %v writes", n)
	}
	leader.stop()
	killed := time.Now()
	e.svc(groupSvc("", "g2", 0))
	testenv.Eventually(t, converge, func() string {
		if !follower.ctl.IsLeader() {
			return "follower has not taken over"
		}
		if v := annotations(t, e, "Service", "g2")[v1alpha1.AnnotationVIP]; v != "192.0.2.2" {
			return "g2 VIP " + v
		}
		return ""
	})
	took := time.Since(killed)
	t.Logf("takeover and first write %v after the leader was killed (lease 2s)", took)
	if took < time.Second {
		t.Errorf("takeover after %v: the killed leader's Lease was released or not respected", took)
	}
}

// TestIntegrationIngressAddressWaitsForEdges: an Ingress's first address waits
// until every edge of its group with a ready replica reports serving its generation (in the
// agents' status Leases); an edge that never does holds it back only for
// ServeTimeout, after which the address is written with a Warning Event.
func TestIntegrationIngressAddressWaitsForEdges(t *testing.T) {
	e := newEnv(t)
	ns, cs := e.ns, e.cs
	e.svc(groupSvc("", "g1", 0, v1alpha1.AnnotationVIP, "192.0.2.10", v1alpha1.AnnotationVRID, "7"))
	e.slice(slice("", "g1", "g1-a", "http", 80, ep{addr: "10.1.0.1", node: "n1", ready: true}, ep{addr: "10.1.0.2", node: "n2", ready: true},
		ep{addr: "10.1.0.3", node: "n3"}))
	e.svc(backendSvc("", "web", sport("http", 80)))
	e.slice(slice("", "web", "web-1", "http", 8080, ep{addr: "10.2.0.1", ready: true}))
	report := func(node string, served map[string]int64) {
		t.Helper()
		b, err := json.Marshal(map[string]any{"node": node, "group": ns + "/g1", "served": served})
		if err != nil {
			t.Fatal(err)
		}
		now, secs := metav1.NewMicroTime(time.Now()), int32(60)
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "portico-agent-" + node, Namespace: ns,
			Labels: map[string]string{agentstatus.LabelAgent: "true"}, Annotations: map[string]string{agentstatus.AnnotationState: string(b)}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &node, RenewTime: &now, LeaseDurationSeconds: &secs}}
		old, err := cs.CoordinationV1().Leases(ns).Get(e.ctx, l.Name, metav1.GetOptions{})
		if err == nil {
			l.ResourceVersion = old.ResourceVersion
			e.must(cs.CoordinationV1().Leases(ns).Update(e.ctx, l, metav1.UpdateOptions{}))
			return
		}
		e.must(cs.CoordinationV1().Leases(ns).Create(e.ctx, l, metav1.CreateOptions{}))
	}
	address := func(name string) string {
		got, err := cs.NetworkingV1().Ingresses(ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if len(got.Status.LoadBalancer.Ingress) == 0 {
			return ""
		}
		return got.Status.LoadBalancer.Ingress[0].IP
	}
	report("n1", nil)
	report("n2", nil)
	report("n3", nil) // not ready: not waited for
	e.start(func(c *Config) { c.ServeTimeout = 4 * time.Second })

	created := time.Now()
	ing := ingress(ns, "a", 0, "a.example", []path{{"/", networkingv1.PathTypePrefix, "web", 80}}, v1alpha1.AnnotationGroup, "g1")
	ing.CreationTimestamp = metav1.Time{}
	got, err := cs.NetworkingV1().Ingresses(ns).Create(e.ctx, ing, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gen := got.Generation
	time.Sleep(1500 * time.Millisecond)
	if a := address("a"); a != "" {
		t.Fatalf("address %s written before any edge served the Ingress", a)
	}
	report("n1", map[string]int64{ns + "/a": gen})
	time.Sleep(1500 * time.Millisecond)
	if a := address("a"); a != "" {
		t.Fatalf("address %s written while edge n2 did not serve the Ingress", a)
	}
	served := time.Now()
	report("n2", map[string]int64{ns + "/a": gen})
	testenv.Eventually(t, converge, func() string {
		if a := address("a"); a != "192.0.2.10" {
			return fmt.Sprintf("address %q, want 192.0.2.10", a)
		}
		return ""
	})
	t.Logf("address written %v after the last edge reported serving the Ingress (%v after its creation)",
		time.Since(served).Round(time.Millisecond), time.Since(created).Round(time.Millisecond))
	if since := time.Since(served); since > 3*time.Second {
		t.Errorf("address written %v after every edge served the Ingress, want well within the 4s bound", since)
	}

	// An edge that never serves it: the bound, then the address and an Event.
	ing = ingress(ns, "b", 0, "b.example", []path{{"/", networkingv1.PathTypePrefix, "web", 80}}, v1alpha1.AnnotationGroup, "g1")
	ing.CreationTimestamp = metav1.Time{}
	created = time.Now()
	e.must(cs.NetworkingV1().Ingresses(ns).Create(e.ctx, ing, metav1.CreateOptions{}))
	testenv.Eventually(t, converge, func() string {
		if a := address("b"); a != "192.0.2.10" {
			return fmt.Sprintf("address %q, want 192.0.2.10", a)
		}
		return ""
	})
	took := time.Since(created)
	t.Logf("address of an Ingress no edge serves written after %v (bound 4s)", took.Round(time.Millisecond))
	if took < 3500*time.Millisecond {
		t.Errorf("address written after %v, before the 4s bound", took)
	}
	testenv.Eventually(t, converge, func() string {
		evs, err := cs.CoreV1().Events(ns).List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=b,reason=EdgesNotServing"})
		if err != nil {
			return err.Error()
		}
		if len(evs.Items) == 0 || !strings.Contains(evs.Items[0].Message, "n1, n2") {
			return fmt.Sprintf("no EdgesNotServing Event naming n1, n2: %+v", evs.Items)
		}
		return ""
	})
}
