package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"

	"github.com/portico-edge/portico/api/agentstatus"
	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/deploy"
	"github.com/portico-edge/portico/test/testenv"
)

const converge = 20 * time.Second

// waitSnapshot waits until the sink's latest snapshot equals want.
func waitSnapshot(t *testing.T, r *running, want func() model.Snapshot) {
	t.Helper()
	testenv.Eventually(t, converge, func() string {
		got, _ := r.sink.latest()
		if d := cmp.Diff(want(), got, cmpAddrs); d != "" {
			return "snapshot (-want +got):\n" + d
		}
		return ""
	})
}

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

func annotations(t *testing.T, e *env, kind, name string) map[string]string {
	t.Helper()
	var m metav1.Object
	var err error
	switch kind {
	case "Service":
		m, err = e.cs.CoreV1().Services(e.ns).Get(e.ctx, name, metav1.GetOptions{})
	case "Ingress":
		m, err = e.cs.NetworkingV1().Ingresses(e.ns).Get(e.ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return map[string]string{"error": err.Error()}
	}
	return m.GetAnnotations()
}

func hasEvent(e *env, name, reason string) bool {
	evs, err := e.cs.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		return false
	}
	for _, ev := range evs.Items {
		if ev.InvolvedObject.Name == name && ev.Reason == reason {
			return true
		}
	}
	return false
}

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
			return cmp.Diff([]corev1.LoadBalancerIngress{{IP: "198.51.100.4", IPMode: ptr(corev1.LoadBalancerIPModeVIP)}}, s.Status.LoadBalancer.Ingress)
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

