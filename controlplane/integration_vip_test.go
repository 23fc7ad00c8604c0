package controlplane

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/testenv"
)

// TestIntegrationVIPAllocation allocates from a small pool until it runs out, keeps a
// manual VIP, reports a conflicting one, and writes a LoadBalancer group's status.
func TestIntegrationVIPAllocation(t *testing.T) {
	e := newEnv(t)
	// Created in name order; ties in creation time are decided by name.
	e.svc(groupSvc("", "a-manual", 0, v1alpha1.AnnotationVIP, "198.51.100.3"))
	lb := groupSvc("", "b-lb", 0)
	lb.Spec.Type = corev1.ServiceTypeLoadBalancer
	lb.Spec.LoadBalancerClass = ptr(v1alpha1.LoadBalancerClass)
	e.svc(lb)
	e.svc(groupSvc("", "c-auto", 0))
	e.svc(groupSvc("", "d-auto", 0))
	e.svc(groupSvc("", "e-exhausted", 0))
	pool, err := ParsePool("198.51.100.0/29!198.51.100.1,198.51.100.2/32")
	if err != nil {
		t.Fatal(err)
	}
	r := e.start(func(c *Config) { c.Pools = []Pool{pool} })

	want := map[string]string{"a-manual": "198.51.100.3", "b-lb": "198.51.100.4", "c-auto": "198.51.100.5", "d-auto": "198.51.100.6"}
	testenv.Eventually(t, converge, func() string {
		got := map[string]string{}
		for _, n := range []string{"a-manual", "b-lb", "c-auto", "d-auto", "e-exhausted"} {
			if v, ok := annotations(t, e, "Service", n)[v1alpha1.AnnotationVIP]; ok {
				got[n] = v
			}
		}
		return cmp.Diff(want, got)
	})
	testenv.Eventually(t, converge, func() string {
		if !hasEvent(e, "e-exhausted", string(model.ReasonVIPPoolExhausted)) {
			return "no VIPPoolExhausted event on e-exhausted"
		}
		if !hasEvent(e, "c-auto", "VIPAllocated") {
			return "no VIPAllocated event on c-auto"
		}
		return ""
	})
	t.Run("LoadBalancer status", func(t *testing.T) {
		testenv.Eventually(t, converge, func() string {
			s, err := e.cs.CoreV1().Services(e.ns).Get(e.ctx, "b-lb", metav1.GetOptions{})
			if err != nil {
				return err.Error()
			}
			return cmp.Diff([]corev1.LoadBalancerIngress{{IP: "198.51.100.4", IPMode: ptr(corev1.LoadBalancerIPModeProxy)}}, s.Status.LoadBalancer.Ingress)
		})
	})
	t.Run("VRIDs allocated, unique", func(t *testing.T) {
		testenv.Eventually(t, converge, func() string {
			snap, _ := r.sink.latest()
			var ids []uint8
			for _, g := range snap.Groups {
				ids = append(ids, g.VRID)
			}
			return cmp.Diff([]uint8{1, 2, 3, 4, 5}, ids)
		})
	})
	t.Run("conflicting manual VIP is reported, not applied", func(t *testing.T) {
		e.svc(groupSvc("", "f-conflict", 0, v1alpha1.AnnotationVIP, "198.51.100.4"))
		testenv.Eventually(t, converge, func() string {
			snap, _ := r.sink.latest()
			for _, g := range snap.Groups {
				if g.Name == e.ns+"/f-conflict" {
					if len(g.VIPs) != 0 {
						return fmt.Sprintf("f-conflict has VIPs %v", g.VIPs)
					}
					if !hasEvent(e, "f-conflict", string(model.ReasonVIPConflict)) {
						return "no VIPConflict event"
					}
					return ""
				}
			}
			return "f-conflict not in the snapshot"
		})
		snap, _ := r.sink.latest()
		for _, g := range snap.Groups {
			if g.Name == e.ns+"/b-lb" && !slices.Equal(g.VIPs, addrs("198.51.100.4")) {
				t.Errorf("b-lb lost its VIP: %v", g.VIPs)
			}
		}
	})
}

// TestIntegrationVIPPools: VIPPools are read live, with no restart: a tenant's
// L4 Service that no pool allows gets no VIP and a VIPNotInPool Event; once the
// operator's pool selects its namespace (a label on the Namespace), the leader
// allocates it an address of that pool; a second, manual pool is never allocated
// from. The real API server validates the pool's addresses (the CRD's CEL rule).
func TestIntegrationVIPPools(t *testing.T) {
	e := newEnv(t)
	lb := func(name string) *corev1.Service {
		s := backendSvc("", name, sport("dns", 53))
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.LoadBalancerClass = ptr(v1alpha1.LoadBalancerClass)
		return s
	}
	selected := &v1alpha1.ServiceAllocation{NamespaceSelectors: []metav1.LabelSelector{{MatchLabels: map[string]string{"vip-pool": e.ns}}}}
	e.pool(vipPool(e.ns+"-a-manual", false, selected, "192.0.2.0/29"))
	e.pool(vipPool(e.ns+"-b-auto", true, selected, "203.0.113.8/29"))
	e.svc(lb("dns"))
	e.start(func(c *Config) { c.GroupNamespaces = []string{"portico-system"} })

	testenv.Eventually(t, converge, func() string {
		if !hasEvent(e, "dns", string(model.ReasonVIPNotInPool)) {
			return "no VIPNotInPool event on dns"
		}
		return ""
	})
	if v, ok := annotations(t, e, "Service", "dns")[v1alpha1.AnnotationVIP]; ok {
		t.Fatalf("dns got VIP %q with no pool that allows it", v)
	}

	ns, err := e.cs.CoreV1().Namespaces().Get(e.ctx, e.ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ns.Labels == nil {
		ns.Labels = map[string]string{}
	}
	ns.Labels["vip-pool"] = e.ns
	e.must(e.cs.CoreV1().Namespaces().Update(e.ctx, ns, metav1.UpdateOptions{}))
	testenv.Eventually(t, converge, func() string {
		if v := annotations(t, e, "Service", "dns")[v1alpha1.AnnotationVIP]; v != "203.0.113.9" {
			return fmt.Sprintf("dns has VIP %q, want 203.0.113.9 (the auto pool's first)", v)
		}
		return ""
	})

	bad := vipPool(e.ns+"-c-bad", true, nil, "203.0.113.300/32")
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(bad)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: obj}
	u.SetAPIVersion(v1alpha1.GroupVersion.String())
	u.SetKind("VIPPool")
	if _, err := e.dyn.Resource(v1alpha1.VIPPoolResource).Create(e.ctx, u, metav1.CreateOptions{}); err == nil {
		_ = e.dyn.Resource(v1alpha1.VIPPoolResource).Delete(e.ctx, bad.Name, metav1.DeleteOptions{})
		t.Errorf("the API server accepted a VIPPool with address 203.0.113.300/32")
	} else if !strings.Contains(err.Error(), "each address must be a prefix") {
		t.Errorf("creating a VIPPool with address 203.0.113.300/32: %v, want the CRD's validation message", err)
	}
}
