package controlplane

import (
	"reflect"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
)

// deepCopyState copies every object of st.
func deepCopyState(st State) State {
	return State{
		IngressClasses: deepCopies(st.IngressClasses), Ingresses: deepCopies(st.Ingresses),
		Services: deepCopies(st.Services), EndpointSlices: deepCopies(st.EndpointSlices),
		Secrets: deepCopies(st.Secrets), Pods: deepCopies(st.Pods), Nodes: deepCopies(st.Nodes),
	}
}

func deepCopies[T interface{ DeepCopy() T }](s []T) []T {
	var out []T
	for _, o := range s {
		out = append(out, o.DeepCopy())
	}
	return out
}

// TestBuildDoesNotMutate checks that Build leaves the (informer-cached) objects
// alone, on a state where every kind of object is read: a bound Ingress with TLS,
// its class, backend and group Services and slices, a pod route and a node.
func TestBuildDoesNotMutate(t *testing.T) {
	gs, gsl := g1Objects()
	ws, wsl := webObjects()
	ing := ingress("app", "site", 0, "Example.COM", []path{{"", "", "web", "http"}}, v1alpha1.AnnotationGroup, "edge/g1")
	ing.Spec.IngressClassName = ptr("portico")
	ing.Spec.TLS = []networkingv1.IngressTLS{{Hosts: []string{"Example.COM"}, SecretName: "c"}}
	class := &networkingv1.IngressClass{ObjectMeta: meta("", "portico", 0), Spec: networkingv1.IngressClassSpec{Controller: v1alpha1.ControllerName}}
	pod := microservice("app", "ms", 0, "10.3.0.1", "pods.example", "3000:/api", v1alpha1.AnnotationGroup, "edge/g1")
	node := &corev1.Node{ObjectMeta: meta("", "n2", 0), Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.1.0.2"}}}}
	st := state(gs, gsl, ws, wsl, ing, class, tlsSecret("app", "c"), pod, node)
	before := deepCopyState(st)

	snap, _, problems := Build(st, Options{})

	if len(problems) != 0 {
		t.Errorf("problems: %v", problems)
	}
	i := slices.IndexFunc(snap.Servers, func(s model.Server) bool { return s.Host == "example.com" })
	if i < 0 || snap.Servers[i].Group != "edge/g1" || snap.Servers[i].TLSCertificate != "app/c" {
		t.Fatalf("the Ingress is not served by edge/g1 with its TLS secret: %+v", snap.Servers)
	}
	if !slices.ContainsFunc(snap.Servers, func(s model.Server) bool { return s.Host == "pods.example" }) {
		t.Fatalf("the pod route is not served: %+v", snap.Servers)
	}
	if diff := cmp.Diff(before, st); diff != "" {
		t.Errorf("state mutated (-before +after):\n%s", diff)
	}
}

// TestBuildWithMemo: a Memo never changes what Build gives, across changes of
// the EndpointSlices (replaced, added, removed) and of the Services' ports,
// and it keeps only what the last Build used.
func TestBuildWithMemo(t *testing.T) {
	st := bigState(30)
	var m Memo
	check := func(step string) {
		t.Helper()
		want, wantB, wantP := Build(st, Options{})
		got, gotB, gotP := BuildWith(&m, st, Options{})
		if !got.Equal(want) || !reflect.DeepEqual(gotB, wantB) || !reflect.DeepEqual(gotP, wantP) {
			t.Fatalf("%s: BuildWith with a Memo differs from Build", step)
		}
	}
	check("first")
	check("unchanged")
	if n := len(m.endpoints); n != 30*3 {
		t.Errorf("the Memo keeps %d Service ports, want the 90 the Build used", n)
	}
	// An EndpointSlice replaced with fewer endpoints, one marked not ready.
	es := st.EndpointSlices[1].DeepCopy()
	es.Endpoints = es.Endpoints[2:]
	es.Endpoints[0].Conditions.Ready = ptr(false)
	st.EndpointSlices[1] = es
	check("slice replaced")
	// A second slice for a Service, then the first removed.
	extra := st.EndpointSlices[2].DeepCopy()
	extra.Name += "-extra"
	extra.Endpoints[0].Addresses = []string{"10.200.0.1"}
	st.EndpointSlices = append(st.EndpointSlices, extra)
	check("slice added")
	st.EndpointSlices = slices.Delete(st.EndpointSlices, 2, 3)
	check("slice removed")
	// A Service's port renamed: its paths by name lose it.
	svc := st.Services[3].DeepCopy()
	svc.Spec.Ports[0].Name = "renamed"
	st.Services[3] = svc
	check("port renamed")
	// Ingresses removed: the Memo forgets their Services' ports.
	st.Ingresses = st.Ingresses[:10]
	check("ingresses removed")
	// Ten Ingresses of three ports each, but the renamed one's.
	if n := len(m.endpoints); n != 10*3-1 {
		t.Errorf("the Memo keeps %d Service ports after 20 Ingresses went, want 29", n)
	}
}
