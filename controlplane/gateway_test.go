package controlplane

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/testcert"
)

// Gateway API objects for the tests.

func gwClass(name, controller string) *gatewayv1.GatewayClass {
	return &gatewayv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1},
		Spec: gatewayv1.GatewayClassSpec{ControllerName: gatewayv1.GatewayController(controller)}}
}

func gateway(ns, name string, age int, listeners ...gatewayv1.Listener) *gatewayv1.Gateway {
	g := &gatewayv1.Gateway{ObjectMeta: meta(ns, name, age), Spec: gatewayv1.GatewaySpec{GatewayClassName: "portico", Listeners: listeners}}
	g.Generation = 3
	return g
}

func listener(name string, proto gatewayv1.ProtocolType, port int32, host string) gatewayv1.Listener {
	l := gatewayv1.Listener{Name: gatewayv1.SectionName(name), Protocol: proto, Port: gatewayv1.PortNumber(port)}
	if host != "" {
		l.Hostname = ptr(gatewayv1.Hostname(host))
	}
	return l
}

func allowAll(l gatewayv1.Listener) gatewayv1.Listener {
	l.AllowedRoutes = &gatewayv1.AllowedRoutes{Namespaces: &gatewayv1.RouteNamespaces{From: ptr(gatewayv1.NamespacesFromAll)}}
	return l
}

func withCert(l gatewayv1.Listener, ns, name string) gatewayv1.Listener {
	ref := gatewayv1.SecretObjectReference{Name: gatewayv1.ObjectName(name)}
	if ns != "" {
		ref.Namespace = ptr(gatewayv1.Namespace(ns))
	}
	l.TLS = &gatewayv1.ListenerTLSConfig{CertificateRefs: []gatewayv1.SecretObjectReference{ref}}
	return l
}

func parent(ns, name, section string) gatewayv1.ParentReference {
	p := gatewayv1.ParentReference{Name: gatewayv1.ObjectName(name)}
	if ns != "" {
		p.Namespace = ptr(gatewayv1.Namespace(ns))
	}
	if section != "" {
		p.SectionName = ptr(gatewayv1.SectionName(section))
	}
	return p
}

func backendRef(ns, name string, port int32, weight int32) gatewayv1.HTTPBackendRef {
	r := gatewayv1.HTTPBackendRef{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{
		Name: gatewayv1.ObjectName(name), Port: ptr(gatewayv1.PortNumber(port))}, Weight: ptr(weight)}}
	if ns != "" {
		r.Namespace = ptr(gatewayv1.Namespace(ns))
	}
	return r
}

func httpRoute(ns, name string, age int, parents []gatewayv1.ParentReference, hosts []string, rules ...gatewayv1.HTTPRouteRule) *gatewayv1.HTTPRoute {
	r := &gatewayv1.HTTPRoute{ObjectMeta: meta(ns, name, age)}
	r.Generation = 2
	r.Spec.ParentRefs = parents
	for _, h := range hosts {
		r.Spec.Hostnames = append(r.Spec.Hostnames, gatewayv1.Hostname(h))
	}
	r.Spec.Rules = rules
	return r
}

func prefixMatch(p string) gatewayv1.HTTPRouteMatch {
	return gatewayv1.HTTPRouteMatch{Path: &gatewayv1.HTTPPathMatch{Type: ptr(gatewayv1.PathMatchPathPrefix), Value: ptr(p)}}
}

func realTLSSecret(t *testing.T, ns, name, host string) *corev1.Secret {
	t.Helper()
	crt, key, err := testcert.ECDSA(host)
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.Secret{ObjectMeta: meta(ns, name, 0), Type: corev1.SecretTypeTLS, Data: map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key}}
}

// gatewayState is a group edge/g with VIP 192.0.2.10, the class portico (and
// another controller's), and the Services the routes name.
func gatewayState(t *testing.T) State {
	return State{
		Services: []*corev1.Service{
			groupSvc("edge", "g", 0, v1alpha1.AnnotationVIP, "192.0.2.10"),
			backendSvc("app", "v1", sport("http", 8080)), backendSvc("app", "v2", sport("http", 8080)),
			backendSvc("other", "svc", sport("http", 80)),
		},
		EndpointSlices: []*discoveryv1.EndpointSlice{
			slice("app", "v1", "v1-a", "http", 8080, ep{addr: "10.1.0.1", ready: true}),
			slice("app", "v2", "v2-a", "http", 8080, ep{addr: "10.1.0.2", ready: true}),
			slice("other", "svc", "svc-a", "http", 80, ep{addr: "10.2.0.1", ready: true}),
		},
		Secrets:        []*corev1.Secret{realTLSSecret(t, "infra", "tls", "*.example.com"), tlsSecret("infra", "broken"), realTLSSecret(t, "other", "tls", "x.test")},
		GatewayClasses: []*gatewayv1.GatewayClass{gwClass("portico", v1alpha1.GatewayControllerName), gwClass("else", "example.com/other")},
		Namespaces: []*corev1.Namespace{
			{ObjectMeta: metav1.ObjectMeta{Name: "app", Labels: map[string]string{"team": "a"}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "other"}},
		},
	}
}

func conds(cs []metav1.Condition) map[string]string {
	out := map[string]string{}
	for _, c := range cs {
		out[c.Type] = string(c.Status) + "/" + c.Reason
	}
	return out
}

