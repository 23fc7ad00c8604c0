package controlplane

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
)

// fakeController is a Controller on a fake clientset whose Events land in a
// FakeRecorder.
func fakeController(t *testing.T, objs ...corev1.Service) (*Controller, *record.FakeRecorder) {
	t.Helper()
	cs := fake.NewSimpleClientset()
	for i := range objs {
		if _, err := cs.CoreV1().Services(objs[i].Namespace).Create(context.Background(), &objs[i], metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	c, err := New(Config{Client: cs, Logger: zaptest.NewLogger(t), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	rec := record.NewFakeRecorder(10)
	c.recorder = rec
	return c, rec
}

func drain(rec *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// TestAnnotateGone: a decision about an object deleted since the cache saw it is
// neither an error nor an Event.
func TestAnnotateGone(t *testing.T) {
	c, rec := fakeController(t, corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "here"}})
	ctx := context.Background()

	applied, err := c.annotate(ctx, "Service", "ns/gone", v1alpha1.AnnotationVIP, "192.0.2.1", "VIPAllocated", "VIP 192.0.2.1 from the pools")
	if err != nil || applied {
		t.Fatalf("annotate a deleted Service: applied %v, err %v; want false, nil", applied, err)
	}
	if ev := drain(rec); len(ev) != 0 {
		t.Fatalf("Events for a deleted Service: %q", ev)
	}
	if len(c.written) != 0 {
		t.Fatalf("a write that did not apply is remembered: %v", c.written)
	}

	applied, err = c.annotate(ctx, "Service", "ns/here", v1alpha1.AnnotationVIP, "192.0.2.1", "VIPAllocated", "VIP 192.0.2.1 from the pools")
	if err != nil || !applied {
		t.Fatalf("annotate an existing Service: applied %v, err %v; want true, nil", applied, err)
	}
	if ev := drain(rec); len(ev) != 1 || ev[0] != "Normal VIPAllocated VIP 192.0.2.1 from the pools" {
		t.Fatalf("Events: %q, want one VIPAllocated", ev)
	}
	svc, err := c.cfg.Client.CoreV1().Services("ns").Get(ctx, "here", metav1.GetOptions{})
	if err != nil || svc.Annotations[v1alpha1.AnnotationVIP] != "192.0.2.1" {
		t.Fatalf("annotation not written: %v %v", svc, err)
	}
}

// TestWithWrittenCopies: the overlay of this leader's writes shows on copies of
// Services and Ingresses; the cached objects and slices stay as they were.
func TestWithWrittenCopies(t *testing.T) {
	c, _ := fakeController(t)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "g"}}
	other := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "h"}}
	ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "i", Annotations: map[string]string{"x": "y"}}}
	st := State{Services: []*corev1.Service{svc, other}, Ingresses: []*networkingv1.Ingress{ing}}
	c.written[writtenKey{"Service", "ns/g", v1alpha1.AnnotationVIP}] = written{"192.0.2.1", time.Now()}
	c.written[writtenKey{"Ingress", "ns/i", v1alpha1.AnnotationGroup}] = written{"ns/g", time.Now()}

	out := c.withWritten(st)
	if got := out.Services[0].Annotations[v1alpha1.AnnotationVIP]; got != "192.0.2.1" {
		t.Errorf("Service overlay: %q", got)
	}
	if out.Services[1] != other {
		t.Errorf("untouched Service copied")
	}
	if got := out.Ingresses[0].Annotations; got[v1alpha1.AnnotationGroup] != "ns/g" || got["x"] != "y" {
		t.Errorf("Ingress overlay: %v", got)
	}
	if svc.Annotations != nil || len(ing.Annotations) != 1 || st.Services[0] != svc || st.Ingresses[0] != ing {
		t.Errorf("cached objects changed: %v %v", svc.Annotations, ing.Annotations)
	}
}

// TestWithWrittenEndsOnceCached: an overlay entry ends as soon as the cache shows the
// annotation, even with another value (a change made after this leader's write).
func TestWithWrittenEndsOnceCached(t *testing.T) {
	c, _ := fakeController(t)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "g",
		Annotations: map[string]string{v1alpha1.AnnotationVIP: "192.0.2.9"}}}
	c.written[writtenKey{"Service", "ns/g", v1alpha1.AnnotationVIP}] = written{"192.0.2.1", time.Now()}

	out := c.withWritten(State{Services: []*corev1.Service{svc}})
	if out.Services[0] != svc {
		t.Errorf("Service with the annotation cached was overlaid: %v", out.Services[0].Annotations)
	}
	if len(c.written) != 0 {
		t.Errorf("overlay entry kept after the cache showed the annotation: %v", c.written)
	}
}

