package controlplane

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/testenv"
)

// gwApply creates or updates a Gateway API object through the dynamic client.
func (e *env) gwApply(r schema.GroupVersionResource, kind string, obj metav1.Object) {
	e.t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		e.t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion(gatewayv1.SchemeGroupVersion.String())
	u.SetKind(kind)
	u.SetCreationTimestamp(metav1.Time{})
	ri := e.dyn.Resource(r).Namespace(obj.GetNamespace())
	if obj.GetNamespace() == "" {
		ri = nil
	}
	var err2 error
	if ri != nil {
		cur, gerr := ri.Get(e.ctx, obj.GetName(), metav1.GetOptions{})
		if gerr == nil {
			u.SetResourceVersion(cur.GetResourceVersion())
			_, err2 = ri.Update(e.ctx, u, metav1.UpdateOptions{})
		} else {
			_, err2 = ri.Create(e.ctx, u, metav1.CreateOptions{})
		}
	} else {
		_, err2 = e.dyn.Resource(r).Create(e.ctx, u, metav1.CreateOptions{})
		if err2 == nil {
			e.t.Cleanup(func() { e.dyn.Resource(r).Delete(e.ctx, obj.GetName(), metav1.DeleteOptions{}) })
		}
	}
	if err2 != nil {
		e.t.Fatalf("apply %s %s: %v", kind, obj.GetName(), err2)
	}
}

// gwGet reads a Gateway API object into out.
func (e *env) gwGet(r schema.GroupVersionResource, ns, name string, out runtime.Object) error {
	var u *unstructured.Unstructured
	var err error
	if ns == "" {
		u, err = e.dyn.Resource(r).Get(e.ctx, name, metav1.GetOptions{})
	} else {
		u, err = e.dyn.Resource(r).Namespace(ns).Get(e.ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return err
	}
	return runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out)
}

// TestIntegrationGateway runs the controller on a real API server with Gateway
// API's CRDs: a Gateway of Portico's class on the default group, an HTTPRoute
// attached to it; the route reaches the snapshot, and the class, the Gateway
// (its address the group's VIP, Programmed: no agent reports, so no edge lags)
// and the route get their statuses; a change of the route reaches both.
func TestIntegrationGateway(t *testing.T) {
	e := newEnv(t)
	class := "portico-" + e.ns
	r := e.start(func(c *Config) { c.PodRouteGroup = e.ns + "/g" })
	e.svc(groupSvc("", "g", 0, v1alpha1.AnnotationVIP, "192.0.2.40"))
	e.svc(backendSvc("", "web", sport("http", 8080)))
	e.slice(slice("", "web", "web-a", "http", 8080, ep{addr: "10.9.0.1", ready: true}))
	e.gwApply(gatewayClassesResource, "GatewayClass", gwClass(class, v1alpha1.GatewayControllerName))
	gw := gateway(e.ns, "gw", 0, listener("http", gatewayv1.HTTPProtocolType, 80, ""))
	gw.Spec.GatewayClassName = gatewayv1.ObjectName(class)
	e.gwApply(gatewaysResource, "Gateway", gw)
	route := httpRoute(e.ns, "web", 0, []gatewayv1.ParentReference{parent("", "gw", "")}, []string{"web.example"},
		gatewayv1.HTTPRouteRule{BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("", "web", 8080, 1)}})
	e.gwApply(httpRoutesResource, "HTTPRoute", route)

	upstream := e.ns + "-web-8080"
	server := func(snap model.Snapshot, host string) (model.Server, bool) {
		for _, s := range snap.Servers {
			if s.Host == host {
				return s, true
			}
		}
		return model.Server{}, false
	}
	testenv.Eventually(t, converge, func() string {
		snap, _ := r.sink.latest()
		s, ok := server(snap, "web.example")
		if !ok || len(s.Locations) != 1 || s.Locations[0].Upstream != upstream {
			return fmt.Sprintf("web.example: %+v", s)
		}
		return ""
	})
	status := func(want map[string]string) func() string {
		return func() string {
			var gc gatewayv1.GatewayClass
			var g gatewayv1.Gateway
			var hr gatewayv1.HTTPRoute
			if err := e.gwGet(gatewayClassesResource, "", class, &gc); err != nil {
				return err.Error()
			}
			if err := e.gwGet(gatewaysResource, e.ns, "gw", &g); err != nil {
				return err.Error()
			}
			if err := e.gwGet(httpRoutesResource, e.ns, "web", &hr); err != nil {
				return err.Error()
			}
			got := map[string]string{"class": conds(gc.Status.Conditions)["Accepted"], "programmed": conds(g.Status.Conditions)["Programmed"],
				"features": fmt.Sprint(len(gc.Status.SupportedFeatures))}
			if len(g.Status.Addresses) == 1 {
				got["address"] = g.Status.Addresses[0].Value
			}
			if len(g.Status.Listeners) == 1 {
				got["attached"] = fmt.Sprint(g.Status.Listeners[0].AttachedRoutes)
			}
			if len(hr.Status.Parents) == 1 {
				c := conds(hr.Status.Parents[0].Conditions)
				got["route"] = c["Accepted"] + " " + c["ResolvedRefs"]
				got["observed"] = fmt.Sprint(hr.Status.Parents[0].Conditions[0].ObservedGeneration)
			}
			for k, v := range want {
				if got[k] != v {
					return fmt.Sprintf("%s = %q, want %q (all: %v)", k, got[k], v, got)
				}
			}
			return ""
		}
	}
	testenv.Eventually(t, converge, status(map[string]string{"class": "True/Accepted", "features": fmt.Sprint(len(GatewayFeatures)), "programmed": "True/Programmed",
		"address": "192.0.2.40", "attached": "1", "route": "True/Accepted True/ResolvedRefs", "observed": "1"}))

	// A header match and a backend that does not exist: both reach the
	// snapshot and the route's status, with its new generation.
	route.Spec.Rules = append(route.Spec.Rules, gatewayv1.HTTPRouteRule{
		Matches:     []gatewayv1.HTTPRouteMatch{{Headers: []gatewayv1.HTTPHeaderMatch{{Name: "X-Canary", Value: "1"}}}},
		BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("", "missing", 80, 1)}})
	e.gwApply(httpRoutesResource, "HTTPRoute", route)
	testenv.Eventually(t, converge, func() string {
		snap, _ := r.sink.latest()
		s, _ := server(snap, "web.example")
		if len(s.Locations) != 2 || s.Locations[0].Status != 500 || len(s.Locations[0].Match.Headers) != 1 {
			return fmt.Sprintf("web.example: %+v", s.Locations)
		}
		return ""
	})
	testenv.Eventually(t, converge, status(map[string]string{"route": "True/Accepted False/BackendNotFound", "observed": "2"}))
}

