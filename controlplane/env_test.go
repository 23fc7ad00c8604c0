package controlplane

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/kapi"
	"github.com/portico-edge/portico/test/testenv"
)

// apiserver is one real kube-apiserver shared by this package's integration tests;
// each test works in namespaces of its own.
var apiserver kapi.Shared

func TestMain(m *testing.M) {
	code := m.Run()
	if err := apiserver.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop kube-apiserver:", err)
	}
	os.Exit(code)
}

type env struct {
	t   testing.TB
	cs  kubernetes.Interface
	dyn dynamic.Interface
	ns  string
	ctx context.Context
}

// newEnv connects to the shared API server and creates a fresh namespace.
func newEnv(t testing.TB) *env {
	t.Helper()
	srv := apiserver.Get(t)
	cs := kubernetes.NewForConfigOrDie(srv.Config)
	dyn := dynamic.NewForConfigOrDie(srv.Config)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "cp-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	// No service-account controller runs: pods need the default account made by hand.
	if _, err := cs.CoreV1().ServiceAccounts(ns.Name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create service account: %v", err)
	}
	e := &env{t: t, cs: cs, dyn: dyn, ns: ns.Name, ctx: ctx}
	e.installCRD()
	return e
}

// recordSink keeps every snapshot it is given, with the time it arrived.
type recordSink struct {
	mu    sync.Mutex
	snaps []model.Snapshot
	times []time.Time
	fail  int // fail the next n applies
	wake  chan struct{}
}

func newRecordSink() *recordSink { return &recordSink{wake: make(chan struct{}, 1)} }

func (s *recordSink) Name() string { return "record" }

func (s *recordSink) Apply(_ context.Context, snap model.Snapshot) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail > 0 {
		s.fail--
		return fmt.Errorf("injected failure")
	}
	s.snaps = append(s.snaps, snap)
	s.times = append(s.times, time.Now())
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return nil
}

func (s *recordSink) latest() (model.Snapshot, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.snaps) == 0 {
		return model.Snapshot{}, 0
	}
	return s.snaps[len(s.snaps)-1], len(s.snaps)
}

type running struct {
	ctl    *Controller
	reg    *prometheus.Registry
	sink   *recordSink
	cancel context.CancelFunc
	done   chan struct{}
}

// stop ends the controller like a killed process would (the Lease is not released
// unless the config asked for it) and waits for Run to return.
func (r *running) stop() {
	r.cancel()
	<-r.done
}

// start runs a controller watching the env's namespace, with short test timings.
func (e *env) start(mod func(*Config)) *running {
	e.t.Helper()
	sink := newRecordSink()
	reg := prometheus.NewRegistry()
	cfg := Config{
		Client: e.cs, Dynamic: e.dyn, Logger: zaptest.NewLogger(e.t).Named("controlplane"),
		Registerer: reg, Namespace: e.ns, Sinks: []Sink{sink},
		LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 200 * time.Millisecond,
		ReleaseOnCancel: true, SinkMinBackoff: 10 * time.Millisecond, SinkMaxBackoff: 100 * time.Millisecond,
	}
	if mod != nil {
		mod(&cfg)
	}
	ctl, err := New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	r := &running{ctl: ctl, reg: reg, sink: sink, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		if err := ctl.Run(ctx); err != nil {
			e.t.Errorf("controller: %v", err)
		}
	}()
	e.t.Cleanup(r.stop)
	return r
}

func (e *env) must(_ any, err error) {
	e.t.Helper()
	if err != nil {
		e.t.Fatal(err)
	}
}

// inNS copies an object constructor's output into the env's namespace.
func (e *env) svc(s *corev1.Service) *corev1.Service {
	s = s.DeepCopy()
	s.Namespace = e.ns
	s.CreationTimestamp = metav1.Time{}
	got, err := e.cs.CoreV1().Services(e.ns).Create(e.ctx, s, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create Service %s: %v", s.Name, err)
	}
	return got
}