// TestWithWrittenExpires: an entry older than writtenTTL ends even when its object
// is gone from the cache (deleted since the write), so the overlay stops walking
// every object on each sync.
func TestWithWrittenExpires(t *testing.T) {
	c, _ := fakeController(t)
	c.written[writtenKey{"Service", "ns/gone", v1alpha1.AnnotationVIP}] = written{"192.0.2.1", time.Now().Add(-writtenTTL - time.Second)}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "g"}}
	st := State{Services: []*corev1.Service{svc}}
	out := c.withWritten(st)
	if len(c.written) != 0 {
		t.Errorf("expired entry of a deleted object kept: %v", c.written)
	}
	if &out.Services[0] != &st.Services[0] {
		t.Errorf("slice copied with nothing to overlay")
	}
}

// TestAllocationProblems: allocation problems show in Problems() and the metric on
// every instance, and the leader sends each as one Warning Event while it lasts.
func TestAllocationProblems(t *testing.T) {
	c, rec := fakeController(t)
	pool, err := ParsePool("192.0.2.1/32")
	if err != nil {
		t.Fatal(err)
	}
	c.cfg.Pools = []Pool{pool}
	// a holds the pool's only address; b asks for one.
	for name, anns := range map[string]map[string]string{
		"a": {v1alpha1.AnnotationVIP: "192.0.2.1", v1alpha1.AnnotationVRID: "7"},
		"b": {v1alpha1.AnnotationVRID: "8"},
	} {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name,
			Labels: map[string]string{v1alpha1.LabelGroup: "true"}, Annotations: anns}}
		if err := c.services.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	exhausted := func() bool {
		return slices.ContainsFunc(c.Problems(), func(p model.Problem) bool {
			return p.Reason == model.ReasonVIPPoolExhausted && p.Object == "Service ns/b"
		})
	}
	ctx := context.Background()
	if err := c.sync(ctx); err != nil {
		t.Fatal(err)
	}
	if !exhausted() {
		t.Fatalf("follower: no VIPPoolExhausted for ns/b in Problems() %v", c.Problems())
	}
	if n := testutil.ToFloat64(c.metrics.problems.WithLabelValues(string(model.ReasonVIPPoolExhausted))); n != 1 {
		t.Errorf("follower: problems metric %v, want 1", n)
	}
	if ev := drain(rec); len(ev) != 0 {
		t.Errorf("follower sent Events: %q", ev)
	}

	c.leader.Store(true)
	for range 3 {
		if err := c.sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !exhausted() {
		t.Fatalf("leader: no VIPPoolExhausted in Problems() %v", c.Problems())
	}
	var warnings []string
	for _, e := range drain(rec) {
		if strings.HasPrefix(e, "Warning "+string(model.ReasonVIPPoolExhausted)) {
			warnings = append(warnings, e)
		}
	}
	if len(warnings) != 1 {
		t.Errorf("leader, three syncs: %d VIPPoolExhausted Events, want 1: %q", len(warnings), warnings)
	}
}

// fakeClaim is the IngressClaim ns/edge of Ingress shop, in c's dynamic client.
func fakeClaim(t *testing.T, c *Controller, ns string) *v1alpha1.IngressClaim {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.IngressClaimResource.GroupVersion().String(), "kind": "IngressClaim",
		"metadata": map[string]any{"name": "edge", "namespace": ns, "uid": "claim-uid"},
		"spec":     map[string]any{"ingresses": []any{map[string]any{"name": "shop"}}},
	}}
	c.cfg.Dynamic = dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{v1alpha1.IngressClaimResource: "IngressClaimList"}, u)
	claim, err := claimFromUnstructured(u)
	if err != nil {
		t.Fatal(err)
	}
	return claim
}

