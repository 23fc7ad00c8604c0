package controlplane

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
)

// State is the cluster as Build sees it: the informers' listed objects. Build never
// modifies them.
type State struct {
	IngressClasses []*networkingv1.IngressClass
	Ingresses      []*networkingv1.Ingress
	Services       []*corev1.Service
	EndpointSlices []*discoveryv1.EndpointSlice
	Secrets        []*corev1.Secret
	Pods           []*corev1.Pod
	Nodes          []*corev1.Node
	// VIPPools are the operator's pools, and Namespaces the namespaces whose
	// labels the pools' selectors read.
	VIPPools   []*v1alpha1.VIPPool
	Namespaces []*corev1.Namespace
	// Gateway API's objects (gateway.go).
	GatewayClasses  []*gatewayv1.GatewayClass
	Gateways        []*gatewayv1.Gateway
	HTTPRoutes      []*gatewayv1.HTTPRoute
	ReferenceGrants []*gatewayv1.ReferenceGrant
}

// Options are the settings Build depends on besides the objects.
type Options struct {
	// PodRouteGroup ("namespace/name") serves pod routes and L4 Services without a
	// portico.io/group annotation; "" leaves them unbound.
	PodRouteGroup string
	// ReservedPorts are the ports the edges' own listeners and the node's
	// daemons use on every address (the agent's, nginx's, ssh, the kubelet's),
	// with what uses each: an L4 Service port among them is refused (its
	// listener would fail every edge's nginx reload). Each group's HTTP and
	// HTTPS ports are reserved for its L4 Services too.
	ReservedPorts map[model.Port]string
	// Pools are the --vip-pool flags' pools, before the VIPPools.
	Pools []Pool
	// OperatorNamespaces are the namespaces the operator writes (the agent's,
	// the groups'): an L4 Service there may name any VIP that is no node's;
	// elsewhere only one of a pool that allows it. Empty: every namespace.
	OperatorNamespaces []string
}

// Build translates the cluster state into a snapshot, and returns the binding of
// every Ingress it read next to it. It is pure: the same state gives an equal
// snapshot, the same bindings and the same problems, in the same order.
func Build(st State, opts Options) (model.Snapshot, Bindings, []model.Problem) {
	return BuildWith(nil, st, opts)
}

// BuildWith is Build with a Memo of the last Build's derived data (nil: none),
// which it updates: the result is Build's, only cheaper to get.
func BuildWith(m *Memo, st State, opts Options) (model.Snapshot, Bindings, []model.Problem) {
	r := BuildAll(m, st, opts)
	return r.Snapshot, r.Bindings, r.Problems
}

// Result is everything a build derives from the cluster state.
type Result struct {
	Snapshot model.Snapshot
	Bindings Bindings
	Problems []model.Problem
	// Gateways are the statuses of Portico's Gateway API objects.
	Gateways GatewayStatuses
}

// BuildAll is BuildWith, with the Gateway API objects' statuses.
func BuildAll(m *Memo, st State, opts Options) Result {
	b := newBuilder(st)
	b.memo = m
	if m != nil {
		b.upstreams = make(map[string]*upstreamAcc, len(m.endpoints)) // as many as last time
		m.begin()
		defer m.end()
	}
	b.groups()
	ings := b.boundIngresses()
	b.owners = b.hostOwners(ings, b.routedPods(opts.PodRouteGroup))
	b.ingresses(ings)
	b.podRoutes(opts.PodRouteGroup)
	pools, poolProblems := vipPools(opts.Pools, st.VIPPools, st.Namespaces)
	b.problems = append(b.problems, poolProblems...)
	b.pools, b.reserved = pools, opts.ReservedPorts
	poolsFor := func(o metav1.Object) *Pools {
		if len(opts.OperatorNamespaces) == 0 || slices.Contains(opts.OperatorNamespaces, o.GetNamespace()) {
			return nil
		}
		return &pools
	}
	b.gateways(opts.PodRouteGroup, poolsFor)
	b.l4Services(opts.PodRouteGroup, opts.ReservedPorts, func(s *corev1.Service) *Pools { return poolsFor(s) })
	b.admitViews(nil)
	return Result{Snapshot: b.snapshot(), Bindings: b.bindings, Problems: b.problems, Gateways: b.gw}
}

