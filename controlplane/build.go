package controlplane

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/portico-edge/portico/controlplane/model"
)

// Names Portico reads and writes on Kubernetes objects.
const (
	// ControllerName is the IngressClass spec.controller Portico serves.
	ControllerName = "portico.io/ingress-controller"
	// LoadBalancerClass marks a LoadBalancer Service as a Portico group.
	LoadBalancerClass = "portico.io/vip"
	// LabelGroup ("true") marks a Service as a Portico group.
	LabelGroup = "portico.io/group"
	// AnnotationGroup binds an Ingress, Pod or IngressClass to a group.
	AnnotationGroup = "portico.io/group"
	// AnnotationGroupSelector asks the scheduler for a group matching a label selector.
	AnnotationGroupSelector = "portico.io/group-selector"
	// AnnotationVIP holds a group's VIPs (comma-separated).
	AnnotationVIP = "portico.io/vip"
	// AnnotationVIPAlias is seed 000's name for AnnotationVIP.
	AnnotationVIPAlias = "ingress.alpha.k8s.io/ingress-vip"
	// AnnotationVRID holds a group's VRRP virtual router id (1..255).
	AnnotationVRID = "portico.io/vrid"
	// AnnotationSSLRedirect ("true"/"false") redirects HTTP to HTTPS for an Ingress's hosts.
	AnnotationSSLRedirect = "portico.io/ssl-redirect"
	// LabelMicroservice ("true") marks a pod route (seed 004).
	LabelMicroservice = "microservice"
	// AnnotationTrafficHosts lists a pod route's hosts.
	AnnotationTrafficHosts = "trafficHosts"
	// AnnotationPublicPaths lists a pod route's PORT:PATH entries.
	AnnotationPublicPaths = "publicPaths"

	annotationIngressClass = "kubernetes.io/ingress.class"
	annotationDefaultClass = "ingressclass.kubernetes.io/is-default-class"
)

// Problem reasons (the bounded vocabulary of model.Problem.Reason and its metric label).
const (
	ReasonInvalidAnnotation  = "InvalidAnnotation"
	ReasonInvalidVIP         = "InvalidVIP"
	ReasonVIPConflict        = "VIPConflict"
	ReasonVIPPoolExhausted   = "VIPPoolExhausted"
	ReasonVRIDConflict       = "VRIDConflict"
	ReasonVRIDExhausted      = "VRIDExhausted"
	ReasonGroupNotFound      = "GroupNotFound"
	ReasonNoMatchingGroup    = "NoMatchingGroup"
	ReasonServiceNotFound    = "ServiceNotFound"
	ReasonPortNotFound       = "PortNotFound"
	ReasonUnsupportedBackend = "UnsupportedBackend"
	ReasonSecretNotFound     = "SecretNotFound"
	ReasonInvalidSecret      = "InvalidSecret"
	ReasonTLSConflict        = "TLSConflict"
	ReasonPathConflict       = "PathConflict"
	ReasonInvalidPath        = "InvalidPath"
	ReasonDefaultConflict    = "DefaultBackendConflict"
	ReasonUnsupportedPort    = "UnsupportedProtocol"
	ReasonAlreadyBound       = "AlreadyBound"
	ReasonNameTaken          = "NameTaken"
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
}

// Options are the settings Build depends on besides the objects.
type Options struct {
	// PodRouteGroup ("namespace/name") serves pod routes without a portico.io/group
	// annotation; "" leaves them unbound.
	PodRouteGroup string
}

// Build translates the cluster state into a snapshot. It is pure: the same state
// gives an equal snapshot and the same problems, in the same order.
func Build(st State, opts Options) (model.Snapshot, []model.Problem) {
	b := newBuilder(st)
	b.groups()
	b.ingresses()
	b.podRoutes(opts.PodRouteGroup)
	return b.snapshot(), b.problems
}