func TestGatewayRoutes(t *testing.T) {
	st := gatewayState(t)
	st.Gateways = []*gatewayv1.Gateway{gateway("infra", "gw", 0,
		allowAll(listener("http", gatewayv1.HTTPProtocolType, 80, "")),
		allowAll(withCert(listener("https", gatewayv1.HTTPSProtocolType, 443, "*.example.com"), "", "tls")))}
	st.HTTPRoutes = []*gatewayv1.HTTPRoute{
		// Newer, but its rule has a header: it comes first on "/".
		httpRoute("app", "b", 2, []gatewayv1.ParentReference{parent("infra", "gw", "")}, []string{"a.example.com"},
			gatewayv1.HTTPRouteRule{Matches: []gatewayv1.HTTPRouteMatch{{Headers: []gatewayv1.HTTPHeaderMatch{{Name: "Version", Value: "2"}}}},
				BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("", "v2", 8080, 1)}}),
		httpRoute("app", "a", 1, []gatewayv1.ParentReference{parent("infra", "gw", "")}, []string{"a.example.com"},
			gatewayv1.HTTPRouteRule{BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("", "v1", 8080, 1)}},
			gatewayv1.HTTPRouteRule{Matches: []gatewayv1.HTTPRouteMatch{prefixMatch("/split")},
				BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("", "v1", 8080, 3), backendRef("", "v2", 8080, 1), backendRef("", "gone", 80, 1)}},
			gatewayv1.HTTPRouteRule{Matches: []gatewayv1.HTTPRouteMatch{prefixMatch("/old")},
				Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestRedirect, RequestRedirect: &gatewayv1.HTTPRequestRedirectFilter{
					Scheme: ptr("https"), StatusCode: ptr(301), Path: &gatewayv1.HTTPPathModifier{Type: gatewayv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptr("/new")}}}}}),
		// Every host of the HTTP listener (no hostname on either side).
		httpRoute("app", "c", 3, []gatewayv1.ParentReference{parent("infra", "gw", "http")}, nil,
			gatewayv1.HTTPRouteRule{Matches: []gatewayv1.HTTPRouteMatch{{Path: &gatewayv1.HTTPPathMatch{Type: ptr(gatewayv1.PathMatchExact), Value: ptr("/x")}, Method: ptr(gatewayv1.HTTPMethodPost)}},
				BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("", "v1", 8080, 1)}}),
	}
	res := BuildAll(nil, st, Options{PodRouteGroup: "edge/g"})
	if err := res.Snapshot.Validate(); err != nil {
		t.Fatal(err)
	}
	srv := map[string]model.Server{}
	for _, s := range res.Snapshot.Servers {
		srv[s.Host] = s
	}
	up := func(name string) string { return name }
	want := model.Server{Group: "edge/g", Host: "a.example.com", TLSCertificate: "infra/tls", Locations: []model.Location{
		{Path: "/", Type: model.PathPrefix, Rank: 1, Upstream: up("app-v2-8080"), Source: "app/b", Match: model.RequestMatch{Headers: []model.NameValue{{Name: "version", Value: "2"}}}},
		{Path: "/", Type: model.PathPrefix, Rank: 2, Upstream: up("app-v1-8080"), Source: "app/a"},
		{Path: "/old", Type: model.PathPrefix, Rank: 4, Source: "app/a", Status: 301, Filters: model.Filters{Redirect: &model.Redirect{Scheme: "https", Path: model.PathChange{Type: model.PathChangePrefix, Value: "/new"}}}},
		{Path: "/split", Type: model.PathPrefix, Rank: 3, Source: "app/a", Backends: []model.Backend{{Upstream: "app-v1-8080", Weight: 3}, {Upstream: "app-v2-8080", Weight: 1}, {Status: 500, Weight: 1}}},
	}}
	if d := cmp.Diff(want, srv["a.example.com"]); d != "" {
		t.Errorf("a.example.com (-want +got):\n%s", d)
	}
	wantAll := model.Server{Group: "edge/g", Host: "", Locations: []model.Location{
		{Path: "/x", Type: model.PathExact, Rank: 1, Upstream: "app-v1-8080", Source: "app/c", Match: model.RequestMatch{Method: "POST"}}}}
	if d := cmp.Diff(wantAll, srv[""]); d != "" {
		t.Errorf("catch-all (-want +got):\n%s", d)
	}

	if g := res.Snapshot.Groups[0]; g.UnmatchedHost != model.UnmatchedHostNotFound {
		t.Errorf("group %s answers unmatched hosts %q, want 404 (it serves a Gateway)", g.Name, g.UnmatchedHost)
	}
	gs := res.Gateways.Gateways["infra/gw"]
	if got := conds(gs.Conditions); got["Accepted"] != "True/Accepted" || got["Programmed"] != "True/Programmed" {
		t.Errorf("Gateway conditions %v", got)
	}
	if len(gs.Addresses) != 1 || gs.Addresses[0].Value != "192.0.2.10" {
		t.Errorf("Gateway addresses %v, want the group's VIP", gs.Addresses)
	}
	attached := map[string]int32{}
	for _, l := range gs.Listeners {
		attached[string(l.Name)] = l.AttachedRoutes
		if got := conds(l.Conditions); got["Accepted"] != "True/Accepted" || got["ResolvedRefs"] != "True/ResolvedRefs" || got["Conflicted"] != "False/NoConflicts" {
			t.Errorf("listener %s conditions %v", l.Name, got)
		}
	}
	if d := cmp.Diff(map[string]int32{"http": 3, "https": 2}, attached); d != "" {
		t.Errorf("attached routes (-want +got):\n%s", d)
	}
	for name, want := range map[string]map[string]string{
		"app/a": {"Accepted": "True/Accepted", "ResolvedRefs": "False/BackendNotFound"},
		"app/b": {"Accepted": "True/Accepted", "ResolvedRefs": "True/ResolvedRefs"},
		"app/c": {"Accepted": "True/Accepted", "ResolvedRefs": "True/ResolvedRefs"},
	} {
		ps := res.Gateways.Routes[name]
		if len(ps) != 1 || ps[0].ControllerName != v1alpha1.GatewayControllerName {
			t.Fatalf("%s parents %+v, want one of Portico's", name, ps)
		}
		if d := cmp.Diff(want, conds(ps[0].Conditions)); d != "" {
			t.Errorf("%s conditions (-want +got):\n%s", name, d)
		}
	}
	if c := res.Gateways.Classes["portico"]; len(c) != 1 || c[0].Status != metav1.ConditionTrue {
		t.Errorf("class portico: %v", c)
	}
	if _, ok := res.Gateways.Classes["else"]; ok {
		t.Error("another controller's class got a status")
	}
}