// Memo keeps what a Build derived from objects that have not changed since, for
// the next Build: the endpoints of each Service port, parsed from its
// EndpointSlices. An informer replaces an object on every change and never
// modifies one, so the same objects (pointers) give the same result. A Memo
// keeps only what the last Build used, and serves one Build at a time.
type Memo struct {
	endpoints, used map[endpointsKey]endpointsMemo
	spare           map[endpointsKey]endpointsMemo // the map before last, emptied for the next used
}

type endpointsKey struct {
	svc, port string
	proto     corev1.Protocol
}

type endpointsMemo struct {
	slices []*discoveryv1.EndpointSlice // what they were derived from
	eps    []netip.AddrPort             // shared: never modified
}

func (m *Memo) begin() {
	if m.spare == nil {
		m.spare = make(map[endpointsKey]endpointsMemo, len(m.endpoints))
	}
	m.used, m.spare = m.spare, nil
}

func (m *Memo) end() {
	clear(m.endpoints) // keeps its room for the next Build's used
	m.endpoints, m.used, m.spare = m.used, nil, m.endpoints
}

type builder struct {
	st       State
	memo     *Memo // nil: none
	problems []model.Problem

	services  map[string]*corev1.Service // "ns/name"
	slices    map[string][]*discoveryv1.EndpointSlice
	secrets   map[string]*corev1.Secret
	classes   map[string]*networkingv1.IngressClass
	nodeByIP  map[netip.Addr]string
	nodes     map[string]*corev1.Node
	groupList []*corev1.Service // groups, oldest first
	groupsOut map[string]*model.Group
	vipOwner  map[netip.Addr]string // group or L4 Service ("ns/name") each VIP is applied to
	owners    map[string]*hostOwner // hosts' namespaces (hostOwners)
	l4        []l4Acc               // L4 Services, by name
	views     []model.View          // Gateways with VIPs of their own, admitted
	// pendingViews wait for admitViews, oldest Gateway first.
	pendingViews []pendingView
	loads        map[string]*groupLoad // by group: its VIPs, its Views' and its L4 Services'
	pools        Pools                 // the operator's VIP pools
	reserved     map[model.Port]string // Options.ReservedPorts
	annotated    map[netip.Addr]string // annotatedVIPs, once computed
	bindings     Bindings

	servers   map[serverKey]*serverAcc
	upstreams map[string]*upstreamAcc // by identity key
	certs     map[string]model.Certificate
	gw        GatewayStatuses
}

type serverKey struct {
	group, view string
	port        uint16
	host        string
}

type serverAcc struct {
	srv       model.Server
	locs      map[locKey]string // location -> source, for conflicts
	certFrom  string
	defFrom   string
	locations []model.Location
}

type locKey struct {
	path string
	typ  model.PathType
}

type upstreamAcc struct {
	base      string           // "namespace-service-port" before collision handling (sanitized by snapshot)
	endpoints []netip.AddrPort // may repeat; sorted and compacted at the end
	// sorted: endpoints are one contribution's, sorted and without repeats
	// (serviceEndpoints'), shared with the Memo: the snapshot takes them as
	// they are. A second contribution copies them.
	sorted bool
}

