package controlplane

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/testenv"
)

// TestIntegrationScheduling spreads selector Ingresses over three groups, fewest
// bound first (ties by name), keeps bindings sticky, and writes each Ingress's status.
func TestIntegrationScheduling(t *testing.T) {
	e := newEnv(t)
	for i, n := range []string{"g-a", "g-b", "g-c"} {
		s := groupSvc("", n, 0, v1alpha1.AnnotationVIP, fmt.Sprintf("192.0.2.%d", 10+i))
		s.Labels["tier"] = "edge"
		e.svc(s)
	}
	other := groupSvc("", "g-other", 0, v1alpha1.AnnotationVIP, "192.0.2.99")
	other.Labels["tier"] = "internal"
	e.svc(other)
	e.svc(backendSvc("", "web", sport("http", 80)))
	mk := func(name string, kv ...string) {
		ing := ingress(e.ns, name, 0, name+".example", []path{{"/", networkingv1.PathTypePrefix, "web", 80}}, kv...)
		ing.CreationTimestamp = metav1.Time{}
		e.must(e.cs.NetworkingV1().Ingresses(e.ns).Create(e.ctx, ing, metav1.CreateOptions{}))
	}
	mk("i0", v1alpha1.AnnotationGroup, "g-b")
	for i := 1; i <= 5; i++ {
		mk(fmt.Sprintf("i%d", i), v1alpha1.AnnotationGroupSelector, "tier=edge")
		time.Sleep(10 * time.Millisecond)
	}
	// An Ingress of another controller is left alone.
	mk("foreign")
	r := e.start(nil)

	// Counts start a0 b1 c0: i1->a, i2->c, i3->a (all 1, by name), i4->b, i5->c.
	want := map[string]string{"i0": "g-b", "i1": "g-a", "i2": "g-c", "i3": "g-a", "i4": "g-b", "i5": "g-c"}
	testenv.Eventually(t, converge, func() string {
		got := map[string]string{}
		for n := range want {
			got[n] = strings.TrimPrefix(annotations(t, e, "Ingress", n)[v1alpha1.AnnotationGroup], e.ns+"/")
		}
		return cmp.Diff(want, got)
	})
	vip := map[string]string{"g-a": "192.0.2.10", "g-b": "192.0.2.11", "g-c": "192.0.2.12"}
	testenv.Eventually(t, converge, func() string {
		for n, g := range want {
			ing, err := e.cs.NetworkingV1().Ingresses(e.ns).Get(e.ctx, n, metav1.GetOptions{})
			if err != nil {
				return err.Error()
			}
			if d := cmp.Diff([]networkingv1.IngressLoadBalancerIngress{{IP: vip[g]}}, ing.Status.LoadBalancer.Ingress); d != "" {
				return n + " status: " + d
			}
		}
		if !hasEvent(e, "i3", "Scheduled") {
			return "no Scheduled event on i3"
		}
		return ""
	})
	if a := annotations(t, e, "Ingress", "foreign"); a[v1alpha1.AnnotationGroup] != "" {
		t.Errorf("foreign Ingress was bound: %v", a)
	}

	t.Run("sticky", func(t *testing.T) {
		// g-a stops matching: its Ingresses stay; a new one goes elsewhere.
		s, err := e.cs.CoreV1().Services(e.ns).Get(e.ctx, "g-a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Labels["tier"] = "retired"
		e.must(e.cs.CoreV1().Services(e.ns).Update(e.ctx, s, metav1.UpdateOptions{}))
		// The Service and Ingress informers are separate watches: without this wait
		// the controller may see i6 before the relabel and bind it to g-a, rightly.
		testenv.Eventually(t, converge, func() string {
			obj, ok, err := r.ctl.services.GetByKey(e.ns + "/g-a")
			if err != nil || !ok {
				return fmt.Sprintf("g-a not cached: %v", err)
			}
			if l := obj.(*corev1.Service).Labels["tier"]; l != "retired" {
				return "controller's cache still has tier=" + l
			}
			return ""
		})
		mk("i6", v1alpha1.AnnotationGroupSelector, "tier=edge")
		testenv.Eventually(t, converge, func() string {
			if g := annotations(t, e, "Ingress", "i6")[v1alpha1.AnnotationGroup]; g != e.ns+"/g-b" {
				return fmt.Sprintf("i6 bound to %q, want g-b (b2 c2 tie by name)", g)
			}
			return ""
		})
		for _, n := range []string{"i1", "i3"} {
			if g := annotations(t, e, "Ingress", n)[v1alpha1.AnnotationGroup]; g != e.ns+"/g-a" {
				t.Errorf("%s moved to %q", n, g)
			}
		}
	})
	t.Run("unbound: status removed", func(t *testing.T) {
		if err := e.cs.CoreV1().Services(e.ns).Delete(e.ctx, "g-c", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, converge, func() string {
			ing, err := e.cs.NetworkingV1().Ingresses(e.ns).Get(e.ctx, "i2", metav1.GetOptions{})
			if err != nil {
				return err.Error()
			}
			if len(ing.Status.LoadBalancer.Ingress) != 0 {
				return fmt.Sprintf("i2 status still %v", ing.Status.LoadBalancer.Ingress)
			}
			if ing.Annotations[v1alpha1.AnnotationGroup] != e.ns+"/g-c" {
				return "i2 was rebound silently"
			}
			if !hasEvent(e, "i2", string(model.ReasonGroupNotFound)) {
				return "no GroupNotFound event on i2"
			}
			return ""
		})
	})
}