func TestGatewayStatusReasons(t *testing.T) {
	st := gatewayState(t)
	st.Gateways = []*gatewayv1.Gateway{
		gateway("infra", "gw", 0,
			listener("same", gatewayv1.HTTPProtocolType, 80, "same.test"),
			func() gatewayv1.Listener {
				l := listener("selected", gatewayv1.HTTPProtocolType, 80, "sel.test")
				l.AllowedRoutes = &gatewayv1.AllowedRoutes{Namespaces: &gatewayv1.RouteNamespaces{From: ptr(gatewayv1.NamespacesFromSelector),
					Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}}}
				return l
			}(),
			listener("tcp", gatewayv1.TCPProtocolType, 9000, ""),
			listener("other-port", gatewayv1.HTTPProtocolType, 8080, ""),
			func() gatewayv1.Listener {
				l := listener("kinds", gatewayv1.HTTPProtocolType, 80, "kinds.test")
				l.AllowedRoutes = &gatewayv1.AllowedRoutes{Kinds: []gatewayv1.RouteGroupKind{{Kind: "TCPRoute"}}}
				return l
			}(),
			withCert(listener("missing", gatewayv1.HTTPSProtocolType, 443, "m.test"), "", "nothing"),
			withCert(listener("malformed", gatewayv1.HTTPSProtocolType, 443, "b.test"), "", "broken"),
			withCert(listener("elsewhere", gatewayv1.HTTPSProtocolType, 443, "x.test"), "other", "tls"),
		),
		gateway("infra", "none", 1, listener("udp", gatewayv1.UDPProtocolType, 53, "")),
	}
	st.HTTPRoutes = []*gatewayv1.HTTPRoute{
		httpRoute("app", "wrong-section", 1, []gatewayv1.ParentReference{parent("infra", "gw", "nope")}, nil),
		httpRoute("app", "not-same", 2, []gatewayv1.ParentReference{parent("infra", "gw", "same")}, nil),
		httpRoute("app", "selected", 3, []gatewayv1.ParentReference{parent("infra", "gw", "selected")}, []string{"sel.test", "other.test"},
			gatewayv1.HTTPRouteRule{BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("other", "svc", 80, 1)}}),
		httpRoute("other", "unselected", 4, []gatewayv1.ParentReference{parent("infra", "gw", "selected")}, nil),
		httpRoute("infra", "hostless", 5, []gatewayv1.ParentReference{parent("", "gw", "same")}, []string{"elsewhere.test"}),
		httpRoute("infra", "redirect-exact", 6, []gatewayv1.ParentReference{parent("", "gw", "same")}, nil,
			gatewayv1.HTTPRouteRule{Matches: []gatewayv1.HTTPRouteMatch{{Path: &gatewayv1.HTTPPathMatch{Type: ptr(gatewayv1.PathMatchExact), Value: ptr("/e")}}},
				Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestRedirect, RequestRedirect: &gatewayv1.HTTPRequestRedirectFilter{
					Path: &gatewayv1.HTTPPathModifier{Type: gatewayv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptr("/x")}}}}},
			gatewayv1.HTTPRouteRule{Matches: []gatewayv1.HTTPRouteMatch{prefixMatch("/ext")},
				Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterExtensionRef}}}),
		httpRoute("infra", "unsupported", 7, []gatewayv1.ParentReference{parent("", "gw", "same")}, nil,
			gatewayv1.HTTPRouteRule{Matches: []gatewayv1.HTTPRouteMatch{{Path: &gatewayv1.HTTPPathMatch{Type: ptr(gatewayv1.PathMatchRegularExpression), Value: ptr("/.*")}}}}),
		httpRoute("infra", "invalid-kind", 8, []gatewayv1.ParentReference{parent("", "gw", "same")}, nil,
			gatewayv1.HTTPRouteRule{BackendRefs: []gatewayv1.HTTPBackendRef{func() gatewayv1.HTTPBackendRef {
				r := backendRef("", "x", 80, 1)
				r.Kind = ptr(gatewayv1.Kind("Pod"))
				return r
			}()}}),
		// Another controller's Gateway: no status from Portico.
		httpRoute("app", "foreign", 9, []gatewayv1.ParentReference{parent("infra", "theirs", "")}, nil),
	}
	res := BuildAll(nil, st, Options{PodRouteGroup: "edge/g"})
	if err := res.Snapshot.Validate(); err != nil {
		t.Fatal(err)
	}
	gs := res.Gateways.Gateways["infra/gw"]
	if got := conds(gs.Conditions); got["Accepted"] != "True/ListenersNotValid" {
		t.Errorf("gw conditions %v, want Accepted True/ListenersNotValid", got)
	}
	got := map[string]map[string]string{}
	for _, l := range gs.Listeners {
		got[string(l.Name)] = conds(l.Conditions)
		got[string(l.Name)]["attached"] = string(rune('0' + l.AttachedRoutes))
	}
	for name, want := range map[string]map[string]string{
		"same":       {"Accepted": "True/Accepted", "ResolvedRefs": "True/ResolvedRefs", "attached": "3"}, // not hostless: no hostname in common
		"selected":   {"Accepted": "True/Accepted", "attached": "1"},
		"tcp":        {"Accepted": "False/UnsupportedProtocol", "Programmed": "False/Invalid", "attached": "0"},
		"other-port": {"Accepted": "False/PortUnavailable", "attached": "0"},
		"kinds":      {"ResolvedRefs": "False/InvalidRouteKinds", "Programmed": "False/Invalid"},
		"missing":    {"ResolvedRefs": "False/InvalidCertificateRef"},
		"malformed":  {"ResolvedRefs": "False/InvalidCertificateRef"},
		"elsewhere":  {"ResolvedRefs": "False/RefNotPermitted"},
	} {
		for k, v := range want {
			if got[name][k] != v {
				t.Errorf("listener %s %s = %q, want %q", name, k, got[name][k], v)
			}
		}
	}
	if got := conds(res.Gateways.Gateways["infra/none"].Conditions); got["Accepted"] != "False/ListenersNotValid" {
		t.Errorf("a Gateway without a valid listener: %v", got)
	}
	for name, want := range map[string]map[string]string{
		"app/wrong-section":    {"Accepted": "False/NoMatchingParent", "ResolvedRefs": "True/ResolvedRefs"},
		"app/not-same":         {"Accepted": "False/NotAllowedByListeners", "ResolvedRefs": "True/ResolvedRefs"},
		"app/selected":         {"Accepted": "True/Accepted", "ResolvedRefs": "False/RefNotPermitted"},
		"other/unselected":     {"Accepted": "False/NotAllowedByListeners", "ResolvedRefs": "True/ResolvedRefs"},
		"infra/hostless":       {"Accepted": "False/NoMatchingListenerHostname", "ResolvedRefs": "True/ResolvedRefs"},
		"infra/redirect-exact": {"Accepted": "False/UnsupportedValue", "ResolvedRefs": "True/ResolvedRefs"},
		"infra/unsupported":    {"Accepted": "False/UnsupportedValue", "ResolvedRefs": "True/ResolvedRefs"},
		"infra/invalid-kind":   {"Accepted": "True/Accepted", "ResolvedRefs": "False/InvalidKind"},
	} {
		ps := res.Gateways.Routes[name]
		if len(ps) != 1 {
			t.Errorf("%s: %d parent statuses, want 1", name, len(ps))
			continue
		}
		if d := cmp.Diff(want, conds(ps[0].Conditions)); d != "" {
			t.Errorf("%s conditions (-want +got):\n%s", name, d)
		}
	}
	if _, ok := res.Gateways.Routes["app/foreign"]; ok {
		t.Error("a route of another controller's Gateway got a status from Portico")
	}
	// The route whose backend another namespace does not grant answers 500
	// there; granted, it reaches the Service.
	hosts := func(res Result) map[string]model.Server {
		m := map[string]model.Server{}
		for _, s := range res.Snapshot.Servers {
			m[s.Host] = s
		}
		return m
	}
	if l := hosts(res)["sel.test"].Locations; len(l) != 1 || l[0].Status != 500 {
		t.Errorf("sel.test locations %+v, want one answering 500", l)
	}
	if _, ok := hosts(res)["other.test"]; ok {
		t.Error("other.test is not the listener's hostname, but is served")
	}
	st.ReferenceGrants = []*gatewayv1.ReferenceGrant{{ObjectMeta: meta("other", "grant", 0), Spec: gatewayv1.ReferenceGrantSpec{
		From: []gatewayv1.ReferenceGrantFrom{{Group: gatewayGroup, Kind: kindHTTPRoute, Namespace: "app"}},
		To:   []gatewayv1.ReferenceGrantTo{{Kind: "Service"}}}}}
	res = BuildAll(nil, st, Options{PodRouteGroup: "edge/g"})
	if l := hosts(res)["sel.test"].Locations; len(l) != 1 || l[0].Upstream != "other-svc-80" {
		t.Errorf("granted: sel.test locations %+v, want other-svc-80", l)
	}
	if got := conds(res.Gateways.Routes["app/selected"][0].Conditions); got["ResolvedRefs"] != "True/ResolvedRefs" {
		t.Errorf("granted: %v", got)
	}
}