func newBuilder(st State) *builder {
	b := &builder{
		st:        st,
		services:  make(map[string]*corev1.Service, len(st.Services)),
		slices:    make(map[string][]*discoveryv1.EndpointSlice, len(st.EndpointSlices)),
		secrets:   make(map[string]*corev1.Secret, len(st.Secrets)),
		classes:   map[string]*networkingv1.IngressClass{},
		nodeByIP:  map[netip.Addr]string{},
		nodes:     map[string]*corev1.Node{},
		groupsOut: map[string]*model.Group{},
		bindings:  Bindings{},
		servers:   make(map[serverKey]*serverAcc, len(st.Ingresses)),
		upstreams: make(map[string]*upstreamAcc, len(st.Ingresses)),
		certs:     map[string]model.Certificate{},
	}
	for _, s := range st.Services {
		b.services[key(s)] = s
	}
	for _, es := range st.EndpointSlices {
		svc := es.Labels[discoveryv1.LabelServiceName]
		if svc == "" {
			continue
		}
		k := es.Namespace + "/" + svc
		b.slices[k] = append(b.slices[k], es)
	}
	for k := range b.slices {
		slices.SortFunc(b.slices[k], func(x, y *discoveryv1.EndpointSlice) int { return cmp.Compare(x.Name, y.Name) })
	}
	for _, s := range st.Secrets {
		b.secrets[key(s)] = s
	}
	for _, c := range st.IngressClasses {
		b.classes[c.Name] = c
	}
	for _, n := range st.Nodes {
		b.nodes[n.Name] = n
		for _, a := range n.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				b.nodeByIP[ip] = n.Name
			}
		}
	}
	return b
}

func key(o metav1.Object) string {
	if o.GetNamespace() == "" {
		return o.GetName()
	}
	return o.GetNamespace() + "/" + o.GetName()
}

// older orders objects oldest first, then by namespace, then name: the deterministic order
// in which conflicts are decided (the first one wins).
func older(x, y metav1.Object) int {
	if c := x.GetCreationTimestamp().Compare(y.GetCreationTimestamp().Time); c != 0 {
		return c
	}
	return cmp.Or(cmp.Compare(x.GetNamespace(), y.GetNamespace()), cmp.Compare(x.GetName(), y.GetName()))
}

func (b *builder) problem(kind string, o metav1.Object, field string, reason model.Reason, format string, args ...any) {
	b.problems = append(b.problems, model.Problem{
		Object: kind + " " + key(o),
		Field:  field,
		Reason: reason,
		Detail: fmt.Sprintf(format, args...),
	})
}

func (b *builder) server(group, host string) *serverAcc {
	return b.serverIn(group, "", 0, host)
}

// serverIn is server in a view of the group and one of its ports ("" and 0
// for the group's own VIPs).
func (b *builder) serverIn(group, view string, port uint16, host string) *serverAcc {
	k := serverKey{group, view, port, host}
	s := b.servers[k]
	if s == nil {
		s = &serverAcc{srv: model.Server{Group: group, View: view, Port: port, Host: host}, locs: map[locKey]string{}}
		b.servers[k] = s
	}
	return s
}

// upstream records (or extends) an upstream and returns its identity key; names are
// assigned at the end, when collisions are known.
func (b *builder) upstream(base, id string, eps []netip.AddrPort) string {
	return b.upstreamOf(base, id, eps, false)
}

// upstreamOf is upstream; sorted says eps are sorted without repeats, and
// never modified (serviceEndpoints'): the first contribution is then kept
// without a copy.
func (b *builder) upstreamOf(base, id string, eps []netip.AddrPort, sorted bool) string {
	u := b.upstreams[id]
	if u == nil {
		u = &upstreamAcc{base: base}
		b.upstreams[id] = u
		if sorted && len(eps) > 0 {
			u.endpoints, u.sorted = eps, true
			return id
		}
	}
	if u.sorted { // a second contribution: from here on, a copy of our own
		u.endpoints, u.sorted = slices.Clone(u.endpoints), false
	}
	u.endpoints = append(u.endpoints, eps...)
	return id
}

func shortHash(s string) string {
	h := fnv.New32a()
	h.Write([]byte(s))
	return fmt.Sprintf("%08x", h.Sum32())
}

