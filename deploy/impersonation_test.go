package deploy_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/portico-edge/portico/agent"
	"github.com/portico-edge/portico/agent/lease"
	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane"
	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/testenv"
)

// requestLog records every request the API server refused with 403, and how the
// IngressClass informer started (a list, or a watch with sendInitialEvents).
type requestLog struct {
	mu                  sync.Mutex
	reqs                []string
	classLists, streams int
	writes              int      // requests other than GET (the selfsubjectreview aside)
	writeList           []string // the first few
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (l *requestLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(r)
		l.mu.Lock()
		defer l.mu.Unlock()
		if err == nil && resp.StatusCode == http.StatusForbidden {
			l.reqs = append(l.reqs, r.Method+" "+r.URL.RequestURI())
		}
		if r.Method != http.MethodGet && !strings.Contains(r.URL.Path, "selfsubjectreviews") {
			l.writes++
			if len(l.writeList) < 5 {
				l.writeList = append(l.writeList, r.Method+" "+r.URL.RequestURI())
			}
		}
		q := r.URL.Query()
		switch {
		case r.Method != http.MethodGet:
		case q.Get("watch") == "true" && q.Get("sendInitialEvents") == "true":
			l.streams++
		case q.Get("watch") == "" && strings.HasSuffix(r.URL.Path, "/ingressclasses"):
			l.classLists++
		}
		return resp, err
	})
}

func (l *requestLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.reqs)
}

// asAgent is admin's connection impersonating the agent's ServiceAccount, its requests
// logged.
func asAgent(admin *rest.Config, reqs *requestLog) *rest.Config {
	return as(admin, agentSubject, reqs)
}

// as is admin's connection impersonating s's ServiceAccount, its requests logged.
func as(admin *rest.Config, s subject, reqs *requestLog) *rest.Config {
	cfg := rest.CopyConfig(admin)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: s.user(), Groups: agentGroups}
	cfg.WrapTransport = reqs.wrap
	return cfg
}

// testStatusLease runs the agent's status-Lease writer (lease.Write:
// create, then renew) as the agent's ServiceAccount, and reads the result as an
// operator would (portico status); the agent itself never lists Leases.
func testStatusLease(t *testing.T, ctx context.Context, admin *rest.Config) {
	var reqs requestLog
	cs := kubernetes.NewForConfigOrDie(asAgent(admin, &reqs))
	for _, state := range []string{`{"node":"node-1"}`, `{"node":"node-1","healthy":true}`} {
		if err := lease.Write(ctx, cs, namespace, "node-1", []byte(state), 10*time.Second); err != nil {
			t.Fatalf("write the status Lease: %v", err)
		}
	}
	leases, err := lease.List(ctx, kubernetes.NewForConfigOrDie(admin), namespace)
	if err != nil {
		t.Fatalf("list status Leases: %v", err)
	}
	if len(leases) != 1 || leases[0].Node != "node-1" || leases[0].Stale || string(leases[0].State) != `{"node":"node-1","healthy":true}` {
		t.Errorf("status Leases = %+v, want node-1's renewed state", leases)
	}
	if bad := reqs.list(); len(bad) > 0 {
		t.Errorf("the API server refused the agent: %v", bad)
	}
}

// testNodeIface runs the agent's start-up read of its Node (agent.ChooseIface)
// as the agent's ServiceAccount: the node's portico.io/iface annotation is
// read with the rights rbac.yaml gives, nothing refused.
func testNodeIface(t *testing.T, ctx context.Context, admin *rest.Config, cs kubernetes.Interface) {
	for _, n := range []*corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "edge-1", Annotations: map[string]string{v1alpha1.AnnotationIface: "bond0,eth1"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "edge-2"}},
	} {
		if _, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var reqs requestLog
	agentCS := kubernetes.NewForConfigOrDie(asAgent(admin, &reqs))
	present := func(n string) bool { return n == "eth0" || n == "eth1" }
	for node, want := range map[string]agent.IfaceChoice{
		"edge-1": {Name: "eth1", Source: agent.IfaceFromAnnotation, Candidates: []string{"bond0", "eth1"}, Absent: []string{"bond0"}},
		"edge-2": {Name: "eth0", Source: agent.IfaceFromFlag, Candidates: []string{"eth0"}},
	} {
		got, err := agent.ChooseIface(ctx, agentCS, node, "eth0", present, zaptest.NewLogger(t))
		if err != nil {
			t.Fatalf("%s: %v", node, err)
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("%s: interface choice (-want +got):\n%s", node, d)
		}
	}
	if bad := reqs.list(); len(bad) > 0 {
		t.Errorf("the API server refused the agent: %v", bad)
	}
}