type builder struct {
	st       State
	problems []model.Problem

	services  map[string]*corev1.Service // "ns/name"
	slices    map[string][]*discoveryv1.EndpointSlice
	secrets   map[string]*corev1.Secret
	classes   map[string]*networkingv1.IngressClass
	nodeByIP  map[netip.Addr]string
	groupList []*corev1.Service // groups, oldest first
	groupsOut map[string]*model.Group

	servers   map[serverKey]*serverAcc
	upstreams map[string]*upstreamAcc // by identity key
	certs     map[string]model.Certificate
}

type serverKey struct{ group, host string }

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
	base      string           // "namespace-service-port" before collision handling
	endpoints []netip.AddrPort // may repeat; sorted and compacted at the end
}

func newBuilder(st State) *builder {
	b := &builder{
		st:        st,
		services:  map[string]*corev1.Service{},
		slices:    map[string][]*discoveryv1.EndpointSlice{},
		secrets:   map[string]*corev1.Secret{},
		classes:   map[string]*networkingv1.IngressClass{},
		nodeByIP:  map[netip.Addr]string{},
		groupsOut: map[string]*model.Group{},
		servers:   map[serverKey]*serverAcc{},
		upstreams: map[string]*upstreamAcc{},
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

func (b *builder) problem(kind string, o metav1.Object, field, reason, format string, args ...any) {
	b.problems = append(b.problems, model.Problem{
		Object: kind + " " + key(o),
		Field:  field,
		Reason: reason,
		Detail: fmt.Sprintf(format, args...),
	})
}

// IsGroup reports whether a Service is a Portico group.
func IsGroup(s *corev1.Service) bool {
	if s.Labels[LabelGroup] == "true" {
		return true
	}
	return s.Spec.Type == corev1.ServiceTypeLoadBalancer && s.Spec.LoadBalancerClass != nil &&
		*s.Spec.LoadBalancerClass == LoadBalancerClass
}

// sortedGroups returns the group Services oldest first.
func sortedGroups(services []*corev1.Service) []*corev1.Service {
	var gs []*corev1.Service
	for _, s := range services {
		if IsGroup(s) {
			gs = append(gs, s)
		}
	}
	slices.SortFunc(gs, func(x, y *corev1.Service) int { return older(x, y) })
	return gs
}

// vipAnnotation returns a Service's VIP annotation (portico.io/vip, else the alias).
func vipAnnotation(s *corev1.Service) (string, string, bool) {
	if v, ok := s.Annotations[AnnotationVIP]; ok {
		return v, AnnotationVIP, true
	}
	v, ok := s.Annotations[AnnotationVIPAlias]
	return v, AnnotationVIPAlias, ok
}

// parseVIPs parses a comma-separated VIP list: at most one address per family.
func parseVIPs(v string) ([]netip.Addr, error) {
	var out []netip.Addr
	for f := range strings.SplitSeq(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("%q is not an IP address", f)
		}
		if a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() || a.IsLoopback() {
			return nil, fmt.Errorf("%s is not a usable unicast address", a)
		}
		a = a.Unmap()
		for _, o := range out {
			if o.Is4() == a.Is4() {
				return nil, fmt.Errorf("more than one %s address", family(a))
			}
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no address in %q", v)
	}
	slices.SortFunc(out, func(x, y netip.Addr) int { return x.Compare(y) })
	return out, nil
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// groupVIPs is a group's valid VIP annotation, reporting anything wrong with it.
func (b *builder) groupVIPs(s *corev1.Service) []netip.Addr {
	v, name, ok := vipAnnotation(s)
	if !ok {
		return nil
	}
	if alias, aok := s.Annotations[AnnotationVIPAlias]; aok && name == AnnotationVIP && alias != v {
		b.problem("Service", s, "metadata.annotations["+AnnotationVIPAlias+"]", ReasonInvalidVIP,
			"differs from %s (%q); %s is used", AnnotationVIP, v, AnnotationVIP)
	}
	vips, err := parseVIPs(v)
	if err != nil {
		b.problem("Service", s, "metadata.annotations["+name+"]", ReasonInvalidVIP, "%v", err)
		return nil
	}
	return vips
}

// parseVRID parses a VRRP virtual router id.
func parseVRID(v string) (uint8, error) {
	n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 8)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("%q is not a VRRP id in 1..255", v)
	}
	return uint8(n), nil
}

func (b *builder) groups() {
	b.groupList = sortedGroups(b.st.Services)
	vipOwner := map[netip.Addr]string{}
	vridOwner := map[uint8]string{}
	for _, s := range b.groupList {
		g := &model.Group{Name: key(s)}
		for _, a := range b.groupVIPs(s) {
			if o, taken := vipOwner[a]; taken {
				b.problem("Service", s, "metadata.annotations["+AnnotationVIP+"]", ReasonVIPConflict,
					"VIP %s already belongs to group %s; not applied", a, o)
				continue
			}
			vipOwner[a] = g.Name
			g.VIPs = append(g.VIPs, a)
		}
		if v, ok := s.Annotations[AnnotationVRID]; ok {
			id, err := parseVRID(v)
			switch {
			case err != nil:
				b.problem("Service", s, "metadata.annotations["+AnnotationVRID+"]", ReasonInvalidAnnotation, "%v", err)
			case vridOwner[id] != "":
				b.problem("Service", s, "metadata.annotations["+AnnotationVRID+"]", ReasonVRIDConflict,
					"VRID %d already belongs to group %s; not applied", id, vridOwner[id])
			default:
				vridOwner[id] = g.Name
				g.VRID = id
			}
		}
		for i, p := range s.Spec.Ports {
			proto := model.Protocol(p.Protocol)
			if p.Protocol == "" {
				proto = model.TCP
			}
			if proto != model.TCP && proto != model.UDP {
				b.problem("Service", s, fmt.Sprintf("spec.ports[%d].protocol", i), ReasonUnsupportedPort,
					"protocol %s is not served", p.Protocol)
				continue
			}
			mp := model.Port{Protocol: proto, Port: uint16(p.Port)}
			if !slices.Contains(g.Ports, mp) {
				g.Ports = append(g.Ports, mp)
			}
		}
		slices.SortFunc(g.Ports, func(x, y model.Port) int {
			return cmp.Or(cmp.Compare(x.Protocol, y.Protocol), cmp.Compare(x.Port, y.Port))
		})
		g.Replicas = b.replicas(s)
		b.groupsOut[g.Name] = g
	}
}

// replicas lists a group's agents from its EndpointSlices: ready endpoints are Ready,
// terminating ones that still serve (or do not say) are Draining, the rest are left out.
func (b *builder) replicas(s *corev1.Service) []model.Replica {
	byAddr := map[netip.Addr]model.Replica{}
	for _, es := range b.slices[key(s)] {
		if es.AddressType == discoveryv1.AddressTypeFQDN {
			continue
		}
		for _, ep := range es.Endpoints {
			var st model.ReplicaState
			switch {
			case ep.Conditions.Terminating != nil && *ep.Conditions.Terminating:
				if ep.Conditions.Serving != nil && !*ep.Conditions.Serving {
					continue
				}
				st = model.Draining
			case ep.Conditions.Ready == nil || *ep.Conditions.Ready:
				st = model.Ready
			default:
				continue
			}
			for _, a := range ep.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil {
					continue
				}
				ip = ip.Unmap()
				node := ""
				if ep.NodeName != nil {
					node = *ep.NodeName
				} else {
					node = b.nodeByIP[ip]
				}
				r := model.Replica{Node: node, Addr: ip, Weight: 1, State: st}
				if old, ok := byAddr[ip]; ok && old.State == model.Ready {
					continue // listed twice (slices overlap during updates): Ready wins
				}
				byAddr[ip] = r
			}
		}
	}
	out := make([]model.Replica, 0, len(byAddr))
	for _, r := range byAddr {
		out = append(out, r)
	}
	slices.SortFunc(out, func(x, y model.Replica) int { return x.Addr.Compare(y.Addr) })
	if len(out) == 0 {
		return nil
	}
	return out
}