func TestIntersectHostnames(t *testing.T) {
	for _, tc := range []struct {
		listener string
		route    []gatewayv1.Hostname
		want     []string
	}{
		{"", nil, []string{""}},
		{"a.test", nil, []string{"a.test"}},
		{"", []gatewayv1.Hostname{"A.test", "*.b.test"}, []string{"a.test", "*.b.test"}},
		{"*.example.com", []gatewayv1.Hostname{"a.example.com", "a.b.example.com", "example.com", "x.test"}, []string{"a.example.com", "a.b.example.com"}},
		{"*.example.com", []gatewayv1.Hostname{"*.example.com", "*.a.example.com", "*.com"}, []string{"*.example.com", "*.a.example.com"}},
		{"a.example.com", []gatewayv1.Hostname{"*.example.com", "*.com", "b.example.com"}, []string{"a.example.com"}},
	} {
		got := intersect(tc.listener, tc.route)
		slices.Sort(got)
		slices.Sort(tc.want)
		if !slices.Equal(got, tc.want) {
			t.Errorf("intersect(%q, %v) = %v, want %v", tc.listener, tc.route, got, tc.want)
		}
	}
	if modelHost("*.a.test") != "**.a.test" || modelHost("a.test") != "a.test" {
		t.Error("modelHost")
	}
}

func TestGatewayClassParameters(t *testing.T) {
	st := gatewayState(t)
	st.GatewayClasses = []*gatewayv1.GatewayClass{gwClass("portico", v1alpha1.GatewayControllerName), gwClass("bad", v1alpha1.GatewayControllerName)}
	st.GatewayClasses[0].Spec.ParametersRef = &gatewayv1.ParametersReference{Kind: "Service", Name: "g", Namespace: ptr(gatewayv1.Namespace("edge"))}
	st.GatewayClasses[1].Spec.ParametersRef = &gatewayv1.ParametersReference{Kind: "Service", Name: "v1", Namespace: ptr(gatewayv1.Namespace("app"))}
	bad := gateway("infra", "bad", 1, listener("http", gatewayv1.HTTPProtocolType, 80, ""))
	bad.Spec.GatewayClassName = "bad"
	st.Gateways = []*gatewayv1.Gateway{gateway("infra", "gw", 0, listener("http", gatewayv1.HTTPProtocolType, 80, "")), bad}
	// No default group: the class's parametersRef names it.
	res := BuildAll(nil, st, Options{})
	if got := conds(res.Gateways.Classes["portico"]); got["Accepted"] != "True/Accepted" {
		t.Errorf("class portico: %v", got)
	}
	if got := conds(res.Gateways.Classes["bad"]); got["Accepted"] != "False/InvalidParameters" {
		t.Errorf("class bad (its parameters a plain Service): %v", got)
	}
	if got := conds(res.Gateways.Gateways["infra/gw"].Conditions); got["Accepted"] != "True/Accepted" || res.Gateways.Groups["infra/gw"] != "edge/g" {
		t.Errorf("gw: %v, group %q; want accepted on edge/g", got, res.Gateways.Groups["infra/gw"])
	}
	if _, ok := res.Gateways.Gateways["infra/bad"]; ok {
		t.Error("a Gateway of a class that is not accepted got a status")
	}
}

func TestGatewayFeaturesSorted(t *testing.T) {
	if !slices.IsSorted(GatewayFeatures) {
		t.Errorf("GatewayFeatures are not sorted (the specification asks it of supportedFeatures): %v", GatewayFeatures)
	}
}

