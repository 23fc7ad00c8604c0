package controlplane

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	networkingv1 "k8s.io/api/networking/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/deploy"
	"github.com/portico-edge/portico/test/testenv"
)

func (e *env) createClaim(name string, policy v1alpha1.ReclaimPolicy, ingresses ...string) {
	e.t.Helper()
	refs := []any{}
	for _, i := range ingresses {
		refs = append(refs, map[string]any{"name": i})
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.IngressClaimResource.GroupVersion().String(), "kind": "IngressClaim",
		"metadata": map[string]any{"name": name, "namespace": e.ns},
		"spec": map[string]any{"ingresses": refs, "reclaimPolicy": string(policy),
			"template": map[string]any{"nodeSelector": map[string]any{"portico.io/edge": "true"}, "replicas": int64(3)}},
	}}
	if _, err := e.dyn.Resource(v1alpha1.IngressClaimResource).Namespace(e.ns).Create(e.ctx, u, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create IngressClaim: %v", err)
	}
}

func (e *env) claim(name string) (*v1alpha1.IngressClaim, error) {
	u, err := e.dyn.Resource(v1alpha1.IngressClaimResource).Namespace(e.ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return claimFromUnstructured(u)
}

// TestIntegrationIngressClaim provisions a group for a claim, binds its Ingresses,
// reports the VIP, and applies both reclaim policies.
func TestIntegrationIngressClaim(t *testing.T) {
	e := newEnv(t)
	e.svc(backendSvc("", "web", sport("http", 80)))
	mk := func(name string) {
		ing := ingress(e.ns, name, 0, name+".example", []path{{"/", networkingv1.PathTypePrefix, "web", 80}})
		ing.CreationTimestamp = metav1.Time{}
		e.must(e.cs.NetworkingV1().Ingresses(e.ns).Create(e.ctx, ing, metav1.CreateOptions{}))
	}
	mk("shop")
	mk("blog")
	mk("kept")
	e.createClaim("edge", v1alpha1.ReclaimDelete, "shop", "blog", "not-yet")
	e.createClaim("keep", v1alpha1.ReclaimRetain, "kept")
	pool, _ := ParsePool("203.0.113.0/30")
	e.start(func(c *Config) { c.Pools = []Pool{pool}; c.AgentImage = "example/portico:test" })

	t.Run("provisioned and bound", func(t *testing.T) {
		testenv.Eventually(t, converge, func() string {
			c, err := e.claim("edge")
			if err != nil {
				return err.Error()
			}
			want := v1alpha1.IngressClaimStatus{Phase: v1alpha1.ClaimBound, Group: e.ns + "/edge", VIPs: []string{"203.0.113.1"}, BoundIngresses: []string{"blog", "shop"},
				Replicas: 3, Message: "0/3 replicas ready", ObservedGeneration: c.Generation,
				Conditions: []metav1.Condition{
					{Type: v1alpha1.ClaimConditionBound, Status: metav1.ConditionTrue, Reason: v1alpha1.ClaimReasonBound,
						Message: "2 Ingresses bound to group " + e.ns + "/edge", ObservedGeneration: c.Generation},
					{Type: v1alpha1.ClaimConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ClaimReasonWaitingForReplicas,
						Message: "0/3 replicas ready", ObservedGeneration: c.Generation},
				}}
			if c.Generation == 0 {
				return "claim has no generation"
			}
			for _, cond := range c.Status.Conditions {
				if cond.LastTransitionTime.IsZero() {
					return fmt.Sprintf("condition %s has no lastTransitionTime", cond.Type)
				}
			}
			if d := cmp.Diff(want, c.Status, cmpopts.IgnoreFields(metav1.Condition{}, "LastTransitionTime")); d != "" {
				return "claim status (-want +got):\n" + d
			}
			svc, err := e.cs.CoreV1().Services(e.ns).Get(e.ctx, "edge", metav1.GetOptions{})
			if err != nil {
				return err.Error()
			}
			if !ownedBy(svc, c) || svc.Labels[v1alpha1.LabelGroup] != "true" {
				return fmt.Sprintf("group Service not owned by the claim or not a group: %v %v", svc.OwnerReferences, svc.Labels)
			}
			ds, err := e.cs.AppsV1().DaemonSets(e.ns).Get(e.ctx, "edge", metav1.GetOptions{})
			if err != nil {
				return err.Error()
			}
			// deploy/agent.yaml's DaemonSet with the claim's group, nodes, image,
			// Lease namespace and the leader's pools: the agents run, and schedule
			// on tainted edge nodes, as the installed ones do.
			manifest, err := deploy.AgentDaemonSet()
			if err != nil {
				t.Fatal(err)
			}
			pod, agentPod := ds.Spec.Template.Spec, manifest.Spec.Template.Spec
			flags := agentFlags(pod.Containers[0].Args)
			switch {
			case !ownedBy(ds, c) || ds.Spec.Template.Labels[v1alpha1.LabelClaim] != "edge" || ds.Spec.Template.Labels["app.kubernetes.io/name"] != "":
				return fmt.Sprintf("DaemonSet not the claim's: owners %v, pod labels %v", ds.OwnerReferences, ds.Spec.Template.Labels)
			case pod.NodeSelector["portico.io/edge"] != "true" || pod.Containers[0].Image != "example/portico:test":
				return fmt.Sprintf("DaemonSet not as asked: node selector %v, image %q", pod.NodeSelector, pod.Containers[0].Image)
			case len(pod.Tolerations) == 0 || !cmp.Equal(agentPod.Tolerations, pod.Tolerations) ||
				pod.PriorityClassName == "" || pod.PriorityClassName != agentPod.PriorityClassName ||
				pod.TerminationGracePeriodSeconds == nil || !cmp.Equal(agentPod.TerminationGracePeriodSeconds, pod.TerminationGracePeriodSeconds) ||
				ds.Spec.UpdateStrategy.RollingUpdate == nil || ds.Spec.UpdateStrategy.Type != manifest.Spec.UpdateStrategy.Type ||
				!cmp.Equal(manifest.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable, ds.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable):
				return fmt.Sprintf("DaemonSet not derived from deploy/agent.yaml: tolerations %v, priority class %q, grace period %v, update strategy %+v",
					pod.Tolerations, pod.PriorityClassName, pod.TerminationGracePeriodSeconds, ds.Spec.UpdateStrategy)
			case pod.ServiceAccountName != agentPod.ServiceAccountName || !pod.HostNetwork ||
				!cmp.Equal(agentPod.Containers[0].SecurityContext, pod.Containers[0].SecurityContext) || !cmp.Equal(agentPod.Volumes, pod.Volumes) ||
				flags["group"] != e.ns+"/edge" || flags["iface"] != "eth0" || flags["node-name"] != "$(NODE_NAME)" ||
				flags["pod-namespace"] != e.ns || flags["vip-pool"] != "203.0.113.0/30":
				return fmt.Sprintf("agent pod cannot run as the claim's: sa %q, flags %v, volumes %+v", pod.ServiceAccountName, flags, pod.Volumes)
			}
			for _, n := range []string{"shop", "blog"} {
				ing, err := e.cs.NetworkingV1().Ingresses(e.ns).Get(e.ctx, n, metav1.GetOptions{})
				if err != nil {
					return err.Error()
				}
				if ing.Annotations[v1alpha1.AnnotationGroup] != e.ns+"/edge" {
					return n + " not bound"
				}
				if d := cmp.Diff([]networkingv1.IngressLoadBalancerIngress{{IP: "203.0.113.1"}}, ing.Status.LoadBalancer.Ingress); d != "" {
					return n + " status: " + d
				}
			}
			return ""
		})
	})
	t.Run("ready replicas from the group's EndpointSlices", func(t *testing.T) {
		readiness := func(ready int32, message string) func() string {
			return func() string {
				c, err := e.claim("edge")
				if err != nil {
					return err.Error()
				}
				if c.Status.ReadyReplicas != ready || c.Status.Replicas != 3 || c.Status.Message != message || c.Status.Phase != v1alpha1.ClaimBound {
					return fmt.Sprintf("status %+v, want Bound, %d/3 ready, message %q", c.Status, ready, message)
				}
				return ""
			}
		}
		e.slice(slice("", "edge", "edge-1", "http", 80, ep{addr: "10.9.0.1", ready: true}, ep{addr: "10.9.0.2", ready: false}))
		testenv.Eventually(t, converge, readiness(1, "1/3 replicas ready"))
		testenv.Eventually(t, converge, func() string {
			if !hasEvent(e, "edge", "Provisioned") {
				return "no Provisioned event on the claim"
			}
			return ""
		})
		before, err := e.claim("edge")
		if err != nil {
			t.Fatal(err)
		}
		// As many ready agents as the template asks for: nothing left to wait for.
		e.slice(slice("", "edge", "edge-2", "http", 80, ep{addr: "10.9.0.3", ready: true}, ep{addr: "10.9.0.4", ready: true}))
		testenv.Eventually(t, converge, readiness(3, ""))
		// kubectl wait --for=condition=Ready now returns; Bound did not change,
		// so its transition time stays.
		after, err := e.claim("edge")
		if err != nil {
			t.Fatal(err)
		}
		ready := apimeta.FindStatusCondition(after.Status.Conditions, v1alpha1.ClaimConditionReady)
		bound0 := apimeta.FindStatusCondition(before.Status.Conditions, v1alpha1.ClaimConditionBound)
		bound1 := apimeta.FindStatusCondition(after.Status.Conditions, v1alpha1.ClaimConditionBound)
		if ready == nil || ready.Status != metav1.ConditionTrue || ready.Reason != v1alpha1.ClaimReasonBound {
			t.Errorf("Ready condition with every replica ready: %+v", ready)
		}
		if bound0 == nil || bound1 == nil || !bound0.LastTransitionTime.Equal(&bound1.LastTransitionTime) {
			t.Errorf("Bound's lastTransitionTime moved though Bound stayed True: %+v then %+v", bound0, bound1)
		}
	})
	t.Run("reclaim Delete", func(t *testing.T) {
		for _, n := range []string{"shop", "blog"} {
			if err := e.cs.NetworkingV1().Ingresses(e.ns).Delete(e.ctx, n, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		testenv.Eventually(t, converge, func() string {
			if _, err := e.claim("edge"); err == nil {
				return "claim still exists"
			}
			if _, err := e.cs.CoreV1().Services(e.ns).Get(e.ctx, "edge", metav1.GetOptions{}); err == nil {
				return "group Service still exists"
			}
			if _, err := e.cs.AppsV1().DaemonSets(e.ns).Get(e.ctx, "edge", metav1.GetOptions{}); err == nil {
				return "DaemonSet still exists"
			}
			return ""
		})
	})
	t.Run("reclaim Retain", func(t *testing.T) {
		testenv.Eventually(t, converge, func() string {
			if c, err := e.claim("keep"); err != nil || c.Status.Phase != v1alpha1.ClaimBound {
				return fmt.Sprintf("keep not bound yet: %v", err)
			}
			return ""
		})
		if err := e.cs.NetworkingV1().Ingresses(e.ns).Delete(e.ctx, "kept", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, converge, func() string {
			c, err := e.claim("keep")
			if err != nil {
				return err.Error()
			}
			if c.Status.Phase != v1alpha1.ClaimReleased || len(c.Status.BoundIngresses) != 0 {
				return fmt.Sprintf("status %+v, want Released with no Ingresses", c.Status)
			}
			if b := apimeta.FindStatusCondition(c.Status.Conditions, v1alpha1.ClaimConditionBound); b == nil || b.Status != metav1.ConditionFalse || b.Reason != v1alpha1.ClaimReasonReleased {
				return fmt.Sprintf("Bound condition %+v, want False, reason Released", b)
			}
			if _, err := e.cs.CoreV1().Services(e.ns).Get(e.ctx, "keep", metav1.GetOptions{}); err != nil {
				return "retained Service: " + err.Error()
			}
			if _, err := e.cs.AppsV1().DaemonSets(e.ns).Get(e.ctx, "keep", metav1.GetOptions{}); err != nil {
				return "retained DaemonSet: " + err.Error()
			}
			return ""
		})
	})
}