// groupRef resolves a group reference ("name" relative to ns, or "ns/name").
func groupRef(ref, ns string) string {
	ref = strings.TrimSpace(ref)
	if strings.Contains(ref, "/") {
		return ref
	}
	return ns + "/" + ref
}

// Binding is how an Ingress is tied to a group.
type Binding struct {
	// Ours is false for Ingresses of other controllers: Portico leaves them alone.
	Ours bool
	// Group is the bound group ("ns/name"), "" while unbound.
	Group string
	// Selector is set when the Ingress asks the scheduler for a group.
	Selector labels.Selector
	// Field and Err describe a binding that could not be read.
	Field string
	Err   error
}

// isPorticoClass reports whether an IngressClass is served by Portico.
func isPorticoClass(c *networkingv1.IngressClass) bool {
	return c != nil && c.Spec.Controller == ControllerName
}

// defaultClass returns the default Portico IngressClass, if any.
func defaultClass(classes map[string]*networkingv1.IngressClass) *networkingv1.IngressClass {
	var names []string
	for n, c := range classes {
		if isPorticoClass(c) && c.Annotations[annotationDefaultClass] == "true" {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return nil
	}
	slices.Sort(names)
	return classes[names[0]]
}

// BindingOf resolves an Ingress's binding (see the package documentation for the order).
func BindingOf(ing *networkingv1.Ingress, classes map[string]*networkingv1.IngressClass) Binding {
	var class *networkingv1.IngressClass
	className := ""
	switch {
	case ing.Spec.IngressClassName != nil:
		className = *ing.Spec.IngressClassName
	case ing.Annotations[annotationIngressClass] != "":
		className = ing.Annotations[annotationIngressClass]
	}
	if className != "" {
		class = classes[className]
	} else {
		class = defaultClass(classes)
	}
	if g, ok := ing.Annotations[AnnotationGroup]; ok {
		// An explicit or recorded binding wins, unless the Ingress names another
		// controller's class.
		if class != nil && !isPorticoClass(class) {
			return Binding{}
		}
		if strings.TrimSpace(g) == "" {
			return Binding{Ours: true, Field: "metadata.annotations[" + AnnotationGroup + "]", Err: fmt.Errorf("empty group")}
		}
		return Binding{Ours: true, Group: groupRef(g, ing.Namespace)}
	}
	if sel, ok := ing.Annotations[AnnotationGroupSelector]; ok && (class == nil || isPorticoClass(class)) {
		return selectorBinding(sel, "metadata.annotations["+AnnotationGroupSelector+"]")
	}
	if !isPorticoClass(class) {
		return Binding{}
	}
	if p := class.Spec.Parameters; p != nil && p.Kind == "Service" && (p.APIGroup == nil || *p.APIGroup == "") {
		ns := ""
		if p.Namespace != nil {
			ns = *p.Namespace
		}
		if ns == "" {
			return Binding{Ours: true, Field: "IngressClass " + class.Name + " spec.parameters.namespace", Err: fmt.Errorf("a Service parameter needs a namespace")}
		}
		return Binding{Ours: true, Group: ns + "/" + p.Name}
	}
	if g := class.Annotations[AnnotationGroup]; g != "" {
		if !strings.Contains(g, "/") {
			return Binding{Ours: true, Field: "IngressClass " + class.Name + " metadata.annotations[" + AnnotationGroup + "]", Err: fmt.Errorf("%q is not namespace/name", g)}
		}
		return Binding{Ours: true, Group: g}
	}
	if sel, ok := class.Annotations[AnnotationGroupSelector]; ok {
		return selectorBinding(sel, "IngressClass "+class.Name+" metadata.annotations["+AnnotationGroupSelector+"]")
	}
	return Binding{Ours: true, Field: "IngressClass " + class.Name, Err: fmt.Errorf("the class names no group: set spec.parameters (kind Service) or the %s annotation", AnnotationGroup)}
}

func selectorBinding(sel, field string) Binding {
	s, err := labels.Parse(sel)
	if err != nil {
		return Binding{Ours: true, Field: field, Err: fmt.Errorf("bad label selector: %w", err)}
	}
	return Binding{Ours: true, Selector: s}
}

// boundIngresses lists the Ingresses bound to an existing group, oldest first,
// reporting the ones whose binding is broken.
func (b *builder) boundIngresses() []*networkingv1.Ingress {
	ings := slices.Clone(b.st.Ingresses)
	slices.SortFunc(ings, func(x, y *networkingv1.Ingress) int { return older(x, y) })
	var out []*networkingv1.Ingress
	for _, ing := range ings {
		bd := BindingOf(ing, b.classes)
		switch {
		case !bd.Ours:
		case bd.Err != nil:
			b.problem("Ingress", ing, bd.Field, ReasonInvalidAnnotation, "%v", bd.Err)
		case bd.Group == "":
			// Waiting for the scheduler, which needs a matching group.
			if len(matchingGroups(b.groupList, bd.Selector)) == 0 {
				b.problem("Ingress", ing, "metadata.annotations["+AnnotationGroupSelector+"]", ReasonNoMatchingGroup,
					"no group matches selector %q", bd.Selector.String())
			}
		case b.groupsOut[bd.Group] == nil:
			b.problem("Ingress", ing, "metadata.annotations["+AnnotationGroup+"]", ReasonGroupNotFound,
				"group %s does not exist (bindings are sticky: recreate it or rebind by hand)", bd.Group)
		default:
			out = append(out, ing)
		}
	}
	return out
}

func (b *builder) server(group, host string) *serverAcc {
	k := serverKey{group, host}
	s := b.servers[k]
	if s == nil {
		s = &serverAcc{srv: model.Server{Group: group, Host: host}, locs: map[locKey]string{}}
		b.servers[k] = s
	}
	return s
}

func (b *builder) ingresses() {
	for _, ing := range b.boundIngresses() {
		group := BindingOf(ing, b.classes).Group
		src := key(ing)
		redirect := false
		if v, ok := ing.Annotations[AnnotationSSLRedirect]; ok {
			r, err := strconv.ParseBool(v)
			if err != nil {
				b.problem("Ingress", ing, "metadata.annotations["+AnnotationSSLRedirect+"]", ReasonInvalidAnnotation,
					"%q is not true or false", v)
			}
			redirect = r
		}
		// TLS: host -> certificate name.
		tlsFor := map[string]string{}
		for i, t := range ing.Spec.TLS {
			cert, ok := b.certificate(ing, i, t.SecretName)
			if !ok {
				continue
			}
			hosts := t.Hosts
			if len(hosts) == 0 {
				hosts = []string{""}
			}
			for _, h := range hosts {
				h = strings.ToLower(h)
				if _, dup := tlsFor[h]; !dup {
					tlsFor[h] = cert
				}
			}
		}
		// touch applies the Ingress's host-wide settings to a server it contributes to.
		touched := map[string]bool{}
		touch := func(s *serverAcc) {
			host := s.srv.Host
			if !touched[host] {
				touched[host] = true
				s.srv.SSLRedirect = s.srv.SSLRedirect || redirect
				if c, ok := tlsFor[host]; ok {
					switch {
					case s.srv.TLSCertificate == "":
						s.srv.TLSCertificate, s.certFrom = c, src
					case s.srv.TLSCertificate != c:
						b.problem("Ingress", ing, "spec.tls", ReasonTLSConflict,
							"host %q already uses certificate %s from Ingress %s", host, s.srv.TLSCertificate, s.certFrom)
					}
				}
			}
		}
		if db := ing.Spec.DefaultBackend; db != nil {
			if up, ok := b.backend(ing, "spec.defaultBackend", *db); ok {
				s := b.server(group, "")
				if s.srv.DefaultUpstream == "" {
					s.srv.DefaultUpstream, s.defFrom = up, src
					touch(s)
				} else {
					b.problem("Ingress", ing, "spec.defaultBackend", ReasonDefaultConflict,
						"group %s already has the default backend of Ingress %s", group, s.defFrom)
				}
			}
		}
		for ri, rule := range ing.Spec.Rules {
			host := strings.ToLower(rule.Host)
			if rule.HTTP == nil {
				if _, ok := tlsFor[host]; ok {
					touch(b.server(group, host))
				}
				continue
			}
			for pi, p := range rule.HTTP.Paths {
				field := fmt.Sprintf("spec.rules[%d].http.paths[%d]", ri, pi)
				typ := model.PathImplementationSpecific
				if p.PathType != nil {
					typ = model.PathType(*p.PathType)
				}
				path := p.Path
				if path == "" && typ == model.PathImplementationSpecific {
					path = "/"
				}
				if !strings.HasPrefix(path, "/") || (typ != model.PathExact && typ != model.PathPrefix && typ != model.PathImplementationSpecific) {
					b.problem("Ingress", ing, field+".path", ReasonInvalidPath, "path %q of type %s is not served", p.Path, typ)
					continue
				}
				up, ok := b.backend(ing, field+".backend", p.Backend)
				if !ok {
					continue
				}
				s := b.server(group, host)
				lk := locKey{path, typ}
				if owner, taken := s.locs[lk]; taken {
					b.problem("Ingress", ing, field, ReasonPathConflict,
						"%s path %q of host %q is already routed by %s", typ, path, host, owner)
					continue
				}
				touch(s)
				s.locs[lk] = src
				s.locations = append(s.locations, model.Location{Path: path, Type: typ, Upstream: up, Source: src})
			}
		}
	}
}

// certificate returns the Certificate name of an Ingress TLS entry's Secret.
func (b *builder) certificate(ing *networkingv1.Ingress, i int, name string) (string, bool) {
	field := fmt.Sprintf("spec.tls[%d].secretName", i)
	if name == "" {
		b.problem("Ingress", ing, field, ReasonSecretNotFound, "no secret named")
		return "", false
	}
	k := ing.Namespace + "/" + name
	sec := b.secrets[k]
	if sec == nil {
		b.problem("Ingress", ing, field, ReasonSecretNotFound, "TLS secret %s does not exist; hosts served without TLS", k)
		return "", false
	}
	crt, key := sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey]
	if sec.Type != corev1.SecretTypeTLS || len(crt) == 0 || len(key) == 0 {
		b.problem("Ingress", ing, field, ReasonInvalidSecret, "secret %s is not a kubernetes.io/tls secret with %s and %s", k, corev1.TLSCertKey, corev1.TLSPrivateKeyKey)
		return "", false
	}
	if _, ok := b.certs[k]; !ok {
		b.certs[k] = model.Certificate{Name: k, CertPEM: slices.Clone(crt), KeyPEM: slices.Clone(key)}
	}
	return k, true
}