func TestGatewayBackendFilters(t *testing.T) {
	st := gatewayState(t)
	st.Gateways = []*gatewayv1.Gateway{gateway("infra", "gw", 0, allowAll(listener("http", gatewayv1.HTTPProtocolType, 80, "")))}
	one := backendRef("", "v1", 8080, 1)
	one.Filters = []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestHeaderModifier,
		RequestHeaderModifier: &gatewayv1.HTTPHeaderFilter{Set: []gatewayv1.HTTPHeader{{Name: "Backend", Value: "v1"}}}}}
	mirror := backendRef("", "v2", 8080, 1)
	mirror.Filters = []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestMirror}}
	st.HTTPRoutes = []*gatewayv1.HTTPRoute{httpRoute("app", "r", 0, []gatewayv1.ParentReference{parent("infra", "gw", "")}, []string{"f.test"},
		gatewayv1.HTTPRouteRule{Matches: []gatewayv1.HTTPRouteMatch{prefixMatch("/one")}, BackendRefs: []gatewayv1.HTTPBackendRef{one}},
		gatewayv1.HTTPRouteRule{Matches: []gatewayv1.HTTPRouteMatch{prefixMatch("/two")}, BackendRefs: []gatewayv1.HTTPBackendRef{one, mirror}})}
	res := BuildAll(nil, st, Options{PodRouteGroup: "edge/g"})
	if err := res.Snapshot.Validate(); err != nil {
		t.Fatal(err)
	}
	set := model.HeaderChanges{Set: []model.NameValue{{Name: "Backend", Value: "v1"}}}
	var locs []model.Location
	for _, s := range res.Snapshot.Servers {
		if s.Host == "f.test" {
			locs = s.Locations
		}
	}
	want := []model.Location{
		{Path: "/one", Type: model.PathPrefix, Rank: 1, Source: "app/r", Backends: []model.Backend{{Upstream: "app-v1-8080", Weight: 1, RequestHeaders: set}}},
		{Path: "/two", Type: model.PathPrefix, Rank: 2, Source: "app/r", Backends: []model.Backend{{Upstream: "app-v1-8080", Weight: 1, RequestHeaders: set}, {Upstream: "app-v2-8080", Weight: 1}}},
	}
	if d := cmp.Diff(want, locs); d != "" {
		t.Errorf("f.test (-want +got):\n%s", d)
	}
	if got := conds(res.Gateways.Routes["app/r"][0].Conditions); got["PartiallyInvalid"] != "True/UnsupportedValue" || got["Accepted"] != "True/Accepted" {
		t.Errorf("a mirror on a backend: %v, want accepted and PartiallyInvalid", got)
	}
}

// TestGatewayListenerHostTaken: a Gateway in a tenant's namespace cannot put
// its certificate on a host another namespace's Ingress owns.
func TestGatewayListenerHostTaken(t *testing.T) {
	st := gatewayState(t)
	st.Ingresses = append(st.Ingresses, ingress("app", "owner", 0, "shop.test", []path{{"/", "Prefix", "v1", 8080}}, v1alpha1.AnnotationGroup, "edge/g"))
	st.Secrets = append(st.Secrets, realTLSSecret(t, "other", "evil", "shop.test"))
	st.Gateways = []*gatewayv1.Gateway{gateway("other", "gw", 0, withCert(listener("https", gatewayv1.HTTPSProtocolType, 443, "shop.test"), "", "evil"))}
	res := BuildAll(nil, st, Options{PodRouteGroup: "edge/g"})
	for _, s := range res.Snapshot.Servers {
		if s.Host == "shop.test" && s.TLSCertificate != "" {
			t.Errorf("shop.test, owned by namespace app, serves certificate %s from namespace other's Gateway", s.TLSCertificate)
		}
	}
	if !slices.ContainsFunc(res.Problems, func(p model.Problem) bool { return p.Reason == model.ReasonHostTaken && p.Object == "Gateway other/gw" }) {
		t.Errorf("no HostTaken problem for the Gateway: %v", res.Problems)
	}
}

