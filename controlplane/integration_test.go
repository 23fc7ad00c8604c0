package controlplane

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/testenv"
)

// TestIntegrationConverges creates, updates and deletes each kind the snapshot reads
// and checks that the sink converges to the hand-written expected snapshot each time.
func TestIntegrationConverges(t *testing.T) {
	e := newEnv(t)
	ns := e.ns
	cs := e.cs
	node := ns + "-n9"
	class := ns + "-class"

	e.svc(groupSvc("", "g1", 0, v1alpha1.AnnotationVIP, "192.0.2.10", v1alpha1.AnnotationVRID, "7"))
	e.slice(slice("", "g1", "g1-a", "http", 80, ep{addr: "10.1.0.1", node: "n1", ready: true}, ep{addr: "10.1.0.9", ready: true}))
	e.must(cs.CoreV1().Nodes().Create(e.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.1.0.9"}}}}, metav1.CreateOptions{}))
	t.Cleanup(func() { _ = cs.CoreV1().Nodes().Delete(e.ctx, node, metav1.DeleteOptions{}) })
	e.svc(backendSvc("", "web", sport("http", 80)))
	e.slice(slice("", "web", "web-1", "http", 8080, ep{addr: "10.2.0.1", ready: true}))
	sec := tlsSecret(ns, "cert")
	e.must(cs.CoreV1().Secrets(ns).Create(e.ctx, sec, metav1.CreateOptions{}))
	e.must(cs.CoreV1().Secrets(ns).Create(e.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "noise"}, StringData: map[string]string{"a": "b"}}, metav1.CreateOptions{}))
	ing := ingress(ns, "site", 0, "example.com", []path{{"/", networkingv1.PathTypePrefix, "web", 80}}, v1alpha1.AnnotationGroup, "g1")
	ing.CreationTimestamp = metav1.Time{}
	ing.Spec.TLS = []networkingv1.IngressTLS{{Hosts: []string{"example.com"}, SecretName: "cert"}}
	e.must(cs.NetworkingV1().Ingresses(ns).Create(e.ctx, ing, metav1.CreateOptions{}))
	pod := microservice(ns, "ms", 0, "", "test.k8s.local", "3000:/nodejs", v1alpha1.AnnotationGroup, "g1")
	pod.CreationTimestamp = metav1.Time{}
	pod.Spec.Containers = []corev1.Container{{Name: "app", Image: "example/app"}}
	created, err := cs.CoreV1().Pods(ns).Create(e.ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.3.0.1", PodIPs: []corev1.PodIP{{IP: "10.3.0.1"}}}
	e.must(cs.CoreV1().Pods(ns).UpdateStatus(e.ctx, created, metav1.UpdateOptions{}))

	r := e.start(nil)

	podUp := ns + "-pod-" + shortHash("test.k8s.local|/nodejs") + "-3000"
	group := func(replicas ...model.Replica) model.Group {
		return model.Group{Name: ns + "/g1", VIPs: addrs("192.0.2.10"), VRID: 7,
			Ports: []model.Port{{Protocol: model.TCP, Port: 80}, {Protocol: model.TCP, Port: 443}}, HTTPPort: 80, HTTPSPort: 443, Replicas: replicas}
	}
	rep := func(node, addr string, st model.ReplicaState) model.Replica {
		return model.Replica{Node: node, Addr: netip.MustParseAddr(addr), Weight: 1, State: st}
	}
	cert := func(v string) model.Certificate {
		return model.Certificate{Name: ns + "/cert", CertPEM: []byte("CERT " + v), KeyPEM: []byte("KEY " + v)}
	}
	t.Run("create", func(t *testing.T) {
		waitSnapshot(t, r, func() model.Snapshot {
			return model.Snapshot{
				Groups: []model.Group{group(rep("n1", "10.1.0.1", model.Ready), rep(node, "10.1.0.9", model.Ready))},
				Servers: []model.Server{
					{Group: ns + "/g1", Host: "example.com", TLSCertificate: ns + "/cert", Locations: []model.Location{loc("/", model.PathPrefix, ns+"-web-80", ns+"/site")}},
					{Group: ns + "/g1", Host: "test.k8s.local", Locations: []model.Location{loc("/nodejs", model.PathPrefix, podUp, ns+"/ms")}},
				},
				Upstreams:    sortedUpstreams(model.Upstream{Name: ns + "-web-80", Endpoints: aps("10.2.0.1:8080")}, model.Upstream{Name: podUp, Endpoints: aps("10.3.0.1:3000")}),
				Certificates: []model.Certificate{cert("cert")},
			}
		})
	})
	t.Run("ingress status shows the VIP", func(t *testing.T) {
		testenv.Eventually(t, converge, func() string {
			got, err := cs.NetworkingV1().Ingresses(ns).Get(e.ctx, "site", metav1.GetOptions{})
			if err != nil {
				return err.Error()
			}
			want := []networkingv1.IngressLoadBalancerIngress{{IP: "192.0.2.10"}}
			return cmp.Diff(want, got.Status.LoadBalancer.Ingress)
		})
	})

	// The sync that published the snapshot sets its metrics after the sinks have
	// it, and after its writes: they are waited for, not read at once.
	t.Run("metrics", func(t *testing.T) {
		testenv.Eventually(t, converge, func() string {
			for kind, want := range map[string]float64{"Ingress": 1, "Service": 2, "EndpointSlice": 2, "Secret": 1, "Pod": 1} {
				if got := r.metric(t, "portico_controlplane_objects", map[string]string{"kind": kind}); got != want {
					return fmt.Sprintf("objects{kind=%q} = %v, want %v (the informers watch only what they need)", kind, got, want)
				}
			}
			if n := r.metric(t, "portico_controlplane_sync_duration_seconds", nil); n < 1 {
				return fmt.Sprintf("sync duration observed %v times", n)
			}
			if n := r.metric(t, "portico_controlplane_syncs_total", map[string]string{"result": "changed"}); n < 1 {
				return fmt.Sprintf("changed syncs = %v", n)
			}
			return ""
		})
		if n := r.metric(t, "portico_controlplane_queue_depth", nil); n < 0 {
			t.Errorf("queue depth metric not registered")
		}
	})

	t.Run("update", func(t *testing.T) {
		es, err := cs.DiscoveryV1().EndpointSlices(ns).Get(e.ctx, "g1-a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		es.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(true), Terminating: ptr(true)}
		e.must(cs.DiscoveryV1().EndpointSlices(ns).Update(e.ctx, es, metav1.UpdateOptions{}))
		ws, err := cs.DiscoveryV1().EndpointSlices(ns).Get(e.ctx, "web-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ws.Endpoints = append(ws.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.2.0.2"}})
		e.must(cs.DiscoveryV1().EndpointSlices(ns).Update(e.ctx, ws, metav1.UpdateOptions{}))
		in, err := cs.NetworkingV1().Ingresses(ns).Get(e.ctx, "site", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		in.Spec.Rules[0].HTTP.Paths = append(in.Spec.Rules[0].HTTP.Paths, networkingv1.HTTPIngressPath{
			Path: "/api", PathType: ptr(networkingv1.PathTypeExact), Backend: backend("web", "http")})
		e.must(cs.NetworkingV1().Ingresses(ns).Update(e.ctx, in, metav1.UpdateOptions{}))
		sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey] = []byte("CERT v2"), []byte("KEY v2")
		e.must(cs.CoreV1().Secrets(ns).Update(e.ctx, sec, metav1.UpdateOptions{}))
		if err := cs.CoreV1().Pods(ns).Delete(e.ctx, "ms", metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}); err != nil {
			t.Fatal(err)
		}
		if err := cs.CoreV1().Nodes().Delete(e.ctx, node, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		// An IngressClass naming the group through its parameters, and an Ingress of it.
		e.must(cs.NetworkingV1().IngressClasses().Create(e.ctx, &networkingv1.IngressClass{ObjectMeta: metav1.ObjectMeta{Name: class},
			Spec: networkingv1.IngressClassSpec{Controller: v1alpha1.ControllerName, Parameters: &networkingv1.IngressClassParametersReference{
				Kind: "Service", Name: "g1", Namespace: ptr(ns), Scope: ptr("Namespace")}}}, metav1.CreateOptions{}))
		e.t.Cleanup(func() { _ = cs.NetworkingV1().IngressClasses().Delete(e.ctx, class, metav1.DeleteOptions{}) })
		classy := ingress(ns, "classy", 0, "classy.example", []path{{"/", networkingv1.PathTypePrefix, "web", 80}})
		classy.CreationTimestamp = metav1.Time{}
		classy.Spec.IngressClassName = ptr(class)
		e.must(cs.NetworkingV1().Ingresses(ns).Create(e.ctx, classy, metav1.CreateOptions{}))
		waitSnapshot(t, r, func() model.Snapshot {
			return model.Snapshot{
				Groups: []model.Group{group(rep("n1", "10.1.0.1", model.Draining), rep("", "10.1.0.9", model.Ready))},
				Servers: []model.Server{
					{Group: ns + "/g1", Host: "classy.example", Locations: []model.Location{loc("/", model.PathPrefix, ns+"-web-80", ns+"/classy")}},
					{Group: ns + "/g1", Host: "example.com", TLSCertificate: ns + "/cert", Locations: []model.Location{
						loc("/", model.PathPrefix, ns+"-web-80", ns+"/site"),
						loc("/api", model.PathExact, ns+"-web-80", ns+"/site"),
					}},
				},
				Upstreams:    []model.Upstream{{Name: ns + "-web-80", Endpoints: aps("10.2.0.1:8080", "10.2.0.2:8080")}},
				Certificates: []model.Certificate{cert("v2")},
			}
		})
	})

	t.Run("delete", func(t *testing.T) {
		if err := cs.CoreV1().Services(ns).Delete(e.ctx, "web", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := cs.CoreV1().Secrets(ns).Delete(e.ctx, "cert", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, converge, func() string {
			got, err := cs.NetworkingV1().Ingresses(ns).Get(e.ctx, "classy", metav1.GetOptions{})
			if err != nil {
				return err.Error()
			}
			return cmp.Diff([]networkingv1.IngressLoadBalancerIngress{{IP: "192.0.2.10"}}, got.Status.LoadBalancer.Ingress)
		})
		if err := cs.NetworkingV1().IngressClasses().Delete(e.ctx, class, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, converge, func() string {
			got, err := cs.NetworkingV1().Ingresses(ns).Get(e.ctx, "classy", metav1.GetOptions{})
			if err != nil {
				return err.Error()
			}
			if len(got.Status.LoadBalancer.Ingress) != 0 {
				return fmt.Sprintf("classy status still %v after its class was deleted", got.Status.LoadBalancer.Ingress)
			}
			return ""
		})
		waitSnapshot(t, r, func() model.Snapshot {
			return model.Snapshot{
				Groups: []model.Group{group(rep("n1", "10.1.0.1", model.Draining), rep("", "10.1.0.9", model.Ready))},
				Servers: []model.Server{
					{Group: ns + "/g1", Host: "example.com", Locations: []model.Location{
						loc("/", model.PathPrefix, ns+"-web-80", ns+"/site"),
						loc("/api", model.PathExact, ns+"-web-http", ns+"/site"),
					}},
				},
				Upstreams: []model.Upstream{{Name: ns + "-web-80"}, {Name: ns + "-web-http"}},
			}
		})
		// Problems and their metric are set once the sync has published.
		testenv.Eventually(t, converge, func() string {
			problems := r.ctl.Problems()
			for _, want := range []model.Reason{model.ReasonServiceNotFound, model.ReasonSecretNotFound} {
				if !slices.ContainsFunc(problems, func(p model.Problem) bool { return p.Reason == want }) {
					return fmt.Sprintf("no %s problem in %v", want, problems)
				}
				if n := r.metric(t, "portico_controlplane_problems", map[string]string{"reason": string(want)}); n < 1 {
					return fmt.Sprintf("problems metric for %s = %v", want, n)
				}
			}
			return ""
		})
		testenv.Eventually(t, converge, func() string {
			if !hasEvent(e, "site", string(model.ReasonServiceNotFound)) {
				return "no ServiceNotFound event on the Ingress"
			}
			return ""
		})
		if err := cs.NetworkingV1().Ingresses(ns).Delete(e.ctx, "site", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := cs.DiscoveryV1().EndpointSlices(ns).Delete(e.ctx, "g1-a", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitSnapshot(t, r, func() model.Snapshot { return model.Snapshot{Groups: []model.Group{group()}} })
		if err := cs.CoreV1().Services(ns).Delete(e.ctx, "g1", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitSnapshot(t, r, func() model.Snapshot { return model.Snapshot{} })
	})
}

// TestIntegrationEmptyStart checks that sinks get a first snapshot even when there is
// nothing to serve (nginx starts from it with only the 444 default server).
func TestIntegrationEmptyStart(t *testing.T) {
	e := newEnv(t)
	r := e.start(nil)
	testenv.Eventually(t, converge, func() string {
		if _, n := r.sink.latest(); n != 1 {
			return fmt.Sprintf("sink got %d snapshots, want 1", n)
		}
		return ""
	})
}

// TestIntegrationSinkRetries checks that a failing sink gets the snapshot again.
func TestIntegrationSinkRetries(t *testing.T) {
	e := newEnv(t)
	e.svc(groupSvc("", "g1", 0, v1alpha1.AnnotationVIP, "192.0.2.10", v1alpha1.AnnotationVRID, "1"))
	sink := newRecordSink()
	sink.fail = 3
	r := e.start(func(c *Config) { c.Sinks = []Sink{sink} })
	r.sink = sink
	waitSnapshot(t, r, func() model.Snapshot {
		return model.Snapshot{Groups: []model.Group{{Name: e.ns + "/g1", VIPs: addrs("192.0.2.10"), VRID: 1,
			Ports: []model.Port{{Protocol: model.TCP, Port: 80}, {Protocol: model.TCP, Port: 443}}, HTTPPort: 80, HTTPSPort: 443}}}
	})
	if _, n := sink.latest(); n != 1 {
		t.Errorf("sink applied %d snapshots, want 1 (the same snapshot retried)", n)
	}
	// A change that does not change the model runs a sync but nothing downstream.
	unchanged := r.metric(t, "portico_controlplane_syncs_total", map[string]string{"result": "unchanged"})
	s, err := e.cs.CoreV1().Services(e.ns).Get(e.ctx, "g1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Annotations["example.com/unrelated"] = "x"
	e.must(e.cs.CoreV1().Services(e.ns).Update(e.ctx, s, metav1.UpdateOptions{}))
	testenv.Eventually(t, converge, func() string {
		if n := r.metric(t, "portico_controlplane_syncs_total", map[string]string{"result": "unchanged"}); n <= unchanged {
			return "no sync after the update"
		}
		return ""
	})
	if _, n := sink.latest(); n != 1 {
		t.Errorf("sink applied %d snapshots after an unrelated change, want still 1", n)
	}
}

// applyExample creates the objects of a deploy/examples file in the env's namespace
// (cluster-scoped objects keep their names; namespace references are rewritten).
func (e *env) applyExample(file string) {
	e.t.Helper()
	data, err := os.ReadFile("../deploy/examples/" + file)
	if err != nil {
		e.t.Fatal(err)
	}
	resources := map[string]schema.GroupVersionResource{
		"Service":      {Version: "v1", Resource: "services"},
		"Ingress":      {Group: "networking.k8s.io", Version: "v1", Resource: "ingresses"},
		"IngressClass": {Group: "networking.k8s.io", Version: "v1", Resource: "ingressclasses"},
		"IngressClaim": v1alpha1.IngressClaimResource,
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err == io.EOF {
			return
		} else if err != nil {
			e.t.Fatalf("decode %s: %v", file, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		gvr, ok := resources[u.GetKind()]
		if !ok {
			e.t.Fatalf("%s: unexpected kind %s", file, u.GetKind())
		}
		var ri dynamic.ResourceInterface = e.dyn.Resource(gvr)
		if u.GetNamespace() != "" {
			u.SetNamespace(e.ns)
			ri = e.dyn.Resource(gvr).Namespace(e.ns)
		}
		if _, ok, _ := unstructured.NestedString(u.Object, "spec", "parameters", "namespace"); ok {
			if err := unstructured.SetNestedField(u.Object, e.ns, "spec", "parameters", "namespace"); err != nil {
				e.t.Fatal(err)
			}
		}
		if _, err := ri.Create(e.ctx, u, metav1.CreateOptions{}); err != nil {
			e.t.Fatalf("%s: create %s %s: %v", file, u.GetKind(), u.GetName(), err)
		}
		if u.GetNamespace() == "" {
			name := u.GetName()
			e.t.Cleanup(func() { _ = ri.Delete(context.Background(), name, metav1.DeleteOptions{}) })
		}
	}
}

// TestIntegrationExamples applies deploy/examples and checks what they promise.
func TestIntegrationExamples(t *testing.T) {
	e := newEnv(t)
	e.applyExample("group.yaml")
	e.applyExample("web.yaml")
	e.applyExample("ingressclaim.yaml")
	pool, _ := ParsePool("198.18.0.0/30")
	r := e.start(func(c *Config) { c.Pools = []Pool{pool} })
	ns := e.ns
	waitSnapshot(t, r, func() model.Snapshot {
		ports := []model.Port{{Protocol: model.TCP, Port: 80}, {Protocol: model.TCP, Port: 443}}
		return model.Snapshot{
			Groups: []model.Group{
				{Name: ns + "/edge", VIPs: addrs("192.0.2.80"), VRID: 1, Ports: ports, HTTPPort: 80, HTTPSPort: 443},
				{Name: ns + "/shop", VIPs: addrs("198.18.0.1"), VRID: 2, Ports: ports, HTTPPort: 80, HTTPSPort: 443},
			},
			Servers: []model.Server{
				{Group: ns + "/edge", Host: "web.example.com", Locations: []model.Location{loc("/", model.PathPrefix, ns+"-web-80", ns+"/web")}},
				{Group: ns + "/shop", Host: "shop.example.com", Locations: []model.Location{loc("/cart", model.PathExact, ns+"-web-80", ns+"/shop")}},
			},
			Upstreams: []model.Upstream{{Name: ns + "-web-80"}},
		}
	})
}