// backend resolves an Ingress backend to an upstream name. A missing Service still
// gets an (empty, so 503) upstream, so the path does not fall through to another route.
func (b *builder) backend(ing *networkingv1.Ingress, field string, be networkingv1.IngressBackend) (string, bool) {
	if be.Service == nil {
		b.problem("Ingress", ing, field, ReasonUnsupportedBackend, "only Service backends are served")
		return "", false
	}
	svcKey := ing.Namespace + "/" + be.Service.Name
	svc := b.services[svcKey]
	portLabel := be.Service.Port.Name
	if be.Service.Port.Name == "" {
		portLabel = strconv.Itoa(int(be.Service.Port.Number))
	}
	if svc == nil {
		b.problem("Ingress", ing, field+".service.name", ReasonServiceNotFound, "Service %s does not exist; answering 503", svcKey)
		return b.upstream(ing.Namespace+"-"+be.Service.Name+"-"+portLabel, "svc|"+svcKey+"|"+portLabel, nil), true
	}
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		b.problem("Ingress", ing, field+".service.name", ReasonUnsupportedBackend, "ExternalName Service %s is not served", svcKey)
		return "", false
	}
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		p := &svc.Spec.Ports[i]
		if (be.Service.Port.Name != "" && p.Name == be.Service.Port.Name) ||
			(be.Service.Port.Name == "" && p.Port == be.Service.Port.Number) {
			sp = p
			break
		}
	}
	if sp == nil {
		b.problem("Ingress", ing, field+".service.port", ReasonPortNotFound, "Service %s has no port %s; answering 503", svcKey, portLabel)
		return b.upstream(ing.Namespace+"-"+be.Service.Name+"-"+portLabel, "svc|"+svcKey+"|"+portLabel, nil), true
	}
	port := strconv.Itoa(int(sp.Port))
	if id := "svc|" + svcKey + "|" + port; b.upstreams[id] != nil {
		return id, true // another path of the same Service port: endpoints known
	}
	return b.upstream(ing.Namespace+"-"+be.Service.Name+"-"+port, "svc|"+svcKey+"|"+port, b.serviceEndpoints(svcKey, sp)), true
}