// TestGatewayAddresses checks that each Gateway gets addresses of its own (a
// View): from its spec, kept from its status, or the lowest free of a pool,
// and that its routes are served on them alone.
func TestGatewayAddresses(t *testing.T) {
	pool := mustPool(t, "192.0.2.64/29")
	route := func(name string, age int, path string, parents ...string) *gatewayv1.HTTPRoute {
		var ps []gatewayv1.ParentReference
		for _, p := range parents {
			ps = append(ps, parent("infra", p, ""))
		}
		return httpRoute("app", name, age, ps, nil, gatewayv1.HTTPRouteRule{Matches: []gatewayv1.HTTPRouteMatch{prefixMatch(path)},
			BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("", "v1", 8080, 1)}})
	}
	l4 := func(name string, age int, kv ...string) *corev1.Service {
		s := backendSvc("infra", name, sport("dns", 53))
		s.ObjectMeta = meta("infra", name, age, kv...)
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.LoadBalancerClass = ptr(v1alpha1.LoadBalancerClass)
		return s
	}
	http := func() gatewayv1.Listener { return allowAll(listener("http", gatewayv1.HTTPProtocolType, 80, "")) }
	withAddrs := func(g *gatewayv1.Gateway, as ...string) *gatewayv1.Gateway {
		for _, a := range as {
			g.Spec.Addresses = append(g.Spec.Addresses, gatewayv1.GatewaySpecAddress{Value: a})
		}
		return g
	}
	build := func(st State, opts Options) Result {
		t.Helper()
		if opts.PodRouteGroup == "" {
			opts.PodRouteGroup = "edge/g"
		}
		res := BuildAll(nil, st, opts)
		if err := res.Snapshot.Validate(); err != nil {
			t.Fatal(err)
		}
		return res
	}
	addrsOf := func(res Result, gw string) []string {
		var out []string
		for _, a := range res.Gateways.Gateways[gw].Addresses {
			out = append(out, a.Value)
		}
		return out
	}

	t.Run("two Gateways, one route on both", func(t *testing.T) {
		st := gatewayState(t)
		st.Gateways = []*gatewayv1.Gateway{gateway("infra", "one", 1, http()), gateway("infra", "two", 2, http())}
		st.HTTPRoutes = []*gatewayv1.HTTPRoute{route("shared", 1, "/shared", "one", "two"), route("only-one", 2, "/", "one"), route("only-two", 3, "/", "two")}
		res := build(st, Options{Pools: []Pool{pool}})
		if d := cmp.Diff([]string{"192.0.2.65"}, addrsOf(res, "infra/one")); d != "" {
			t.Errorf("one's addresses (-want +got):\n%s", d)
		}
		if d := cmp.Diff([]string{"192.0.2.66"}, addrsOf(res, "infra/two")); d != "" {
			t.Errorf("two's addresses (-want +got):\n%s", d)
		}
		wantViews := []model.View{
			{Name: "infra/one", Group: "edge/g", VIPs: addrs("192.0.2.65"), Ports: []model.Port{{Protocol: model.TCP, Port: 80}}},
			{Name: "infra/two", Group: "edge/g", VIPs: addrs("192.0.2.66"), Ports: []model.Port{{Protocol: model.TCP, Port: 80}}},
		}
		if d := cmp.Diff(wantViews, res.Snapshot.Views, cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); d != "" {
			t.Errorf("views (-want +got):\n%s", d)
		}
		paths := map[string][]string{}
		for _, s := range res.Snapshot.Servers {
			for _, l := range s.Locations {
				paths[s.View] = append(paths[s.View], l.Source+" "+l.Path)
			}
		}
		want := map[string][]string{"infra/one": {"app/only-one /", "app/shared /shared"}, "infra/two": {"app/only-two /", "app/shared /shared"}}
		if d := cmp.Diff(want, paths); d != "" {
			t.Errorf("locations by view (-want +got):\n%s", d)
		}
		if g := res.Snapshot.Groups[0]; g.UnmatchedHost != "" {
			t.Errorf("group answers unmatched hosts %q: its own VIPs serve no Gateway", g.UnmatchedHost)
		}
		// A new L4 Service is not given a Gateway's address.
		st.Services = append(st.Services, l4("dns", 9))
		alloc, _ := AllocateVIPs(st.Services, nil, Pools{List: []Pool{pool}}, GatewayAddresses(res.Gateways)...)
		if got := alloc["infra/dns"]; len(got) != 1 || got[0] != netip.MustParseAddr("192.0.2.67") {
			t.Errorf("L4 Service allocated %v, want 192.0.2.67 (the Gateways hold .65 and .66)", got)
		}
	})

	t.Run("kept from status", func(t *testing.T) {
		st := gatewayState(t)
		two := gateway("infra", "two", 2, http())
		two.Status.Addresses = []gatewayv1.GatewayStatusAddress{{Type: ptr(gatewayv1.IPAddressType), Value: "192.0.2.70"}}
		st.Gateways = []*gatewayv1.Gateway{gateway("infra", "one", 1, http()), two}
		res := build(st, Options{Pools: []Pool{pool}})
		if got := addrsOf(res, "infra/two"); !slices.Equal(got, []string{"192.0.2.70"}) {
			t.Errorf("two's addresses %v, want its status's 192.0.2.70", got)
		}
		// The older one goes: the other keeps its address.
		st.Gateways = []*gatewayv1.Gateway{two}
		if got := addrsOf(build(st, Options{Pools: []Pool{pool}}), "infra/two"); !slices.Equal(got, []string{"192.0.2.70"}) {
			t.Errorf("after the older Gateway left, two's addresses %v, want 192.0.2.70 still", got)
		}
		// A status address another Gateway asks for in its spec is given up.
		st.Gateways = []*gatewayv1.Gateway{withAddrs(gateway("infra", "one", 1, http()), "192.0.2.70"), two}
		res = build(st, Options{Pools: []Pool{pool}})
		if got := addrsOf(res, "infra/two"); !slices.Equal(got, []string{"192.0.2.65"}) {
			t.Errorf("two's addresses %v, want 192.0.2.65 (one asked for .70)", got)
		}
	})

	t.Run("spec.addresses", func(t *testing.T) {
		for _, tc := range []struct {
			name       string
			addrs      []string
			hostname   bool
			tenant     bool
			want       []string
			view       bool
			programmed string
			accepted   string
		}{
			{name: "own, in the pool", addrs: []string{"192.0.2.69"}, want: []string{"192.0.2.69"}, view: true, programmed: "True/Programmed", accepted: "True/Accepted"},
			{name: "the group's VIP: shared", addrs: []string{"192.0.2.10"}, want: []string{"192.0.2.10"}, programmed: "True/Programmed", accepted: "True/Accepted"},
			{name: "the group's VIP, tenant", addrs: []string{"192.0.2.10"}, tenant: true, programmed: "False/AddressNotUsable", accepted: "True/Accepted"},
			{name: "own, outside every pool, operator's namespace", addrs: []string{"198.51.100.1"}, want: []string{"198.51.100.1"}, view: true, programmed: "True/Programmed", accepted: "True/Accepted"},
			{name: "own, outside every pool, tenant", addrs: []string{"198.51.100.1"}, tenant: true, programmed: "False/AddressNotUsable", accepted: "True/Accepted"},
			{name: "a node's", addrs: []string{"10.0.0.1"}, programmed: "False/AddressNotUsable", accepted: "True/Accepted"},
			{name: "an L4 Service's", addrs: []string{"192.0.2.53"}, programmed: "False/AddressNotUsable", accepted: "True/Accepted"},
			{name: "the group's and its own", addrs: []string{"192.0.2.10", "192.0.2.69"}, programmed: "False/AddressNotUsable", accepted: "False/UnsupportedAddress"},
			{name: "not an address", addrs: []string{"nope"}, programmed: "False/AddressNotUsable", accepted: "False/UnsupportedAddress"},
			{name: "a hostname", addrs: []string{"gw.example.com"}, hostname: true, programmed: "False/AddressNotUsable", accepted: "False/UnsupportedAddress"},
			{name: "an IPAddress without a value: allocated", addrs: []string{""}, want: []string{"192.0.2.65"}, view: true, programmed: "True/Programmed", accepted: "True/Accepted"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				st := gatewayState(t)
				st.Nodes = []*corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}}}}}
				st.Services = append(st.Services, l4("dns", 9, v1alpha1.AnnotationVIP, "192.0.2.53"))
				ns := "infra"
				if tc.tenant {
					ns = "app"
				}
				gw := withAddrs(gateway(ns, "gw", 1, http()), tc.addrs...)
				if tc.hostname {
					gw.Spec.Addresses[0].Type = ptr(gatewayv1.HostnameAddressType)
				}
				st.Gateways = []*gatewayv1.Gateway{gw}
				res := build(st, Options{Pools: []Pool{pool}, OperatorNamespaces: []string{"edge", "infra"}})
				gs := res.Gateways.Gateways[ns+"/gw"]
				c := conds(gs.Conditions)
				if c["Programmed"] != tc.programmed || c["Accepted"] != tc.accepted {
					t.Errorf("conditions %v, want Accepted %s, Programmed %s", c, tc.accepted, tc.programmed)
				}
				if got := addrsOf(res, ns+"/gw"); !slices.Equal(got, tc.want) {
					t.Errorf("addresses %v, want %v", got, tc.want)
				}
				if got := len(res.Snapshot.Views) == 1; got != tc.view {
					t.Errorf("views %v, want a view: %v", res.Snapshot.Views, tc.view)
				}
			})
		}
	})

	t.Run("listeners on other ports", func(t *testing.T) {
		st := gatewayState(t)
		st.Gateways = []*gatewayv1.Gateway{gateway("infra", "gw", 1, http(), allowAll(listener("alt", gatewayv1.HTTPProtocolType, 8080, "")),
			allowAll(withCert(listener("tls", gatewayv1.HTTPSProtocolType, 8443, "*.example.com"), "", "tls")),
			allowAll(listener("kubelet", gatewayv1.HTTPProtocolType, 10250, "")))}
		reserved := map[model.Port]string{{Protocol: model.TCP, Port: 10250}: "kubelet", {Protocol: model.TCP, Port: 80}: "nginx's HTTP", {Protocol: model.TCP, Port: 443}: "nginx's HTTPS"}
		res := build(st, Options{Pools: []Pool{pool}, ReservedPorts: reserved})
		want := []model.View{{Name: "infra/gw", Group: "edge/g", VIPs: addrs("192.0.2.65"),
			Ports: []model.Port{{Protocol: model.TCP, Port: 80}, {Protocol: model.TCP, Port: 8080}, {Protocol: model.TCP, Port: 8443}}, TLSPorts: []uint16{8443}}}
		if d := cmp.Diff(want, res.Snapshot.Views, cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); d != "" {
			t.Errorf("views (-want +got):\n%s", d)
		}
		// accepted checks each listener's Accepted: the one named odd has
		// the other answer.
		accepted := func(res Result, odd, want, oddWant string) {
			t.Helper()
			for _, l := range res.Gateways.Gateways["infra/gw"].Listeners {
				w := want
				if string(l.Name) == odd {
					w = oddWant
				}
				if got := conds(l.Conditions)["Accepted"]; got != w {
					t.Errorf("listener %s: Accepted %s, want %s", l.Name, got, w)
				}
			}
		}
		accepted(res, "kubelet", "True/Accepted", "False/PortUnavailable")
		// Sharing its group's VIPs, a Gateway has the group's two ports alone.
		st.Gateways[0].Spec.Addresses = []gatewayv1.GatewaySpecAddress{{Value: "192.0.2.10"}}
		accepted(build(st, Options{Pools: []Pool{pool}}), "http", "False/PortUnavailable", "True/Accepted")
	})

	t.Run("no pool allows a tenant", func(t *testing.T) {
		st := gatewayState(t)
		infraOnly := pool
		infraOnly.Restricted, infraOnly.Namespaces = true, []string{"infra"}
		st.Gateways = []*gatewayv1.Gateway{gateway("app", "gw", 1, http())}
		st.HTTPRoutes = []*gatewayv1.HTTPRoute{httpRoute("app", "r", 1, []gatewayv1.ParentReference{parent("", "gw", "")}, nil,
			gatewayv1.HTTPRouteRule{BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("", "v1", 8080, 1)}})}
		res := build(st, Options{Pools: []Pool{infraOnly}, OperatorNamespaces: []string{"edge", "infra"}})
		if c := conds(res.Gateways.Gateways["app/gw"].Conditions); c["Programmed"] != "False/AddressNotAssigned" {
			t.Errorf("conditions %v, want Programmed False/AddressNotAssigned", c)
		}
		for _, s := range res.Snapshot.Servers {
			if len(s.Locations) > 0 {
				t.Errorf("server %q (view %q) serves %v: the Gateway has no address", s.Host, s.View, s.Locations)
			}
		}
	})
}

