package controlplane

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
)

var cmpAddrs = cmp.Options{
	cmp.Comparer(func(x, y netip.Addr) bool { return x == y }),
	cmp.Comparer(func(x, y netip.AddrPort) bool { return x == y }),
	cmp.Comparer(func(x, y netip.Prefix) bool { return x == y }),
	cmpopts.EquateEmpty(),
	// Snapshots compare field by field (not by their Equal method), without
	// the bound Ingresses' generations: TestBuildIngressGenerations checks those.
	cmp.Transformer("withoutGenerations", func(s model.Snapshot) snapshotFields {
		out := snapshotFields{Servers: s.Servers, Upstreams: s.Upstreams, Certificates: s.Certificates}
		for _, g := range s.Groups {
			g.Ingresses = nil
			out.Groups = append(out.Groups, g)
		}
		return out
	}),
}

// snapshotFields is model.Snapshot without its Equal method.
type snapshotFields struct {
	Groups       []model.Group
	Servers      []model.Server
	Upstreams    []model.Upstream
	Certificates []model.Certificate
}

var ignoreDetail = cmpopts.IgnoreFields(model.Problem{}, "Detail")

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func aps(s ...string) []netip.AddrPort {
	var out []netip.AddrPort
	for _, a := range s {
		out = append(out, netip.MustParseAddrPort(a))
	}
	return out
}

// g1 is the group most cases use: VIP 192.0.2.10, VRID 7, one ready and one
// terminating agent.
func g1Objects() ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	return []*corev1.Service{groupSvc("edge", "g1", 0, v1alpha1.AnnotationVIP, "192.0.2.10", v1alpha1.AnnotationVRID, "7")},
		[]*discoveryv1.EndpointSlice{slice("edge", "g1", "g1-a", "http", 80,
			ep{addr: "10.1.0.2", node: "n2", ready: true},
			ep{addr: "10.1.0.1", node: "n1", ready: false, terminating: true},
			ep{addr: "10.1.0.3", node: "n3", ready: false})}
}

var g1Group = model.Group{
	Name: "edge/g1", VIPs: addrs("192.0.2.10"), VRID: 7,
	Ports:    []model.Port{{Protocol: model.TCP, Port: 80}, {Protocol: model.TCP, Port: 443}},
	HTTPPort: 80, HTTPSPort: 443,
	Replicas: []model.Replica{
		{Node: "n1", Addr: netip.MustParseAddr("10.1.0.1"), Weight: 1, State: model.Draining},
		{Node: "n2", Addr: netip.MustParseAddr("10.1.0.2"), Weight: 1, State: model.Ready},
	},
}

// web is a backend Service "app/web" (ports http=80, admin=9000) with two ready and
// one unready endpoint.
func webObjects() ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	return []*corev1.Service{backendSvc("app", "web", sport("http", 80), sport("admin", 9000))},
		[]*discoveryv1.EndpointSlice{
			slice("app", "web", "web-1", "http", 8080, ep{addr: "10.2.0.2", ready: true}, ep{addr: "10.2.0.1", ready: true}, ep{addr: "10.2.0.9", ready: false}),
			slice("app", "web", "web-2", "admin", 9090, ep{addr: "10.2.0.1", ready: true}),
		}
}

var webHTTP = model.Upstream{Name: "app-web-80", Endpoints: aps("10.2.0.1:8080", "10.2.0.2:8080")}

func state(objs ...any) State {
	var st State
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.Service:
			st.Services = append(st.Services, o)
		case []*corev1.Service:
			st.Services = append(st.Services, o...)
		case *discoveryv1.EndpointSlice:
			st.EndpointSlices = append(st.EndpointSlices, o)
		case []*discoveryv1.EndpointSlice:
			st.EndpointSlices = append(st.EndpointSlices, o...)
		case *networkingv1.Ingress:
			st.Ingresses = append(st.Ingresses, o)
		case *networkingv1.IngressClass:
			st.IngressClasses = append(st.IngressClasses, o)
		case *corev1.Secret:
			st.Secrets = append(st.Secrets, o)
		case *corev1.Pod:
			st.Pods = append(st.Pods, o)
		case *corev1.Node:
			st.Nodes = append(st.Nodes, o)
		case *v1alpha1.VIPPool:
			st.VIPPools = append(st.VIPPools, o)
		case *corev1.Namespace:
			st.Namespaces = append(st.Namespaces, o)
		default:
			panic("state: unknown object")
		}
	}
	return st
}

func affine(l model.Location, cookie string, maxAge uint32) model.Location {
	l.Affinity = model.CookieAffinity{Cookie: cookie, MaxAge: maxAge}
	return l
}

func loc(path string, typ model.PathType, up, src string) model.Location {
	return model.Location{Path: path, Type: typ, Upstream: up, Source: src}
}

// sortedUpstreams lists upstreams in the snapshot's order (by name).
func sortedUpstreams(us ...model.Upstream) []model.Upstream {
	slices.SortFunc(us, func(x, y model.Upstream) int { return strings.Compare(x.Name, y.Name) })
	return us
}

// reorder returns a State with copies of st's lists, each permuted by perm.
func reorder(st State, perm func(n int, swap func(i, j int))) State {
	var out State
	out.IngressClasses = permuted(st.IngressClasses, perm)
	out.Ingresses = permuted(st.Ingresses, perm)
	out.Services = permuted(st.Services, perm)
	out.EndpointSlices = permuted(st.EndpointSlices, perm)
	out.Secrets = permuted(st.Secrets, perm)
	out.Pods = permuted(st.Pods, perm)
	out.Nodes = permuted(st.Nodes, perm)
	return out
}

func permuted[T any](s []T, perm func(n int, swap func(i, j int))) []T {
	s = slices.Clone(s)
	perm(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
	return s
}