// serviceEndpoints lists the ready endpoints of one Service port from its
// EndpointSlices (slice ports carry the Service port's name).
func (b *builder) serviceEndpoints(svcKey string, sp *corev1.ServicePort) []netip.AddrPort {
	var out []netip.AddrPort
	proto := sp.Protocol
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	for _, es := range b.slices[svcKey] {
		if es.AddressType == discoveryv1.AddressTypeFQDN {
			continue
		}
		var port int32
		for _, p := range es.Ports {
			pp := corev1.ProtocolTCP
			if p.Protocol != nil {
				pp = *p.Protocol
			}
			name := ""
			if p.Name != nil {
				name = *p.Name
			}
			if name == sp.Name && pp == proto && p.Port != nil {
				port = *p.Port
				break
			}
		}
		if port == 0 {
			continue
		}
		for _, ep := range es.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, a := range ep.Addresses {
				if ip, err := netip.ParseAddr(a); err == nil {
					out = append(out, netip.AddrPortFrom(ip.Unmap(), uint16(port)))
				}
			}
		}
	}
	return out
}

// upstream records (or extends) an upstream and returns its identity key; names are
// assigned at the end, when collisions are known.
func (b *builder) upstream(base, id string, eps []netip.AddrPort) string {
	u := b.upstreams[id]
	if u == nil {
		u = &upstreamAcc{base: base}
		b.upstreams[id] = u
	}
	u.endpoints = append(u.endpoints, eps...)
	return id
}

