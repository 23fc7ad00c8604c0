package controlplane

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
)

// vipPool is a VIPPool of the given prefixes; alloc nil lets every Service in.
func vipPool(name string, auto bool, alloc *v1alpha1.ServiceAllocation, addresses ...string) *v1alpha1.VIPPool {
	return &v1alpha1.VIPPool{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.VIPPoolSpec{Addresses: addresses, AutoAssign: &auto, ServiceAllocation: alloc}}
}

func namespace(name string, labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

// servedVIPs are the VIPs the snapshot serves each L4 Service on.
func servedVIPs(snap model.Snapshot) map[string][]string {
	out := map[string][]string{}
	for _, s := range snap.Services {
		for _, a := range s.VIPs {
			out[s.Name] = append(out[s.Name], a.String())
		}
	}
	return out
}

// A tenant's L4 Service that names any address it likes as its VIP (without
// pools, the client's own address got onto every edge's lo and into ARP and
// BGP) gets none of it unless a VIPPool that allows the Service holds it; an
// operator's namespace may still name any address that is no node's; a pool
// restricted to other namespaces, or to other Services, lets nobody else in.
func TestBuildRefusesAVIPOutsideThePools(t *testing.T) {
	gs, gsl := g1Objects()
	tenant := func(ns, name string, age int, vip string, labels ...string) *corev1.Service {
		s := tenantL4(name, age, addrs(vip), 7000)
		s.ObjectMeta = meta(ns, name, age, v1alpha1.AnnotationVIP, vip, v1alpha1.AnnotationGroup, "edge/g1")
		for i := 0; i+1 < len(labels); i += 2 {
			if s.Labels == nil {
				s.Labels = map[string]string{}
			}
			s.Labels[labels[i]] = labels[i+1]
		}
		return s
	}
	objs := []any{gs, gsl,
		namespace("team-a", map[string]string{"tier": "web"}), namespace("team-b", nil),
		vipPool("web", true, &v1alpha1.ServiceAllocation{NamespaceSelectors: []metav1.LabelSelector{{MatchLabels: map[string]string{"tier": "web"}}}},
			"198.51.100.0/28"),
		vipPool("b-dns", false, &v1alpha1.ServiceAllocation{Namespaces: []string{"team-b"},
			ServiceSelectors: []metav1.LabelSelector{{MatchLabels: map[string]string{"app": "dns"}}}}, "203.0.113.0/29"),
		tenant("team-a", "thief", 1, "10.9.9.9"),       // the client's own address: in no pool
		tenant("team-a", "web", 2, "198.51.100.5"),     // in the pool its namespace is selected for
		tenant("team-b", "poacher", 3, "198.51.100.6"), // a pool of team-a's
		tenant("team-b", "dns", 4, "203.0.113.2", "app", "dns"),
		tenant("team-b", "other", 5, "203.0.113.3"), // its namespace's pool, but not its selector
		tenant("edge", "operator", 6, "10.9.9.10"),  // the operator's namespace
	}
	st := state(objs...)
	snap, _, problems := Build(st, Options{OperatorNamespaces: []string{"edge"}})
	want := map[string][]string{"team-a/web": {"198.51.100.5"}, "team-b/dns": {"203.0.113.2"}, "edge/operator": {"10.9.9.10"}}
	got := servedVIPs(snap)
	for name, vips := range got {
		if len(vips) == 0 {
			delete(got, name)
		}
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("VIPs served (-want +got):\n%s", d)
	}
	for _, name := range []string{"team-a/thief", "team-b/poacher", "team-b/other"} {
		if got := problemsOf(problems, "Service "+name); len(got) != 1 || got[0].Reason != model.ReasonVIPNotInPool {
			t.Errorf("problems of %s: %v, want one VIPNotInPool", name, got)
		}
	}
	for _, name := range []string{"team-a/web", "team-b/dns", "edge/operator"} {
		if got := problemsOf(problems, "Service "+name); len(got) != 0 {
			t.Errorf("problems of %s: %v, want none", name, got)
		}
	}

	// The same objects without the operator's namespaces (unit tests, and an
	// agent that allows groups everywhere) trust every namespace.
	snap, _, _ = Build(st, Options{})
	if n := len(servedVIPs(snap)); n != 6 {
		t.Errorf("without operator namespaces %d Services have VIPs, want all 6", n)
	}
}

// A VIPPool that does not parse is reported and not used at all; the others are.
func TestBuildReportsAnInvalidPool(t *testing.T) {
	gs, gsl := g1Objects()
	bad := vipPool("bad", true, &v1alpha1.ServiceAllocation{NamespaceSelectors: []metav1.LabelSelector{{
		MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: "Sideways"}}}}}, "198.51.100.0/28")
	badAddr := vipPool("bad-addr", true, nil, "198.51.100.16/28", "not-a-prefix")
	good := vipPool("good", true, nil, "203.0.113.0/29")
	svcs := []*corev1.Service{tenantL4("a", 1, addrs("198.51.100.5"), 7000), tenantL4("b", 2, addrs("198.51.100.20"), 7001),
		tenantL4("c", 3, addrs("203.0.113.2"), 7002)}
	snap, _, problems := Build(state(gs, gsl, bad, badAddr, good, svcs), Options{OperatorNamespaces: []string{"edge"}})
	if d := cmp.Diff(map[string][]string{"tenant/c": {"203.0.113.2"}}, servedVIPs(snap)); d != "" {
		t.Errorf("VIPs served (-want +got):\n%s", d)
	}
	for _, name := range []string{"VIPPool bad", "VIPPool bad-addr"} {
		if got := problemsOf(problems, name); len(got) != 1 || got[0].Reason != model.ReasonInvalidPool {
			t.Errorf("problems of %s: %v, want one InvalidPool", name, got)
		}
	}
}