// TestIntegrationLeaderFailover runs two controllers on one Lease: only the leader
// writes; when it is killed (Lease not released), the other takes over the writes.
func TestIntegrationLeaderFailover(t *testing.T) {
	e := newEnv(t)
	pool, _ := ParsePool("192.0.2.0/28")
	cfg := func(id string) func(*Config) {
		return func(c *Config) { c.Pools = []Pool{pool}; c.Identity = id; c.ReleaseOnCancel = false }
	}
	a := e.start(cfg("a"))
	b := e.start(cfg("b"))
	var leader, follower *running
	testenv.Eventually(t, converge, func() string {
		switch {
		case a.ctl.IsLeader() && !b.ctl.IsLeader():
			leader, follower = a, b
		case b.ctl.IsLeader() && !a.ctl.IsLeader():
			leader, follower = b, a
		default:
			return fmt.Sprintf("leaders: a=%v b=%v", a.ctl.IsLeader(), b.ctl.IsLeader())
		}
		return ""
	})
	e.svc(groupSvc("", "g1", 0))
	testenv.Eventually(t, converge, func() string {
		if v := annotations(t, e, "Service", "g1")[v1alpha1.AnnotationVIP]; v != "192.0.2.1" {
			return "g1 VIP " + v
		}
		return ""
	})
	// Both read: the follower's sink has the allocated VIP too.
	waitSnapshot(t, follower, func() model.Snapshot {
		return model.Snapshot{Groups: []model.Group{{Name: e.ns + "/g1", VIPs: addrs("192.0.2.1"), VRID: 1,
			Ports: []model.Port{{Protocol: model.TCP, Port: 80}, {Protocol: model.TCP, Port: 443}}, HTTPPort: 80, HTTPSPort: 443}}}
	})

	// A write is counted once its request returns, which can be after the informers
	// have shown the annotation: the leader's count is waited for.
	testenv.Eventually(t, converge, func() string {
		if n := leader.metric(t, "portico_controlplane_writes_total", map[string]string{"write": "annotate-service", "result": "ok"}); n < 2 {
			return fmt.Sprintf("the leader made %v annotation writes, want VRID and VIP", n)
		}
		return ""
	})
	if n := follower.metric(t, "portico_controlplane_writes_total", nil); n > 0 {
		t.Errorf("the follower made %v writes", n)
	}
	leader.stop()
	killed := time.Now()
	e.svc(groupSvc("", "g2", 0))
	testenv.Eventually(t, converge, func() string {
		if !follower.ctl.IsLeader() {
			return "follower has not taken over"
		}
		if v := annotations(t, e, "Service", "g2")[v1alpha1.AnnotationVIP]; v != "192.0.2.2" {
			return "g2 VIP " + v
		}
		return ""
	})
	took := time.Since(killed)
	t.Logf("takeover and first write %v after the leader was killed (lease 2s)", took)
	if took < time.Second {
		t.Errorf("takeover after %v: the killed leader's Lease was released or not respected", took)
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

// TestIntegrationIngressAddressWaitsForEdges: an Ingress's first address waits
// until every edge of its group with a ready replica reports serving its generation (in the
// agents' status Leases); an edge that never does holds it back only for
// ServeTimeout, after which the address is written with a Warning Event.
func TestIntegrationIngressAddressWaitsForEdges(t *testing.T) {
	e := newEnv(t)
	ns, cs := e.ns, e.cs
	e.svc(groupSvc("", "g1", 0, v1alpha1.AnnotationVIP, "192.0.2.10", v1alpha1.AnnotationVRID, "7"))
	e.slice(slice("", "g1", "g1-a", "http", 80, ep{addr: "10.1.0.1", node: "n1", ready: true}, ep{addr: "10.1.0.2", node: "n2", ready: true},
		ep{addr: "10.1.0.3", node: "n3"}))
	e.svc(backendSvc("", "web", sport("http", 80)))
	e.slice(slice("", "web", "web-1", "http", 8080, ep{addr: "10.2.0.1", ready: true}))
	report := func(node string, served map[string]int64) {
		t.Helper()
		b, err := json.Marshal(map[string]any{"node": node, "group": ns + "/g1", "served": served})
		if err != nil {
			t.Fatal(err)
		}
		now, secs := metav1.NewMicroTime(time.Now()), int32(60)
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "portico-agent-" + node, Namespace: ns,
			Labels: map[string]string{agentstatus.LabelAgent: "true"}, Annotations: map[string]string{agentstatus.AnnotationState: string(b)}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &node, RenewTime: &now, LeaseDurationSeconds: &secs}}
		old, err := cs.CoordinationV1().Leases(ns).Get(e.ctx, l.Name, metav1.GetOptions{})
		if err == nil {
			l.ResourceVersion = old.ResourceVersion
			e.must(cs.CoordinationV1().Leases(ns).Update(e.ctx, l, metav1.UpdateOptions{}))
			return
		}
		e.must(cs.CoordinationV1().Leases(ns).Create(e.ctx, l, metav1.CreateOptions{}))
	}
	address := func(name string) string {
		got, err := cs.NetworkingV1().Ingresses(ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if len(got.Status.LoadBalancer.Ingress) == 0 {
			return ""
		}
		return got.Status.LoadBalancer.Ingress[0].IP
	}
	report("n1", nil)
	report("n2", nil)
	report("n3", nil) // not ready: not waited for
	e.start(func(c *Config) { c.ServeTimeout = 4 * time.Second })

	created := time.Now()
	ing := ingress(ns, "a", 0, "a.example", []path{{"/", networkingv1.PathTypePrefix, "web", 80}}, v1alpha1.AnnotationGroup, "g1")
	ing.CreationTimestamp = metav1.Time{}
	got, err := cs.NetworkingV1().Ingresses(ns).Create(e.ctx, ing, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gen := got.Generation
	time.Sleep(1500 * time.Millisecond)
	if a := address("a"); a != "" {
		t.Fatalf("address %s written before any edge served the Ingress", a)
	}
	report("n1", map[string]int64{ns + "/a": gen})
	time.Sleep(1500 * time.Millisecond)
	if a := address("a"); a != "" {
		t.Fatalf("address %s written while edge n2 did not serve the Ingress", a)
	}
	served := time.Now()
	report("n2", map[string]int64{ns + "/a": gen})
	testenv.Eventually(t, converge, func() string {
		if a := address("a"); a != "192.0.2.10" {
			return fmt.Sprintf("address %q, want 192.0.2.10", a)
		}
		return ""
	})
	t.Logf("address written %v after the last edge reported serving the Ingress (%v after its creation)",
		time.Since(served).Round(time.Millisecond), time.Since(created).Round(time.Millisecond))
	if since := time.Since(served); since > 3*time.Second {
		t.Errorf("address written %v after every edge served the Ingress, want well within the 4s bound", since)
	}

	// An edge that never serves it: the bound, then the address and an Event.
	ing = ingress(ns, "b", 0, "b.example", []path{{"/", networkingv1.PathTypePrefix, "web", 80}}, v1alpha1.AnnotationGroup, "g1")
	ing.CreationTimestamp = metav1.Time{}
	created = time.Now()
	e.must(cs.NetworkingV1().Ingresses(ns).Create(e.ctx, ing, metav1.CreateOptions{}))
	testenv.Eventually(t, converge, func() string {
		if a := address("b"); a != "192.0.2.10" {
			return fmt.Sprintf("address %q, want 192.0.2.10", a)
		}
		return ""
	})
	took := time.Since(created)
	t.Logf("address of an Ingress no edge serves written after %v (bound 4s)", took.Round(time.Millisecond))
	if took < 3500*time.Millisecond {
		t.Errorf("address written after %v, before the 4s bound", took)
	}
	testenv.Eventually(t, converge, func() string {
		evs, err := cs.CoreV1().Events(ns).List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=b,reason=EdgesNotServing"})
		if err != nil {
			return err.Error()
		}
		if len(evs.Items) == 0 || !strings.Contains(evs.Items[0].Message, "n1, n2") {
			return fmt.Sprintf("no EdgesNotServing Event naming n1, n2: %+v", evs.Items)
		}
		return ""
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
