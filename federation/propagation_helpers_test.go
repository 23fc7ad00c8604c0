package federation

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/retry"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/portico-edge/portico/api/sites"
	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/test/testenv"
)

func toUnstructured(t *testing.T, fi *v1alpha1.FederatedIngress) *unstructured.Unstructured {
	t.Helper()
	fi.APIVersion, fi.Kind = v1alpha1.FederatedIngressResource.GroupVersion().String(), "FederatedIngress"
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(fi)
	if err != nil {
		t.Fatal(err)
	}
	delete(m, "status")
	return &unstructured.Unstructured{Object: m}
}

// memberIngress is the member's Ingress web/name, nil when it has none.
func memberIngress(ctx context.Context, c *cluster, name string) *networkingv1.Ingress {
	ing, err := c.client.NetworkingV1().Ingresses("web").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return ing
}

// waitMembers waits until ok holds for every named member's Ingress and prints how long
// that took.
func waitMembers(t *testing.T, ctx context.Context, cs map[string]*cluster, what, name string, ok func(*networkingv1.Ingress) bool, members ...string) {
	t.Helper()
	start := time.Now()
	if _, err := testenv.Poll(ctx, 30*time.Second, 20*time.Millisecond, func() bool {
		for _, m := range members {
			if !ok(memberIngress(ctx, cs[m], name)) {
				return false
			}
		}
		return true
	}); err != nil {
		for _, m := range members {
			t.Logf("%s: %+v", m, memberIngress(ctx, cs[m], name))
		}
		t.Fatalf("%s: not on %v after 30 s", what, members)
	}
	t.Logf("%s: on %v after %v", what, members, time.Since(start).Round(time.Millisecond))
}

func atGeneration(gen int64) func(*networkingv1.Ingress) bool {
	return func(ing *networkingv1.Ingress) bool {
		return ing != nil && ing.Annotations[v1alpha1.AnnotationFederationGeneration] == fmt.Sprint(gen)
	}
}

func getFI(t *testing.T, ctx context.Context, host *cluster, name string) *v1alpha1.FederatedIngress {
	t.Helper()
	u, err := host.dyn.Resource(v1alpha1.FederatedIngressResource).Namespace("web").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fi := &v1alpha1.FederatedIngress{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, fi); err != nil {
		t.Fatal(err)
	}
	return fi
}

func waitStatus(t *testing.T, ctx context.Context, host *cluster, name, what string, ok func(*v1alpha1.FederatedIngress) bool) *v1alpha1.FederatedIngress {
	t.Helper()
	var fi *v1alpha1.FederatedIngress
	start := time.Now()
	if _, err := testenv.Poll(ctx, 30*time.Second, 50*time.Millisecond, func() bool {
		fi = getFI(t, ctx, host, name)
		return ok(fi)
	}); err != nil {
		js, _ := json.MarshalIndent(fi.Status, "", "  ")
		t.Fatalf("status: %s not reached after 30 s; status:\n%s", what, js)
	}
	t.Logf("status: %s after %v", what, time.Since(start).Round(time.Millisecond))
	return fi
}

func site(fi *v1alpha1.FederatedIngress, cluster string) *v1alpha1.SiteStatus {
	for i := range fi.Status.Sites {
		if fi.Status.Sites[i].Cluster == cluster {
			return &fi.Status.Sites[i]
		}
	}
	return nil
}

// updateFI changes the FederatedIngress as a user would, again on a conflict with
// the controller's status writes.
func updateFI(t *testing.T, ctx context.Context, host *cluster, name string, change func(*v1alpha1.FederatedIngress)) int64 {
	t.Helper()
	var gen int64
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		fi := getFI(t, ctx, host, name)
		change(fi)
		out, err := host.dyn.Resource(v1alpha1.FederatedIngressResource).Namespace("web").Update(ctx, toUnstructured(t, fi), metav1.UpdateOptions{})
		if err == nil {
			gen = out.GetGeneration()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return gen
}

// waitEvent waits for a Warning Event with reason on ns/name in the host.
func waitEvent(t *testing.T, ctx context.Context, host *cluster, ns, name, reason string) {
	t.Helper()
	if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() bool {
		list, err := host.client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, e := range list.Items {
			if e.InvolvedObject.Name == name && e.Reason == reason && e.Type == corev1.EventTypeWarning {
				return true
			}
		}
		return false
	}); err != nil {
		t.Fatalf("no Warning Event %s on %s/%s", reason, ns, name)
	}
}

// waitPeers waits until the member's PeersConfigMap satisfies ok, and returns it.
func waitPeers(t *testing.T, ctx context.Context, c *cluster, what string, ok func(sites.File) bool) sites.File {
	t.Helper()
	var f sites.File
	var last string
	if _, err := testenv.Poll(ctx, 30*time.Second, 50*time.Millisecond, func() bool {
		cm, err := c.client.CoreV1().ConfigMaps("portico-system").Get(ctx, PeersConfigMap, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false
		}
		last = cm.Data[PeersKey]
		f = sites.File{}
		return sigsyaml.UnmarshalStrict([]byte(last), &f) == nil && ok(f)
	}); err != nil {
		t.Fatalf("%s: peers never did; last: %s", what, last)
	}
	return f
}

// condition is fi's condition typ as "status reason message", "" when it has
// none or it is for another generation than fi's.
func condition(fi *v1alpha1.FederatedIngress, typ string) string {
	c := apimeta.FindStatusCondition(fi.Status.Conditions, typ)
	if c == nil || c.ObservedGeneration != fi.Generation || c.LastTransitionTime.IsZero() {
		return ""
	}
	return fmt.Sprintf("%s %s %s", c.Status, c.Reason, c.Message)
}