// TestGatewayListenerIsolation checks Gateway API's listener isolation in a
// view: a request goes to the most specific listener its host matches, and
// routes attached to less specific listeners never take it (the suite's
// GatewayHTTPListenerIsolation, as hosts and paths).
func TestGatewayListenerIsolation(t *testing.T) {
	st := gatewayState(t)
	names := []string{"", "*.example.com", "*.foo.example.com", "abc.foo.example.com"}
	var ls []gatewayv1.Listener
	for i, h := range names {
		ls = append(ls, allowAll(listener(fmt.Sprintf("l%d", i), gatewayv1.HTTPProtocolType, 80, h)))
	}
	st.Gateways = []*gatewayv1.Gateway{gateway("infra", "gw", 1, ls...)}
	for i := range names {
		st.HTTPRoutes = append(st.HTTPRoutes, httpRoute("app", fmt.Sprintf("r%d", i), i, []gatewayv1.ParentReference{parent("infra", "gw", fmt.Sprintf("l%d", i))},
			[]string{"bar.com", "*.example.com", "*.foo.example.com", "abc.foo.example.com"},
			gatewayv1.HTTPRouteRule{Matches: []gatewayv1.HTTPRouteMatch{prefixMatch(fmt.Sprintf("/l%d", i))}, BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("", "v1", 8080, 1)}}))
	}
	res := BuildAll(nil, st, Options{PodRouteGroup: "edge/g", Pools: []Pool{mustPool(t, "192.0.2.64/29")}})
	if err := res.Snapshot.Validate(); err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, s := range res.Snapshot.Servers {
		if s.View != "infra/gw" {
			continue
		}
		got[s.Host] = []string{}
		for _, l := range s.Locations {
			got[s.Host] = append(got[s.Host], l.Path)
		}
	}
	want := map[string][]string{
		"":                    {}, // the catch-all listener's: no route without a hostname
		"bar.com":             {"/l0"},
		"**.example.com":      {"/l1"},
		"**.foo.example.com":  {"/l2"},
		"abc.foo.example.com": {"/l3"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("hosts and their paths in the view (-want +got):\n%s", d)
	}
}

func TestRouteTimeouts(t *testing.T) {
	d := func(s string) *gatewayv1.Duration { v := gatewayv1.Duration(s); return &v }
	for _, tc := range []struct {
		in   *gatewayv1.HTTPRouteTimeouts
		want model.Timeouts
		err  bool
	}{
		{nil, model.Timeouts{}, false},
		{&gatewayv1.HTTPRouteTimeouts{Request: d("500ms")}, model.Timeouts{Request: 500}, false},
		{&gatewayv1.HTTPRouteTimeouts{Request: d("1h"), BackendRequest: d("0s")}, model.Timeouts{Request: 3600000, Backend: model.NoTimeout}, false},
		{&gatewayv1.HTTPRouteTimeouts{Request: d("48h")}, model.Timeouts{Request: model.NoTimeout}, false},
		{&gatewayv1.HTTPRouteTimeouts{BackendRequest: d("nope")}, model.Timeouts{}, true},
	} {
		got, err := routeTimeouts(tc.in)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("routeTimeouts(%+v) = %+v, %v; want %+v, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestRouteCORS(t *testing.T) {
	loc, err := routeFilters([]gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterCORS, CORS: &gatewayv1.HTTPCORSFilter{
		AllowOrigins: []gatewayv1.CORSOrigin{"https://*.bar.com"}, AllowMethods: []gatewayv1.HTTPMethodWithWildcard{"GET"},
		AllowHeaders: []gatewayv1.HTTPHeaderName{"x-a"}, ExposeHeaders: []gatewayv1.HTTPHeaderName{"x-b"}, MaxAge: 60, AllowCredentials: ptr(true)}}})
	if err != nil {
		t.Fatal(err)
	}
	want := &model.CORS{AllowOrigins: []string{"https://*.bar.com"}, AllowMethods: []string{"GET"}, AllowHeaders: []string{"x-a"},
		ExposeHeaders: []string{"x-b"}, MaxAge: 60, AllowCredentials: true}
	if d := cmp.Diff(want, loc.Filters.CORS); d != "" {
		t.Errorf("CORS (-want +got):\n%s", d)
	}
}