// TestIntegrationGatewayAddresses: with a VIP pool, each Gateway gets an
// address of its own, written in its status; an L4 Service created after them
// is not given theirs; when the older Gateway goes, and when another
// controller takes over, the other keeps its address (its status is the
// record); a new Gateway takes the lowest free one.
func TestIntegrationGatewayAddresses(t *testing.T) {
	e := newEnv(t)
	class := "portico-" + e.ns
	start := func() *running {
		return e.start(func(c *Config) {
			c.PodRouteGroup = e.ns + "/g"
			c.Pools = []Pool{mustPool(t, "192.0.2.96/29")}
		})
	}
	r := start()
	e.svc(groupSvc("", "g", 0, v1alpha1.AnnotationVIP, "192.0.2.40"))
	e.gwApply(gatewayClassesResource, "GatewayClass", gwClass(class, v1alpha1.GatewayControllerName))
	apply := func(name string) {
		gw := gateway(e.ns, name, 0, listener("http", gatewayv1.HTTPProtocolType, 80, ""))
		gw.Spec.GatewayClassName = gatewayv1.ObjectName(class)
		e.gwApply(gatewaysResource, "Gateway", gw)
	}
	address := func(name, want string) func() string {
		return func() string {
			var g gatewayv1.Gateway
			if err := e.gwGet(gatewaysResource, e.ns, name, &g); err != nil {
				return err.Error()
			}
			if len(g.Status.Addresses) != 1 || g.Status.Addresses[0].Value != want {
				return fmt.Sprintf("Gateway %s addresses %v, want %s", name, g.Status.Addresses, want)
			}
			return ""
		}
	}
	apply("one")
	testenv.Eventually(t, converge, address("one", "192.0.2.97"))
	apply("two")
	testenv.Eventually(t, converge, address("two", "192.0.2.98"))

	l4 := backendSvc("", "dns", sport("dns", 53))
	l4.Spec.Type = corev1.ServiceTypeLoadBalancer
	l4.Spec.LoadBalancerClass = ptr(v1alpha1.LoadBalancerClass)
	e.svc(l4)
	testenv.Eventually(t, converge, func() string {
		s, err := e.cs.CoreV1().Services(e.ns).Get(e.ctx, "dns", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if v := s.Annotations[v1alpha1.AnnotationVIP]; v != "192.0.2.99" {
			return fmt.Sprintf("L4 Service's VIP %q, want 192.0.2.99 (the Gateways hold .97 and .98)", v)
		}
		return ""
	})

	if err := e.dyn.Resource(gatewaysResource).Namespace(e.ns).Delete(e.ctx, "one", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	r.stop()
	r = start()
	defer r.stop()
	testenv.Eventually(t, converge, func() string {
		snap, _ := r.sink.latest()
		if len(snap.Views) != 1 || snap.Views[0].Name != e.ns+"/two" || len(snap.Views[0].VIPs) != 1 || snap.Views[0].VIPs[0].String() != "192.0.2.98" {
			return fmt.Sprintf("views %+v, want two's alone, on 192.0.2.98", snap.Views)
		}
		return ""
	})
	testenv.Eventually(t, converge, address("two", "192.0.2.98"))
	apply("three")
	testenv.Eventually(t, converge, address("three", "192.0.2.97"))
}