// snapshot assembles the sorted model, naming upstreams: "namespace-service-port", with
// a hash of the identity appended when two identities would share a name.
func (b *builder) snapshot() model.Snapshot {
	var snap model.Snapshot
	for _, g := range b.groupList {
		snap.Groups = append(snap.Groups, *b.groupsOut[key(g)])
	}
	slices.SortFunc(snap.Groups, func(x, y model.Group) int { return cmp.Compare(x.Name, y.Name) })

	byBase := make(map[string]int, len(b.upstreams))
	for _, u := range b.upstreams {
		u.base = sanitize(u.base)
		byBase[u.base]++
	}
	names := make(map[string]string, len(b.upstreams))
	snap.Upstreams = make([]model.Upstream, 0, len(b.upstreams))
	for id, u := range b.upstreams {
		n := u.base
		if byBase[n] > 1 {
			n += "-" + shortHash(id)
		}
		names[id] = n
		up := model.Upstream{Name: n}
		switch {
		case len(u.endpoints) == 0:
		case u.sorted:
			up.Endpoints = u.endpoints // the Memo's, sorted: shared, never modified
		default:
			up.Endpoints = u.endpoints // built by append from nil: owned, not shared
			slices.SortFunc(up.Endpoints, func(x, y netip.AddrPort) int { return x.Compare(y) })
			up.Endpoints = slices.Clip(slices.Compact(up.Endpoints))
		}
		snap.Upstreams = append(snap.Upstreams, up)
	}
	slices.SortFunc(snap.Upstreams, func(x, y model.Upstream) int { return cmp.Compare(x.Name, y.Name) })

	for _, acc := range b.l4 {
		svc := acc.svc
		for i, id := range acc.upstreams {
			svc.Ports[i].Upstream = names[id]
		}
		snap.Services = append(snap.Services, svc)
	}

	snap.Servers = make([]model.Server, 0, len(b.servers))
	for _, s := range b.servers {
		srv := s.srv
		if srv.DefaultUpstream != "" {
			srv.DefaultUpstream = names[srv.DefaultUpstream]
		}
		if len(s.locations) > 0 {
			srv.Locations = make([]model.Location, 0, len(s.locations))
		}
		for _, l := range s.locations {
			l.Upstream = names[l.Upstream]
			if len(l.Backends) > 0 {
				l.Backends = slices.Clone(l.Backends) // a rule's are shared by its matches and hosts
				for i := range l.Backends {
					l.Backends[i].Upstream = names[l.Backends[i].Upstream]
				}
			}
			if len(l.Filters.Mirrors) > 0 {
				l.Filters.Mirrors = slices.Clone(l.Filters.Mirrors)
				for i := range l.Filters.Mirrors {
					l.Filters.Mirrors[i].Upstream = names[l.Filters.Mirrors[i].Upstream]
				}
			}
			srv.Locations = append(srv.Locations, l)
		}
		slices.SortFunc(srv.Locations, func(x, y model.Location) int {
			return cmp.Or(cmp.Compare(x.Path, y.Path), cmp.Compare(x.Type, y.Type), cmp.Compare(x.Rank, y.Rank))
		})
		snap.Servers = append(snap.Servers, srv)
	}
	snap.Views = slices.SortedFunc(slices.Values(b.views), func(x, y model.View) int { return cmp.Compare(x.Name, y.Name) })
	slices.SortFunc(snap.Servers, func(x, y model.Server) int {
		return cmp.Or(cmp.Compare(x.Group, y.Group), cmp.Compare(x.View, y.View), cmp.Compare(x.Port, y.Port), cmp.Compare(x.Host, y.Host))
	})
	// Only the certificates a server uses (a losing TLS entry's Secret is not served).
	inUse := map[string]bool{}
	for _, s := range snap.Servers {
		inUse[s.TLSCertificate] = true
	}
	for _, c := range b.certs {
		if inUse[c.Name] {
			snap.Certificates = append(snap.Certificates, c)
		}
	}
	slices.SortFunc(snap.Certificates, func(x, y model.Certificate) int { return cmp.Compare(x.Name, y.Name) })
	return snap
}

// sanitize keeps an upstream name within [a-z0-9.-].
func sanitize(s string) string {
	s = strings.ToLower(s)
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '.' {
			return r
		}
		return '-'
	}, s)
}