func (e *env) slice(es *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	es = es.DeepCopy()
	es.Namespace = e.ns
	es.CreationTimestamp = metav1.Time{}
	got, err := e.cs.DiscoveryV1().EndpointSlices(e.ns).Create(e.ctx, es, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create EndpointSlice %s: %v", es.Name, err)
	}
	return got
}

var (
	crdOnce sync.Once
	crdErr  error
)

// installCRD creates the CRDs of deploy/crds (IngressClaim, VIPPool, Gateway API's) once per
// server and waits until they are served.
func (e *env) installCRD() {
	e.t.Helper()
	crdOnce.Do(func() {
		crds := e.dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
		for _, f := range []string{"ingressclaims.portico.io.yaml", "vippools.portico.io.yaml",
			"gateway-api/gateway.networking.k8s.io_gatewayclasses.yaml", "gateway-api/gateway.networking.k8s.io_gateways.yaml",
			"gateway-api/gateway.networking.k8s.io_httproutes.yaml", "gateway-api/gateway.networking.k8s.io_referencegrants.yaml"} {
			data, err := os.ReadFile("../deploy/crds/" + f)
			if err != nil {
				crdErr = err
				return
			}
			u := &unstructured.Unstructured{}
			if err := yaml.NewYAMLOrJSONDecoder(strings.NewReader(string(data)), 4096).Decode(&u.Object); err != nil {
				crdErr = fmt.Errorf("decode CRD %s: %w", f, err)
				return
			}
			if _, err := crds.Create(e.ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				crdErr = fmt.Errorf("create CRD %s: %w", f, err)
				return
			}
		}
		served := func() bool {
			_, err := e.dyn.Resource(v1alpha1.IngressClaimResource).Namespace("default").List(e.ctx, metav1.ListOptions{})
			_, perr := e.dyn.Resource(v1alpha1.VIPPoolResource).List(e.ctx, metav1.ListOptions{})
			_, gerr := e.dyn.Resource(httpRoutesResource).Namespace("default").List(e.ctx, metav1.ListOptions{})
			_, rerr := e.dyn.Resource(referenceGrantsResource).Namespace("default").List(e.ctx, metav1.ListOptions{})
			return err == nil && perr == nil && gerr == nil && rerr == nil
		}
		if _, err := testenv.Poll(context.Background(), 30*time.Second, 100*time.Millisecond, served); err != nil {
			crdErr = fmt.Errorf("CRDs not served after 30s")
		}
	})
	if crdErr != nil {
		e.t.Fatal(crdErr)
	}
}

// pool creates or replaces a VIPPool (cluster-scoped: deleted when the test ends).
func (e *env) pool(p *v1alpha1.VIPPool) {
	e.t.Helper()
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
	if err != nil {
		e.t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: obj}
	u.SetAPIVersion(v1alpha1.GroupVersion.String())
	u.SetKind("VIPPool")
	ri := e.dyn.Resource(v1alpha1.VIPPoolResource)
	cur, err := ri.Get(e.ctx, p.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if _, err := ri.Create(e.ctx, u, metav1.CreateOptions{}); err != nil {
			e.t.Fatalf("create VIPPool %s: %v", p.Name, err)
		}
		e.t.Cleanup(func() { _ = ri.Delete(context.Background(), p.Name, metav1.DeleteOptions{}) })
	case err != nil:
		e.t.Fatal(err)
	default:
		u.SetResourceVersion(cur.GetResourceVersion())
		if _, err := ri.Update(e.ctx, u, metav1.UpdateOptions{}); err != nil {
			e.t.Fatalf("update VIPPool %s: %v", p.Name, err)
		}
	}
}

// metric sums the samples of one metric family whose labels include want; -1 when
// the family is not registered.
func (r *running) metric(t testing.TB, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum, found := 0.0, false
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		found = true
	next:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	if !found {
		return -1
	}
	return sum
}