// The leader allocates from the first pool that allows a Service and assigns
// automatically, never from a manual pool, and reports a Service no pool allows.
func TestAllocateVIPsFromPoolsThatAllowTheService(t *testing.T) {
	lb := func(ns, name string, age int) *corev1.Service {
		s := backendSvc(ns, name, sport("x", 53))
		s.ObjectMeta = meta(ns, name, age)
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.LoadBalancerClass = ptr(v1alpha1.LoadBalancerClass)
		return s
	}
	objs := []*v1alpha1.VIPPool{
		vipPool("a-manual", false, nil, "192.0.2.0/29"),
		vipPool("b-team-a", true, &v1alpha1.ServiceAllocation{Namespaces: []string{"team-a"}}, "198.51.100.0/29", "2001:db8::/126"),
		vipPool("c-labelled", true, &v1alpha1.ServiceAllocation{NamespaceSelectors: []metav1.LabelSelector{{MatchLabels: map[string]string{"vip": "yes"}}}},
			"203.0.113.0/29"),
	}
	nss := []*corev1.Namespace{namespace("team-a", nil), namespace("team-c", map[string]string{"vip": "yes"}), namespace("team-d", nil)}
	pools, problems := vipPools(nil, objs, nss)
	if len(problems) != 0 {
		t.Fatalf("problems: %v", problems)
	}
	got, problems := AllocateVIPs([]*corev1.Service{lb("team-a", "x", 1), lb("team-c", "y", 2), lb("team-d", "z", 3)}, nil, pools)
	want := map[string][]netip.Addr{"team-a/x": addrs("198.51.100.1", "2001:db8::1"), "team-c/y": addrs("203.0.113.1")}
	if d := cmp.Diff(want, got, cmpAddrs); d != "" {
		t.Errorf("allocations (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]model.Problem{{Object: "Service team-d/z", Field: "metadata.annotations[portico.io/vip]", Reason: model.ReasonVIPNotInPool}},
		problems, ignoreDetail); d != "" {
		t.Errorf("problems (-want +got):\n%s", d)
	}
	if !slices.ContainsFunc(pools.List, func(p Pool) bool { return p.Name == "a-manual" && p.Manual }) {
		t.Errorf("pools %v: a-manual is not manual", pools.List)
	}
}

// A pool's usage counts the VIPs served in it and the addresses it may still
// hand out, per family; a flag's pool is named after its prefix.
func TestPoolUsage(t *testing.T) {
	flag := mustPool(t, "192.0.2.0/29!192.0.2.1")
	pools, problems := vipPools([]Pool{flag}, []*v1alpha1.VIPPool{
		vipPool("dual", true, nil, "198.51.100.0/30", "2001:db8::/64"),
	}, nil)
	if len(problems) != 0 {
		t.Fatal(problems)
	}
	pools.List[2].Exclude = []netip.Prefix{netip.MustParsePrefix("2001:db8::/65")}
	snap := model.Snapshot{
		Groups:   []model.Group{{Name: "e/g", VIPs: addrs("192.0.2.2", "198.51.100.1")}},
		Services: []model.Service{{Name: "t/s", VIPs: addrs("192.0.2.6", "2001:db8::8000:0:0:1", "203.0.113.1")}},
		Views:    []model.View{{Name: "t/gw", VIPs: addrs("198.51.100.2")}},
	}
	want := map[[2]string][2]float64{
		{"--vip-pool 192.0.2.0/29!192.0.2.1/32", "IPv4"}: {2, 3}, // .2-.6 usable
		{"dual", "IPv4"}: {2, 0},         // .1 and .2 usable, the group's and the Gateway's
		{"dual", "IPv6"}: {1, 1<<63 - 2}, // the upper half, less the subnet-router address
	}
	if d := cmp.Diff(want, poolUsage(pools, snap, Pool.size)); d != "" {
		t.Errorf("usage (-want +got):\n%s", d)
	}
}

// spec.loadBalancerIP, what most LoadBalancer manifests set, names a VIP as
// portico.io/vip does and is honoured only where portico.io/vip would be:
// inside a pool that allows the Service, never a node's address. Beside the
// annotation it must agree with it, else the annotation wins and the
// disagreement is reported; the allocator leaves a Service that names one
// alone.
func TestBuildHonoursLoadBalancerIPInsideAPool(t *testing.T) {
	gs, gsl := g1Objects()
	lb := func(name string, age int, ip string, ann ...string) *corev1.Service {
		s := tenantL4(name, age, nil, 7000)
		s.ObjectMeta = meta("team-a", name, age, append([]string{v1alpha1.AnnotationGroup, "edge/g1"}, ann...)...)
		s.Spec.LoadBalancerIP = ip
		return s
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "198.51.100.9"}}}}
	objs := []any{gs, gsl, node, namespace("team-a", nil),
		vipPool("a", true, &v1alpha1.ServiceAllocation{Namespaces: []string{"team-a"}}, "198.51.100.0/28"),
		lb("in-pool", 1, "198.51.100.5"),
		lb("outside", 2, "10.9.9.9"),
		lb("node", 3, "198.51.100.9"),
		lb("both", 4, "198.51.100.7", v1alpha1.AnnotationVIP, "198.51.100.6"),
		lb("bad", 5, "not-an-ip"),
	}
	st := state(objs...)
	snap, _, problems := Build(st, Options{OperatorNamespaces: []string{"edge"}})
	got := servedVIPs(snap)
	for name, vips := range got {
		if len(vips) == 0 {
			delete(got, name)
		}
	}
	want := map[string][]string{"team-a/in-pool": {"198.51.100.5"}, "team-a/both": {"198.51.100.6"}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("VIPs served (-want +got):\n%s", d)
	}
	for name, want := range map[string]model.Problem{
		"team-a/outside": {Field: "spec.loadBalancerIP", Reason: model.ReasonVIPNotInPool},
		"team-a/node":    {Field: "spec.loadBalancerIP", Reason: model.ReasonInvalidVIP},
		"team-a/both":    {Field: "spec.loadBalancerIP", Reason: model.ReasonInvalidVIP},
		"team-a/bad":     {Field: "spec.loadBalancerIP", Reason: model.ReasonInvalidVIP},
	} {
		got := problemsOf(problems, "Service "+name)
		if len(got) != 1 || got[0].Field != want.Field || got[0].Reason != want.Reason {
			t.Errorf("problems of %s: %v, want one %s on %s", name, got, want.Reason, want.Field)
		}
	}
	if got := problemsOf(problems, "Service team-a/in-pool"); len(got) != 0 {
		t.Errorf("problems of team-a/in-pool: %v, want none", got)
	}
	// The allocator gives nothing to a Service that names its VIP, and counts
	// that VIP as used.
	pools, _ := vipPools(nil, st.VIPPools, st.Namespaces)
	alloc, _ := AllocateVIPs(st.Services, st.Nodes, pools)
	for _, name := range []string{"team-a/in-pool", "team-a/outside", "team-a/both"} {
		if a, ok := alloc[name]; ok {
			t.Errorf("allocated %v to %s, which names its VIP", a, name)
		}
	}
}