// TestGatewayMirrors checks RequestMirror: its backend becomes an upstream of
// the rule's Filters.Mirrors, with its share; one that does not resolve is
// left out and the route's ResolvedRefs says why, its rule still served.
func TestGatewayMirrors(t *testing.T) {
	st := gatewayState(t)
	st.Gateways = []*gatewayv1.Gateway{gateway("infra", "gw", 0, allowAll(listener("http", gatewayv1.HTTPProtocolType, 80, "")))}
	mirror := func(name string, pct *int32, frac *gatewayv1.Fraction) gatewayv1.HTTPRouteFilter {
		return gatewayv1.HTTPRouteFilter{Type: gatewayv1.HTTPRouteFilterRequestMirror, RequestMirror: &gatewayv1.HTTPRequestMirrorFilter{
			BackendRef: gatewayv1.BackendObjectReference{Name: gatewayv1.ObjectName(name), Port: ptr(gatewayv1.PortNumber(8080))}, Percent: pct, Fraction: frac}}
	}
	st.HTTPRoutes = []*gatewayv1.HTTPRoute{httpRoute("app", "r", 1, []gatewayv1.ParentReference{parent("infra", "gw", "")}, []string{"m.test"},
		gatewayv1.HTTPRouteRule{Filters: []gatewayv1.HTTPRouteFilter{mirror("v2", nil, nil), mirror("v2", ptr(int32(20)), nil),
			mirror("v2", nil, &gatewayv1.Fraction{Numerator: 1, Denominator: ptr(int32(3))}), mirror("gone", nil, nil)},
			BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("", "v1", 8080, 1)}})}
	res := BuildAll(nil, st, Options{PodRouteGroup: "edge/g"})
	if err := res.Snapshot.Validate(); err != nil {
		t.Fatal(err)
	}
	var got []model.Mirror
	for _, s := range res.Snapshot.Servers {
		if s.Host == "m.test" {
			for _, l := range s.Locations {
				got = append(got, l.Filters.Mirrors...)
			}
		}
	}
	want := []model.Mirror{{Upstream: "app-v2-8080"}, {Upstream: "app-v2-8080", Numerator: 20, Denominator: 100}, {Upstream: "app-v2-8080", Numerator: 1, Denominator: 3}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("mirrors (-want +got):\n%s", d)
	}
	if c := conds(res.Gateways.Routes["app/r"][0].Conditions); c["ResolvedRefs"] != "False/BackendNotFound" || c["Accepted"] != "True/Accepted" {
		t.Errorf("route conditions %v, want Accepted, ResolvedRefs False/BackendNotFound", c)
	}
}

// TestGatewayAndL4ServiceByAge: Gateways and L4 Services share their group's
// data plane, and the older one keeps its place whichever kind it is: a new
// Gateway never pushes out an older L4 Service (another tenant's), nor the
// other way round.
func TestGatewayAndL4ServiceByAge(t *testing.T) {
	for _, gatewayOlder := range []bool{false, true} {
		t.Run(fmt.Sprintf("gateway older %v", gatewayOlder), func(t *testing.T) {
			st := gatewayState(t)
			svcAge, gwAge := 1, 2
			if gatewayOlder {
				svcAge, gwAge = 2, 1
			}
			big := backendSvc("infra", "big", sport("p", 2000))
			big.ObjectMeta = meta("infra", "big", svcAge, v1alpha1.AnnotationVIP, "192.0.2.50")
			big.Spec.Type = corev1.ServiceTypeLoadBalancer
			big.Spec.LoadBalancerClass = ptr(v1alpha1.LoadBalancerClass)
			big.Spec.Ports = nil
			for p := range 1000 { // 1,002 of the group's 1,024 keys, with its own 4
				big.Spec.Ports = append(big.Spec.Ports, corev1.ServicePort{Name: fmt.Sprintf("p%d", p), Port: int32(2000 + p), Protocol: corev1.ProtocolTCP})
			}
			st.Services = append(st.Services, big)
			var ls []gatewayv1.Listener
			for p := range 20 { // 22 keys
				ls = append(ls, allowAll(listener(fmt.Sprintf("l%d", p), gatewayv1.HTTPProtocolType, int32(8000+p), "")))
			}
			st.Gateways = []*gatewayv1.Gateway{gateway("infra", "gw", gwAge, ls...)}
			st.HTTPRoutes = []*gatewayv1.HTTPRoute{httpRoute("app", "r", 1, []gatewayv1.ParentReference{parent("infra", "gw", "l0")}, nil,
				gatewayv1.HTTPRouteRule{BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("", "v1", 8080, 1)}})}
			res := BuildAll(nil, st, Options{PodRouteGroup: "edge/g", Pools: []Pool{mustPool(t, "192.0.2.64/29")}})
			if err := res.Snapshot.Validate(); err != nil {
				t.Fatal(err)
			}
			served := len(res.Snapshot.Services) == 1
			views := len(res.Snapshot.Views) == 1
			viewServers := 0
			for _, s := range res.Snapshot.Servers {
				if s.View != "" {
					viewServers++
				}
			}
			programmed := conds(res.Gateways.Gateways["infra/gw"].Conditions)["Programmed"]
			if served == gatewayOlder || views != gatewayOlder || (viewServers > 0) != gatewayOlder {
				t.Errorf("L4 Service served %v, Gateway's view %v with %d servers; want the older one alone", served, views, viewServers)
			}
			if want := map[bool]string{false: "False/NoResources", true: "True/Programmed"}[gatewayOlder]; programmed != want {
				t.Errorf("Gateway Programmed %s, want %s", programmed, want)
			}
		})
	}
}