// TestClaimWarningsReported: a claim's warnings are problems for report (deduplicated),
// not Events sent on every sync.
func TestClaimWarningsReported(t *testing.T) {
	taken := corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "edge"}}
	c, rec := fakeController(t, taken)
	claim := fakeClaim(t, c, "ns")
	st := State{Services: []*corev1.Service{&taken},
		Ingresses: []*networkingv1.Ingress{{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "shop"}}}}
	c.leader.Store(true)
	var sent int
	for range 3 {
		var problems []model.Problem
		if err := c.reconcileClaim(context.Background(), claim, newClaimIndex(st, model.Snapshot{}), &problems); err != nil {
			t.Fatal(err)
		}
		if len(problems) != 1 || problems[0].Reason != model.ReasonNameTaken || problems[0].Object != "IngressClaim ns/edge" {
			t.Fatalf("problems %v, want one NameTaken on the claim", problems)
		}
		if ev := drain(rec); len(ev) != 0 {
			t.Fatalf("reconcileClaim sent Events itself: %q", ev)
		}
		c.report(problems)
		sent += len(drain(rec))
	}
	if sent != 1 {
		t.Errorf("three syncs sent %d NameTaken Events, want 1", sent)
	}
}

// TestClaimOutsideGroupNamespaces: a claim in a namespace
// the operator did not list provisions nothing (no group Service, no privileged
// DaemonSet), is Pending with the reason, and is reported.
func TestClaimOutsideGroupNamespaces(t *testing.T) {
	c, _ := fakeController(t)
	c.cfg.GroupNamespaces = []string{"portico-system"}
	claim := fakeClaim(t, c, "tenant")
	st := State{Ingresses: []*networkingv1.Ingress{{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: "shop"}}}}
	c.leader.Store(true)
	ctx := context.Background()
	var problems []model.Problem
	if err := c.reconcileClaim(ctx, claim, newClaimIndex(st, model.Snapshot{}), &problems); err != nil {
		t.Fatal(err)
	}
	if len(problems) != 1 || problems[0].Reason != model.ReasonClaimNotAllowed || problems[0].Object != "IngressClaim tenant/edge" {
		t.Errorf("problems %v, want one ClaimNotAllowed on the claim", problems)
	}
	svcs, _ := c.cfg.Client.CoreV1().Services("tenant").List(ctx, metav1.ListOptions{})
	dss, _ := c.cfg.Client.AppsV1().DaemonSets("tenant").List(ctx, metav1.ListOptions{})
	if len(svcs.Items) != 0 || len(dss.Items) != 0 {
		t.Errorf("provisioned %d Services and %d DaemonSets, want none", len(svcs.Items), len(dss.Items))
	}
	got, err := c.cfg.Dynamic.Resource(v1alpha1.IngressClaimResource).Namespace("tenant").Get(ctx, "edge", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if phase, _, _ := unstructured.NestedString(got.Object, "status", "phase"); phase != v1alpha1.ClaimPending {
		t.Errorf("claim status %v, want Pending", got.Object["status"])
	}
}

// TestClaimDaemonSetLookups: the claim's DaemonSet is looked up on the API server
// once, not on every sync, and again after a resync period.
func TestClaimDaemonSetLookups(t *testing.T) {
	c, _ := fakeController(t)
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.IngressClaimResource.GroupVersion().String(), "kind": "IngressClaim",
		"metadata": map[string]any{"name": "edge", "namespace": "ns", "uid": "claim-uid"},
		"spec":     map[string]any{"ingresses": []any{map[string]any{"name": "shop"}}},
	}}
	c.cfg.Dynamic = dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{v1alpha1.IngressClaimResource: "IngressClaimList"}, u)
	claim, err := claimFromUnstructured(u)
	if err != nil {
		t.Fatal(err)
	}
	st := State{Services: []*corev1.Service{claimService(claim)},
		Ingresses: []*networkingv1.Ingress{{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "shop",
			Annotations: map[string]string{v1alpha1.AnnotationGroup: "ns/edge"}}}}}
	cs := c.cfg.Client.(*fake.Clientset)
	dsCalls := func() []string {
		var out []string
		for _, a := range cs.Actions() {
			if a.GetResource().Resource == "daemonsets" {
				out = append(out, a.GetVerb())
			}
		}
		return out
	}
	sync := func() {
		t.Helper()
		var problems []model.Problem
		if err := c.reconcileClaim(context.Background(), claim, newClaimIndex(st, model.Snapshot{}), &problems); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		sync()
	}
	if got := dsCalls(); !slices.Equal(got, []string{"get", "create"}) {
		t.Fatalf("three syncs: DaemonSet calls %v, want one get and one create", got)
	}
	c.provisioned[claim.UID] = time.Now().Add(-2 * c.cfg.ResyncPeriod)
	sync()
	if got := dsCalls(); !slices.Equal(got, []string{"get", "create", "get"}) {
		t.Fatalf("after a resync period: DaemonSet calls %v, want one more get", got)
	}
}