// splitList splits an annotation list on commas and white space (the seed uses
// spaces, Portico's examples commas).
func splitList(v string) []string {
	return strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' })
}

func (b *builder) podRoutes(defaultGroup string) {
	pods := slices.Clone(b.st.Pods)
	slices.SortFunc(pods, func(x, y *corev1.Pod) int { return older(x, y) })
	for _, pod := range pods {
		if pod.Labels[LabelMicroservice] != "true" || pod.DeletionTimestamp != nil ||
			pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		hostsV, okH := pod.Annotations[AnnotationTrafficHosts]
		pathsV, okP := pod.Annotations[AnnotationPublicPaths]
		if !okH || !okP {
			missing := AnnotationTrafficHosts
			if okH {
				missing = AnnotationPublicPaths
			}
			b.problem("Pod", pod, "metadata.annotations["+missing+"]", ReasonInvalidAnnotation, "a microservice pod needs %s and %s", AnnotationTrafficHosts, AnnotationPublicPaths)
			continue
		}
		group := defaultGroup
		if g, ok := pod.Annotations[AnnotationGroup]; ok {
			group = groupRef(g, pod.Namespace)
		}
		if group == "" || b.groupsOut[group] == nil {
			b.problem("Pod", pod, "metadata.annotations["+AnnotationGroup+"]", ReasonGroupNotFound, "pod route has no group (group %q)", group)
			continue
		}
		hosts := splitList(hostsV)
		if len(hosts) == 0 {
			b.problem("Pod", pod, "metadata.annotations["+AnnotationTrafficHosts+"]", ReasonInvalidAnnotation, "no host in %q", hostsV)
			continue
		}
		type pp struct {
			port uint16
			path string
		}
		var paths []pp
		bad := false
		for _, e := range splitList(pathsV) {
			ps, path, ok := strings.Cut(e, ":")
			port, err := strconv.ParseUint(ps, 10, 16)
			if !ok || err != nil || port == 0 || !strings.HasPrefix(path, "/") {
				b.problem("Pod", pod, "metadata.annotations["+AnnotationPublicPaths+"]", ReasonInvalidAnnotation, "entry %q is not PORT:PATH", e)
				bad = true
				continue
			}
			paths = append(paths, pp{uint16(port), path})
		}
		if len(paths) == 0 && !bad {
			b.problem("Pod", pod, "metadata.annotations["+AnnotationPublicPaths+"]", ReasonInvalidAnnotation, "no path in %q", pathsV)
		}
		ip, err := netip.ParseAddr(pod.Status.PodIP)
		if err != nil {
			continue // not running yet: nothing to route to
		}
		ip = ip.Unmap()
		src := key(pod)
		for _, h := range hosts {
			h = strings.ToLower(h)
			for _, p := range paths {
				id := fmt.Sprintf("pod|%s|%s|%s|%d", pod.Namespace, h, p.path, p.port)
				base := fmt.Sprintf("%s-pod-%s-%d", pod.Namespace, shortHash(h+"|"+p.path), p.port)
				up := b.upstream(base, id, []netip.AddrPort{netip.AddrPortFrom(ip, p.port)})
				s := b.server(group, h)
				lk := locKey{p.path, model.PathPrefix}
				if owner, taken := s.locs[lk]; taken {
					// Replicas of one pod route share the location and its upstream.
					if owner == "pods:"+up {
						continue
					}
					b.problem("Pod", pod, "metadata.annotations["+AnnotationPublicPaths+"]", ReasonPathConflict,
						"path %q of host %q is already routed by %s", p.path, h, strings.TrimPrefix(owner, "pods:"))
					continue
				}
				s.locs[lk] = "pods:" + up
				s.locations = append(s.locations, model.Location{Path: p.path, Type: model.PathPrefix, Upstream: up, Source: src})
			}
		}
	}
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

	byBase := map[string]int{}
	for _, u := range b.upstreams {
		byBase[sanitize(u.base)]++
	}
	names := map[string]string{}
	for id, u := range b.upstreams {
		n := sanitize(u.base)
		if byBase[n] > 1 {
			n += "-" + shortHash(id)
		}
		names[id] = n
		up := model.Upstream{Name: n}
		if len(u.endpoints) > 0 {
			up.Endpoints = u.endpoints // built by append from nil: owned, not shared
			slices.SortFunc(up.Endpoints, func(x, y netip.AddrPort) int { return x.Compare(y) })
			up.Endpoints = slices.Clip(slices.Compact(up.Endpoints))
		}
		snap.Upstreams = append(snap.Upstreams, up)
	}
	slices.SortFunc(snap.Upstreams, func(x, y model.Upstream) int { return cmp.Compare(x.Name, y.Name) })

	for _, s := range b.servers {
		srv := s.srv
		if srv.DefaultUpstream != "" {
			srv.DefaultUpstream = names[srv.DefaultUpstream]
		}
		for _, l := range s.locations {
			l.Upstream = names[l.Upstream]
			srv.Locations = append(srv.Locations, l)
		}
		slices.SortFunc(srv.Locations, func(x, y model.Location) int {
			return cmp.Or(cmp.Compare(x.Path, y.Path), cmp.Compare(x.Type, y.Type))
		})
		snap.Servers = append(snap.Servers, srv)
	}
	slices.SortFunc(snap.Servers, func(x, y model.Server) int {
		return cmp.Or(cmp.Compare(x.Group, y.Group), cmp.Compare(x.Host, y.Host))
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
