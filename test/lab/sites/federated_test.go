package sites

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/test/lab"
	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

// TestSiteFederated: the whole chain, with a host cluster: a FederatedIngress
// on the host is served by both sites; the controller tells each site's agents
// the other's edges (the peers ConfigMap, as the kubelet mounts it) and
// aggregates what the agents report; a drain asked on the host (portico.io/drain
// on b's member Secret) drains b without a reset, and its status says Draining;
// then the host's API server stops, and after it b's: nothing
// in the routing changes and no connection fails.
func TestSiteFederated(t *testing.T) {
	s := startSites(t)
	ctx := context.Background()
	const lead = 3 * time.Second
	f, err := s.Federate(ctx, t, lead)
	if err != nil {
		t.Fatal(err)
	}
	pt := networkingv1.PathTypePrefix
	fi := &v1alpha1.FederatedIngress{
		TypeMeta:   metav1.TypeMeta{APIVersion: "portico.io/v1alpha1", Kind: "FederatedIngress"},
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: lab.AppNamespace},
		Spec: v1alpha1.FederatedIngressSpec{
			Placement: v1alpha1.Placement{Clusters: []string{"a", "b"}},
			Template: v1alpha1.IngressTemplate{
				Metadata: v1alpha1.IngressTemplateMeta{Annotations: map[string]string{"portico.io/group": lab.GroupNamespace + "/" + lab.GroupName}},
				Spec: networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{{Host: "echo.lab", IngressRuleValue: networkingv1.IngressRuleValue{
					HTTP: &networkingv1.HTTPIngressRuleValue{Paths: []networkingv1.HTTPIngressPath{{Path: "/", PathType: &pt,
						Backend: networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: "echo", Port: networkingv1.ServiceBackendPort{Name: "http"}}}}}}}}}},
			},
		},
	}
	created := time.Now()
	if err := f.Create(ctx, fi); err != nil {
		t.Fatal(err)
	}
	status := func(what string, ok func(a, b v1alpha1.SiteStatus) bool) {
		t.Helper()
		var last string
		if _, err := testenv.Poll(ctx, 60*time.Second, 100*time.Millisecond, func() error {
			fi, err := f.Get(ctx, lab.AppNamespace, "echo")
			if err != nil {
				return err
			}
			a, errA := site(fi, "a")
			b, errB := site(fi, "b")
			if errA != nil || errB != nil {
				return fmt.Errorf("%v %v", errA, errB)
			}
			last = fmt.Sprintf("a %+v, b %+v", a, b)
			if !ok(a, b) {
				return fmt.Errorf("%s", last)
			}
			return nil
		}); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	status("both sites serve and announce", func(a, b v1alpha1.SiteStatus) bool {
		return a.Announce == v1alpha1.SiteAnnounced && b.Announce == v1alpha1.SiteAnnounced && a.EdgesServing == 2 && b.EdgesServing == 2 && a.ReadyBackends == 1
	})
	if err := s.WaitRemotes(60*time.Second, true); err != nil {
		t.Fatal(err)
	}
	t.Logf("FederatedIngress created: both sites' status Announced, 2 edges serving each, and every edge told the other site's edges after %v", time.Since(created).Round(time.Millisecond))

	// A planned drain of b, asked on the host.
	held, err := s.OpenKeepConns(ctx, "echo.lab", 64)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	onB := 0
	for _, k := range held {
		if s.SiteOf(k.Edge) == "b" {
			onB++
		}
	}
	stream := s.StartStream(ctx, "echo.lab", traffic.StreamOptions{Every: 10 * time.Millisecond, For: time.Minute})
	asked := time.Now()
	if err := f.Annotate(ctx, "b", map[string]string{v1alpha1.AnnotationDrain: "true"}); err != nil {
		stream.Stop()
		t.Fatal(err)
	}
	_, err = testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error {
		h, err := s.Hops()
		if err != nil {
			return err
		}
		if h["b"] != 0 {
			return fmt.Errorf("next hops by site %v", h)
		}
		return nil
	})
	left := time.Since(asked)
	if err != nil {
		stream.Stop()
		t.Fatal(err)
	}
	status("b draining", func(a, b v1alpha1.SiteStatus) bool {
		return b.Announce == v1alpha1.SiteDraining && b.AnnounceChanged != nil
	})
	time.Sleep(time.Second)
	kept, total, failed := lab.CheckKeepConns(held, "/drained")
	atts := stream.Stop()
	news := traffic.FailuresAround(atts, asked)
	t.Logf("drain asked on the host: b left the router's route %v later (drain lead %v), its status Draining; %d/%d held kept (%d on b); new connections: %v",
		left.Round(time.Millisecond), lead, kept, total, onB, news)
	if kept != total || news.Failed > 0 {
		t.Errorf("drain: %d of %d held connections broke (%v), %d new connections failed", total-kept, total, failed, news.Failed)
	}
	if err := f.Annotate(ctx, "b", map[string]string{v1alpha1.AnnotationDrain: "false"}); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, s.HopsAre(2, 2)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if kept, total, failed := lab.CheckKeepConns(held, "/undrained"); kept != total {
		t.Errorf("b back: %d of %d held connections broke: %v", total-kept, total, failed)
	}

	// Fail-static: the host's API server stops, then b's.
	hops0, err := s.Router.Nexthops()
	if err != nil {
		t.Fatal(err)
	}
	updates0, err := s.UpdatesReceived()
	if err != nil {
		t.Fatal(err)
	}
	stream = s.StartStream(ctx, "echo.lab", traffic.StreamOptions{Every: 10 * time.Millisecond, For: time.Minute})
	stopped := time.Now()
	if err := f.Host.Stop(); err != nil {
		stream.Stop()
		t.Fatal(err)
	}
	changes := 0
	poll := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			if h, err := s.Router.Nexthops(); err != nil || !slices.Equal(h, hops0) {
				changes++
			}
		}
	}
	poll(5 * time.Second)
	if err := s.B.API.Stop(); err != nil {
		stream.Stop()
		t.Fatal(err)
	}
	poll(10 * time.Second)
	atts = stream.Stop()
	hops1, err := s.Router.Nexthops()
	if err != nil {
		t.Fatal(err)
	}
	updates1, err := s.UpdatesReceived()
	if err != nil {
		t.Fatal(err)
	}
	kept, total, failed = lab.CheckKeepConns(held, "/host-lost")
	news = traffic.FailuresAround(atts, stopped)
	t.Logf("host API server stopped, b's 5 s later: %d of 150 polls saw the route change, %d BGP updates in 15 s, next hops %v -> %v; new connections: %v; %d/%d held kept",
		changes, updates1-updates0, hops0, hops1, news, kept, total)
	// The routing is judged by the router's next hops, polled throughout: a
	// BGP update alone can be a BFD session flapping on a starved machine.
	if changes > 0 || !slices.Equal(hops0, hops1) || news.Failed > 0 || kept != total {
		t.Errorf("fail-static: %d polls saw the route change (%d BGP updates), next hops %v -> %v, %d new connections failed, %d held broke (%v)",
			changes, updates1-updates0, hops0, hops1, news.Failed, total-kept, failed)
	}
}
