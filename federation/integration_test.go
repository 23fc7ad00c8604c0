package federation

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"github.com/portico-edge/portico/agent/lease"
	"github.com/portico-edge/portico/api/agentstatus"
	"github.com/portico-edge/portico/api/sites"
	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/test/testenv"
)

// TestPropagation runs the controller against four real API servers (a host and
// members a, b, c): create, override, update, drift, a bad override, a member down,
// placement changes, deletion, and the host lost (fail-static), with the time each
// took printed.
func TestPropagation(t *testing.T) {
	cs := launchClusters(t, "host", "a", "b", "c")
	host := cs["host"]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	apply(t, ctx, host, "federatedingresses.portico.io.yaml", "controller.yaml")
	if _, err := host.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "web"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"a", "b", "c"} {
		apply(t, ctx, cs[m], "member-rbac.yaml")
		kc := memberKubeconfig(t, cs[m])
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "site-" + m, Namespace: "portico-federation", Labels: map[string]string{v1alpha1.LabelMemberCluster: m}},
			Data: map[string][]byte{v1alpha1.KeyMemberKubeconfig: kc}}
		if _, err := host.client.CoreV1().Secrets("portico-federation").Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// A broken member Secret is reported and skipped.
	broken := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "site-broken", Namespace: "portico-federation", Labels: map[string]string{v1alpha1.LabelMemberCluster: "true"}},
		Data: map[string][]byte{v1alpha1.KeyMemberKubeconfig: []byte("not: [a kubeconfig")}}
	if _, err := host.client.CoreV1().Secrets("portico-federation").Create(ctx, broken, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Site a has two endpoints behind the Ingress's Service, one ready.
	a := cs["a"]
	if _, err := a.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "web"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	yes, no := true, false
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "shop-1", Namespace: "web", Labels: map[string]string{discoveryv1.LabelServiceName: "shop"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.1.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes}},
			{Addresses: []string{"10.1.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: &no}},
		},
	}
	if _, err := a.client.DiscoveryV1().EndpointSlices("web").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	runCtx, stopController := context.WithCancel(ctx)
	// The controller runs as its ServiceAccount (controller.yaml), and reaches the
	// members as theirs (member-rbac.yaml): a missing grant fails the test.
	asController := rest.CopyConfig(host.srv.Config)
	asController.Impersonate.UserName, asController.Impersonate.Groups = serviceAccount("portico-federation")
	ctrl, err := New(Config{Host: asController, Logger: zaptest.NewLogger(t), Resync: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- ctrl.Run(runCtx) }()
	defer func() {
		stopController()
		if err := <-done; err != nil {
			t.Errorf("controller: %v", err)
		}
	}()

	// Create: every member serves it, c with its own host.
	fi := fixture()
	fi.Generation = 0
	fi.Spec.Overrides = []v1alpha1.ClusterOverride{{Cluster: "c", Patch: json.RawMessage(`{"spec":{"rules":[{"host":"c.shop.example.com","http":{"paths":[{"path":"/","pathType":"Prefix","backend":{"service":{"name":"shop","port":{"number":80}}}}]}}]}}`)}}
	if _, err := host.dyn.Resource(v1alpha1.FederatedIngressResource).Namespace("web").Create(ctx, toUnstructured(t, fi), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitMembers(t, ctx, cs, "create", "shop", atGeneration(1), "a", "b", "c")
	for m, host := range map[string]string{"a": "shop.example.com", "b": "shop.example.com", "c": "c.shop.example.com"} {
		if got := memberIngress(ctx, cs[m], "shop").Spec.Rules[0].Host; got != host {
			t.Errorf("%s serves host %q, want %q", m, got, host)
		}
	}
	// Status: a's backends; then the address a's own Portico writes comes back.
	waitStatus(t, ctx, host, "shop", "3 propagated, a: 1 of 2 backends ready, no edge", func(fi *v1alpha1.FederatedIngress) bool {
		s := site(fi, "a")
		return fi.Status.Propagated == 3 && fi.Status.Ready == 0 && s != nil && s.ReadyBackends == 1 && s.Backends == 2 &&
			s.Edges == 0 && s.Announce == v1alpha1.SiteWithdrawn &&
			condition(fi, v1alpha1.FederatedConditionPropagated) == "True AllSites 3/3 placed sites hold the current generation" &&
			condition(fi, v1alpha1.FederatedConditionReady) == "False SitesBehind 0/3 placed sites serve it; not: a, b, c"
	})
	// Site a's edges report through their status Leases, as agents write them: one
	// serves the current generation and announces, one lags and is de-preferenced,
	// one stopped renewing (stale: it counts for nothing).
	gen := memberIngress(ctx, a, "shop").Generation
	edge := func(node string, served int64, pref string, ttl time.Duration) {
		st := agentstatus.State{Node: node, Group: "portico-system/edge", Healthy: true, Served: map[string]int64{"web/shop": served},
			Addrs: []string{"10.1.0." + node[len(node)-1:], "fd00::1"},
			BGP:   &agentstatus.BGPState{Preference: pref, Announced: []agentstatus.BGPAnnouncement{{}}}}
		b, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Write(ctx, a.client, "portico-system", node, b, ttl); err != nil {
			t.Fatal(err)
		}
	}
	edge("edge-3", gen, "normal", time.Second)
	edge("edge-1", gen, "normal", time.Minute)
	edge("edge-2", gen-1, "depreferenced", time.Minute)
	time.Sleep(2 * time.Second) // edge-3's report goes stale
	waitStatus(t, ctx, host, "shop", "a: 2 edges, 1 serving, announced; ready", func(fi *v1alpha1.FederatedIngress) bool {
		s := site(fi, "a")
		return s != nil && s.Edges == 2 && s.EdgesServing == 1 && s.Announce == v1alpha1.SiteAnnounced && fi.Status.Ready == 1 &&
			condition(fi, v1alpha1.FederatedConditionReady) == "False SitesBehind 1/3 placed sites serve it; not: b, c"
	})
	edge("edge-1", gen, "depreferenced", time.Minute)
	waitStatus(t, ctx, host, "shop", "a: de-preferenced", func(fi *v1alpha1.FederatedIngress) bool {
		s := site(fi, "a")
		return s != nil && s.Announce == v1alpha1.SiteDepreferenced
	})
	edge("edge-1", gen, "withdrawn", time.Minute)
	edge("edge-2", gen, "withdrawn", time.Minute)
	waitStatus(t, ctx, host, "shop", "a: withdrawn, 2 serving", func(fi *v1alpha1.FederatedIngress) bool {
		s := site(fi, "a")
		return s != nil && s.Announce == v1alpha1.SiteWithdrawn && s.EdgesServing == 2
	})
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ing := memberIngress(ctx, a, "shop")
		ing.Status.LoadBalancer.Ingress = []networkingv1.IngressLoadBalancerIngress{{IP: "192.0.2.80"}}
		_, err := a.client.NetworkingV1().Ingresses("web").UpdateStatus(ctx, ing, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, ctx, host, "shop", "a's address", func(fi *v1alpha1.FederatedIngress) bool {
		s := site(fi, "a")
		return s != nil && len(s.Addresses) == 1 && s.Addresses[0] == "192.0.2.80"
	})

	// Update: every member follows, and a's status (another manager's) stays.
	gen = updateFI(t, ctx, host, "shop", func(fi *v1alpha1.FederatedIngress) {
		fi.Spec.Template.Metadata.Annotations["team"] = "b"
		fi.Spec.Policy.Health = v1alpha1.HealthAll
	})
	waitMembers(t, ctx, cs, "update", "shop", atGeneration(gen), "a", "b", "c")
	if got := memberIngress(ctx, a, "shop"); got.Annotations["team"] != "b" || len(got.Status.LoadBalancer.Ingress) != 1 ||
		got.Annotations["portico.io/federation-health"] != "All" {
		t.Errorf("a after update: annotations %v, status %+v", got.Annotations, got.Status.LoadBalancer)
	}

	// Drift: b's Ingress edited by hand is put back; a label another manager adds stays.
	b := cs["b"]
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ing := memberIngress(ctx, b, "shop")
		ing.Spec.Rules[0].Host = "hand.example.com"
		ing.Labels["owner"] = "ops"
		_, err := b.client.NetworkingV1().Ingresses("web").Update(ctx, ing, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	waitMembers(t, ctx, cs, "drift repaired", "shop", func(ing *networkingv1.Ingress) bool {
		return ing != nil && ing.Spec.Rules[0].Host == "shop.example.com"
	}, "b")
	if got := memberIngress(ctx, b, "shop").Labels["owner"]; got != "ops" {
		t.Errorf("b's own label removed: %q", got)
	}

	// A bad override for b: b keeps what it had and reports it; a and c move on.
	gen = updateFI(t, ctx, host, "shop", func(fi *v1alpha1.FederatedIngress) {
		fi.Spec.Template.Metadata.Annotations["team"] = "c"
		fi.Spec.Overrides = append(fi.Spec.Overrides, v1alpha1.ClusterOverride{Cluster: "b", Patch: json.RawMessage(`{"spec":{"ingresClassName":"x"}}`)})
	})
	waitMembers(t, ctx, cs, "update beside a bad override", "shop", atGeneration(gen), "a", "c")
	waitStatus(t, ctx, host, "shop", "b reports its bad override", func(fi *v1alpha1.FederatedIngress) bool {
		s := site(fi, "b")
		return s != nil && strings.Contains(s.Error, "not an Ingress") && fi.Status.Propagated == 2 &&
			condition(fi, v1alpha1.FederatedConditionPropagated) == "False SitesBehind 2/3 placed sites hold the current generation; not: b"
	})
	if got := memberIngress(ctx, b, "shop"); got == nil || got.Annotations["team"] != "b" {
		t.Errorf("b lost its Ingress over a bad override: %+v", got)
	}
	waitEvent(t, ctx, host, "web", "shop", "InvalidOverride")
	waitEvent(t, ctx, host, "portico-federation", "site-broken", "InvalidMemberCluster")
	gen = updateFI(t, ctx, host, "shop", func(fi *v1alpha1.FederatedIngress) { fi.Spec.Overrides = fi.Spec.Overrides[:1] })
	waitMembers(t, ctx, cs, "bad override removed", "shop", atGeneration(gen), "a", "b", "c")

	// Peers: every member is told the other sites' edges (a's two fresh ones,
	// b's, which reports a tunnel address of its own), and who drains.
	bst, err := json.Marshal(agentstatus.State{Node: "b-edge-1", Group: "portico-system/edge", Healthy: true, Addrs: []string{"10.2.0.9"}, Tunnel: "10.2.0.1",
		Served: map[string]int64{"web/shop": memberIngress(ctx, b, "shop").Generation}, Spill: 0.3,
		BGP: &agentstatus.BGPState{Preference: "depreferenced", Announced: []agentstatus.BGPAnnouncement{{}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Write(ctx, b.client, "portico-system", "b-edge-1", bst, time.Minute); err != nil {
		t.Fatal(err)
	}
	aEdges, bEdges := []string{"10.1.0.1", "10.1.0.2"}, []string{"10.2.0.1"}
	waitPeers(t, ctx, cs["a"], "a told b's edges", func(f sites.File) bool {
		return f.Site == "a" && len(f.Peers) == 1 && f.Peers[0].Name == "b" && slices.Equal(f.Peers[0].Edges, bEdges) && !f.Draining
	})
	waitPeers(t, ctx, cs["c"], "c told a's and b's edges", func(f sites.File) bool {
		return len(f.Peers) == 2 && slices.Equal(f.Peers[0].Edges, aEdges) && slices.Equal(f.Peers[1].Edges, bEdges)
	})
	drain := func(v string) {
		t.Helper()
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, v1alpha1.AnnotationDrain, v)
		if _, err := host.client.CoreV1().Secrets("portico-federation").Patch(ctx, "site-b", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	asked := time.Now()
	drain("true")
	bf := waitPeers(t, ctx, b, "b drains", func(f sites.File) bool { return f.Draining && f.DrainFrom != nil })
	if lead := bf.DrainFrom.Sub(asked); lead < DrainLead-2*time.Second || lead > DrainLead+10*time.Second {
		t.Errorf("b drains from %v, %v after it was asked, want about %v", bf.DrainFrom, lead, DrainLead)
	}
	waitPeers(t, ctx, cs["a"], "a told b drains", func(f sites.File) bool { return len(f.Peers) == 1 && f.Peers[0].Draining })
	// b's status: de-preferenced, not yet draining (its drain begins DrainLead
	// later), spilling 30 %.
	waitStatus(t, ctx, host, "shop", "b de-preferenced, overflowing 30%", func(fi *v1alpha1.FederatedIngress) bool {
		s := site(fi, "b")
		return s != nil && s.Announce == v1alpha1.SiteDepreferenced && s.Overflow == 30 && s.AnnounceChanged != nil
	})
	// A drain from a time already passed: b is Draining.
	drain(time.Now().Add(-time.Second).UTC().Format(time.RFC3339))
	waitStatus(t, ctx, host, "shop", "b draining", func(fi *v1alpha1.FederatedIngress) bool {
		s := site(fi, "b")
		return s != nil && s.Announce == v1alpha1.SiteDraining
	})
	sec, err := host.client.CoreV1().Secrets("portico-federation").Get(ctx, "site-b", metav1.GetOptions{})
	if err != nil || sec.Annotations[v1alpha1.AnnotationDrainFrom] != bf.DrainFrom.UTC().Format(time.RFC3339) {
		t.Errorf("site-b's drain-from annotation: %q (%v), want %v", sec.Annotations[v1alpha1.AnnotationDrainFrom], err, bf.DrainFrom)
	}
	drain("false")
	waitPeers(t, ctx, b, "b's drain over", func(f sites.File) bool { return !f.Draining })
	// b's capacity, and where it overflows: its one edge takes all of it.
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"300",%q:"a",%q:"0.4"}}}`, v1alpha1.AnnotationCapacity, v1alpha1.AnnotationOverflowTo, v1alpha1.AnnotationOverflowLimit)
	if _, err := host.client.CoreV1().Secrets("portico-federation").Patch(ctx, "site-b", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPeers(t, ctx, b, "b overflows to a", func(f sites.File) bool {
		return f.Overflow != nil && *f.Overflow == sites.Overflow{CapacityPerEdge: 300, To: "a", Limit: 0.4}
	})
	waitPeers(t, ctx, cs["a"], "a told b's drain is over", func(f sites.File) bool { return len(f.Peers) == 1 && !f.Peers[0].Draining })

	// The FederatedIngress's site policies: a's capacity (for its two edges)
	// and overflow, its drain grace; the anycast VIP, which b does not serve.
	updateFI(t, ctx, host, "shop", func(fi *v1alpha1.FederatedIngress) {
		fi.Spec.Policy.Sites = []v1alpha1.SitePolicy{{Cluster: "a", Capacity: 200, OverflowTo: "b"}}
		fi.Spec.Policy.OverflowLimitPercent = 40
		fi.Spec.Policy.DrainGrace = &metav1.Duration{Duration: 5 * time.Minute}
		fi.Spec.Policy.AnycastVIP = "192.0.2.80"
	})
	waitPeers(t, ctx, cs["a"], "a overflows to b by the FederatedIngress's policy", func(f sites.File) bool {
		return f.Overflow != nil && *f.Overflow == sites.Overflow{CapacityPerEdge: 100, To: "b", Limit: 0.4} &&
			f.DrainGrace != nil && f.DrainGrace.Duration == 5*time.Minute
	})
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ing := memberIngress(ctx, b, "shop")
		ing.Status.LoadBalancer.Ingress = []networkingv1.IngressLoadBalancerIngress{{IP: "198.51.100.80"}}
		_, err := b.client.NetworkingV1().Ingresses("web").UpdateStatus(ctx, ing, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, ctx, host, "shop", "b not on the anycast VIP", func(fi *v1alpha1.FederatedIngress) bool {
		s, a := site(fi, "b"), site(fi, "a")
		return s != nil && strings.Contains(s.Error, "anycast VIP") && a != nil && a.Error == ""
	})
	waitEvent(t, ctx, host, "web", "shop", "AnycastVIPMismatch")
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ing := memberIngress(ctx, b, "shop")
		ing.Status.LoadBalancer.Ingress = []networkingv1.IngressLoadBalancerIngress{{IP: "192.0.2.80"}}
		_, err := b.client.NetworkingV1().Ingresses("web").UpdateStatus(ctx, ing, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, ctx, host, "shop", "b on the anycast VIP", func(fi *v1alpha1.FederatedIngress) bool {
		s := site(fi, "b")
		return s != nil && s.Error == ""
	})

	// A member down holds back no other member.
	if err := cs["c"].srv.Stop(); err != nil {
		t.Fatal(err)
	}
	gen = updateFI(t, ctx, host, "shop", func(fi *v1alpha1.FederatedIngress) { fi.Spec.Template.Metadata.Annotations["team"] = "d" })
	waitMembers(t, ctx, cs, "update with c down", "shop", atGeneration(gen), "a", "b")
	waitStatus(t, ctx, host, "shop", "c down reported", func(fi *v1alpha1.FederatedIngress) bool {
		s := site(fi, "c")
		return s != nil && s.Error != "" && fi.Status.Propagated == 2
	})

	// Placement: b leaves and loses the Ingress; a keeps it.
	updateFI(t, ctx, host, "shop", func(fi *v1alpha1.FederatedIngress) {
		fi.Spec.Placement.Clusters = []string{"a", "c"}
		fi.Spec.Policy.Sites = nil // a overflowed to b
	})
	waitMembers(t, ctx, cs, "b left the placement", "shop", func(ing *networkingv1.Ingress) bool { return ing == nil }, "b")
	if memberIngress(ctx, a, "shop") == nil {
		t.Fatal("a lost its Ingress when b left the placement")
	}

	// Deletion: a second FederatedIngress goes from every member, then from the host.
	blog := fixture()
	blog.Name, blog.Generation = "blog", 0
	blog.Spec.Placement.Clusters = []string{"a", "b"}
	if _, err := host.dyn.Resource(v1alpha1.FederatedIngressResource).Namespace("web").Create(ctx, toUnstructured(t, blog), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitMembers(t, ctx, cs, "create blog", "blog", atGeneration(1), "a", "b")
	if err := host.dyn.Resource(v1alpha1.FederatedIngressResource).Namespace("web").Delete(ctx, "blog", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitMembers(t, ctx, cs, "delete blog", "blog", func(ing *networkingv1.Ingress) bool { return ing == nil }, "a", "b")
	if _, err := testenv.Poll(ctx, 30*time.Second, 50*time.Millisecond, func() bool {
		_, err := host.dyn.Resource(v1alpha1.FederatedIngressResource).Namespace("web").Get(ctx, "blog", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}); err != nil {
		t.Fatal("blog still on the host: finalizer not removed")
	}

	// Fail-static: the host API server stops; the controller goes on syncing from its
	// cache (waited for by its sync count, not by time), and a's Ingress stays as
	// it was, and so does what a was told of its peers.
	before := memberIngress(ctx, a, "shop")
	waitPeers(t, ctx, a, "a's overflow gone with the policy", func(f sites.File) bool { return f.Overflow == nil })
	peersBefore, err := a.client.CoreV1().ConfigMaps("portico-system").Get(ctx, PeersConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := host.srv.Stop(); err != nil {
		t.Fatal(err)
	}
	syncs := func() float64 {
		return testutil.ToFloat64(ctrl.metrics.syncs.WithLabelValues("ok")) + testutil.ToFloat64(ctrl.metrics.syncs.WithLabelValues("error"))
	}
	stopped, start := syncs(), time.Now()
	if _, err := testenv.Poll(ctx, 30*time.Second, 50*time.Millisecond, func() bool { return syncs() >= stopped+4 }); err != nil {
		t.Fatalf("the controller synced %v times in 30 s after the host stopped, want 4", syncs()-stopped)
	}
	after := memberIngress(ctx, a, "shop")
	if after == nil || after.ResourceVersion != before.ResourceVersion {
		t.Fatalf("a's Ingress changed when the host was lost: before rv %s, after %+v", before.ResourceVersion, after)
	}
	if cm, err := a.client.CoreV1().ConfigMaps("portico-system").Get(ctx, PeersConfigMap, metav1.GetOptions{}); err != nil || cm.ResourceVersion != peersBefore.ResourceVersion {
		t.Fatalf("a's peers changed when the host was lost: %v\nbefore:\n%s\nafter:\n%s", err, peersBefore.Data[PeersKey], cm.Data[PeersKey])
	}
	t.Logf("host lost: 4 syncs in %v without it, a's Ingress unchanged (resourceVersion %s)",
		time.Since(start).Round(time.Millisecond), after.ResourceVersion)
}