// testController runs the real control plane with the controller
// ServiceAccount's identity (impersonation) over the applied manifests, drives
// every write path, and fails on any request the API server refuses.
func testController(t *testing.T, ctx context.Context, admin *rest.Config, cs kubernetes.Interface, identity string, streaming bool) {
	var reqs requestLog
	cfg := as(admin, controllerSubject, &reqs)
	whoami, err := kubernetes.NewForConfigOrDie(cfg).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if u := whoami.Status.UserInfo.Username; u != controllerSubject.user() {
		t.Fatalf("impersonation: the API server sees %q", u)
	}

	pool, err := controlplane.ParsePool("198.18.0.0/29")
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := controlplane.New(controlplane.Config{
		Client: kubernetes.NewForConfigOrDie(cfg), Dynamic: dynamic.NewForConfigOrDie(cfg),
		Logger: zaptest.NewLogger(t).Named("controlplane"), Registerer: prometheus.NewRegistry(),
		Pools: []controlplane.Pool{pool}, Identity: identity, ReleaseOnCancel: true,
		LeaseDuration: 4 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancelRun := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- ctl.Run(runCtx) }()
	var runErr error
	var once sync.Once
	stop := func() error {
		once.Do(func() {
			cancelRun()
			runErr = <-done
		})
		return runErr
	}
	defer stop()

	dyn := dynamic.NewForConfigOrDie(admin)
	claims := dyn.Resource(v1alpha1.IngressClaimResource).Namespace(namespace)
	annotation := func(obj metav1.Object, k string) string { return obj.GetAnnotations()[k] }
	testenv.Eventually(t, 30*time.Second, func() string {
		if bad := reqs.list(); len(bad) > 0 {
			t.Fatalf("the API server refused the controller: %v", bad)
		}
		lease, err := cs.CoordinationV1().Leases(namespace).Get(ctx, leaseName, metav1.GetOptions{})
		if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != identity {
			return fmt.Sprintf("lease not held (%v)", err)
		}
		web, err := cs.NetworkingV1().Ingresses(namespace).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if lb := web.Status.LoadBalancer.Ingress; len(lb) != 1 || lb[0].IP != "192.0.2.80" {
			return fmt.Sprintf("Ingress web status %+v, want the edge VIP", lb)
		}
		edge, err := cs.CoreV1().Services(namespace).Get(ctx, "edge", metav1.GetOptions{})
		if err != nil || annotation(edge, "portico.io/vrid") == "" {
			return fmt.Sprintf("group edge has no VRID (%v)", err)
		}
		lb, err := cs.CoreV1().Services("tenant-a").Get(ctx, "lb", metav1.GetOptions{})
		if err != nil || annotation(lb, "portico.io/vip") == "" || len(lb.Status.LoadBalancer.Ingress) == 0 ||
			lb.Status.LoadBalancer.Ingress[0].IP != annotation(lb, "portico.io/vip") {
			return fmt.Sprintf("L4 Service has no VIP in annotation and status (%v)", err)
		}
		claim, err := claims.Get(ctx, "shop", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if phase, _, _ := unstructured.NestedString(claim.Object, "status", "phase"); phase != v1alpha1.ClaimBound {
			return "claim shop phase " + phase
		}
		if _, err := cs.AppsV1().DaemonSets(namespace).Get(ctx, "shop", metav1.GetOptions{}); err != nil {
			return "claim DaemonSet: " + err.Error()
		}
		if _, err := cs.CoreV1().Services(namespace).Get(ctx, "shop", metav1.GetOptions{}); err != nil {
			return "claim Service: " + err.Error()
		}
		shop, err := cs.NetworkingV1().Ingresses(namespace).Get(ctx, "shop", metav1.GetOptions{})
		if err != nil || annotation(shop, "portico.io/group") != namespace+"/shop" {
			return fmt.Sprintf("Ingress shop not bound to the claim's group (%v)", err)
		}
		for _, ns := range []string{namespace, "tenant-a"} {
			evs, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return err.Error()
			}
			if !slices.ContainsFunc(evs.Items, func(e corev1.Event) bool { return e.Source.Component == "portico-controlplane" }) {
				return "no Event from the control plane in " + ns
			}
		}
		return ""
	})

	// Reclaim: with the claim's Ingress gone, reclaimPolicy Delete removes the
	// DaemonSet, the Service and the claim.
	if err := cs.NetworkingV1().Ingresses(namespace).Delete(ctx, "shop", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() string {
		if bad := reqs.list(); len(bad) > 0 {
			t.Fatalf("the API server refused the controller: %v", bad)
		}
		if _, err := claims.Get(ctx, "shop", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("claim still there (%v)", err)
		}
		if _, err := cs.AppsV1().DaemonSets(namespace).Get(ctx, "shop", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("claim DaemonSet still there (%v)", err)
		}
		if _, err := cs.CoreV1().Services(namespace).Get(ctx, "shop", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("claim Service still there (%v)", err)
		}
		return ""
	})

	// Shutdown releases the Lease (an update).
	if err := stop(); err != nil {
		t.Errorf("controller: %v", err)
	}
	lease, err := cs.CoordinationV1().Leases(namespace).Get(ctx, leaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := lease.Spec.HolderIdentity; h != nil && *h == identity {
		t.Errorf("Lease still held by %s after shutdown", *h)
	}
	if bad := reqs.list(); len(bad) > 0 {
		t.Errorf("the API server refused the controller: %v", bad)
	}
	reqs.mu.Lock()
	defer reqs.mu.Unlock()
	if streaming && reqs.streams == 0 || !streaming && reqs.classLists == 0 {
		t.Errorf("informers started with %d streaming watches and %d IngressClass lists; want the %s path",
			reqs.streams, reqs.classLists, map[bool]string{true: "streaming", false: "list"}[streaming])
	}
}

// snapshotSink keeps the last snapshot it was given.
type snapshotSink struct {
	mu   sync.Mutex
	last *model.Snapshot
}

func (s *snapshotSink) Name() string { return "test" }

func (s *snapshotSink) Apply(_ context.Context, snap model.Snapshot) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = &snap
	return nil
}

// testReadOnlyAsAgent runs the control plane as an edge's agent does
// (ReadOnly), as the agent's ServiceAccount: it builds the edge group's snapshot
// from the applied manifests with nothing refused, and writes nothing.
func testReadOnlyAsAgent(t *testing.T, ctx context.Context, admin *rest.Config) {
	var reqs requestLog
	cfg := asAgent(admin, &reqs)
	sink := &snapshotSink{}
	ctl, err := controlplane.New(controlplane.Config{
		Client: kubernetes.NewForConfigOrDie(cfg), Dynamic: dynamic.NewForConfigOrDie(cfg),
		Logger: zaptest.NewLogger(t).Named("agent"), Registerer: prometheus.NewRegistry(),
		Identity: "node-1", ReadOnly: true, Sinks: []controlplane.Sink{sink},
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- ctl.Run(runCtx) }()
	testenv.Eventually(t, 30*time.Second, func() string {
		if bad := reqs.list(); len(bad) > 0 {
			t.Fatalf("the API server refused the agent: %v", bad)
		}
		sink.mu.Lock()
		defer sink.mu.Unlock()
		if sink.last == nil {
			return "no snapshot yet"
		}
		for _, g := range sink.last.Groups {
			if g.Name == namespace+"/edge" {
				return ""
			}
		}
		return fmt.Sprintf("no group %s/edge in the snapshot (%d groups)", namespace, len(sink.last.Groups))
	})
	cancel()
	if err := <-done; err != nil {
		t.Errorf("read-only control plane: %v", err)
	}
	if bad := reqs.list(); len(bad) > 0 {
		t.Errorf("the API server refused the agent: %v", bad)
	}
	reqs.mu.Lock()
	defer reqs.mu.Unlock()
	if reqs.writes > 0 {
		t.Errorf("the read-only control plane made %d writes: %v", reqs.writes, reqs.writeList)
	}
}
