package controlplane

import (
	"cmp"
	"crypto/tls"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
)

// Gateway API: the GatewayClasses whose controllerName is Portico's, their
// Gateways and the HTTPRoutes attached to them, translated into the same
// Servers and Locations as Ingresses (the reload-free table), and the status
// each object should have.
//
// A Gateway is served by a group (portico.io/group on the Gateway, else the
// group Service its GatewayClass's parametersRef names, else the default
// group, Options.PodRouteGroup), its HTTP and HTTPS listeners on the group's
// nginx ports. Its addresses are its own (a model.View: announced and steered
// over the group's replicas like an L4 Service's, and the hosts its routes
// name are served on them alone): its spec.addresses, else the addresses its
// status already gives (the record of an earlier allocation, as MetalLB keeps
// a Service's), else the lowest free address of each family of the first VIP
// pool that allows it. A Gateway whose spec.addresses are its group's VIPs,
// or any Gateway when the operator has no VIP pool at all, shares the group's
// VIPs and hosts with its Ingresses. Listeners of other protocols, or on
// other ports, are not accepted (yet).

const (
	gatewayGroup  = gatewayv1.GroupName // "gateway.networking.k8s.io"
	kindGateway   = "Gateway"
	kindHTTPRoute = "HTTPRoute"
)

// GatewayFeatures are the Gateway API features Portico's GatewayClasses
// support (their status.supportedFeatures; make conformance claims them),
// sorted.
var GatewayFeatures = []string{
	"Gateway", "GatewayAddressEmpty", "GatewayHTTPListenerIsolation", "GatewayHTTPSListenerDetectMisdirectedRequests", "GatewayPort8080", "GatewayStaticAddresses", "HTTPRoute", "HTTPRoute303RedirectStatusCode", "HTTPRoute307RedirectStatusCode", "HTTPRoute308RedirectStatusCode",
	"HTTPRouteBackendProtocolWebSocket", "HTTPRouteBackendTimeout", "HTTPRouteCORS", "HTTPRouteHostRewrite", "HTTPRouteMethodMatching", "HTTPRouteNamedRouteRule", "HTTPRouteParentRefPort",
	"HTTPRoutePathRedirect", "HTTPRoutePathRewrite", "HTTPRoutePortRedirect", "HTTPRouteQueryParamMatching", "HTTPRouteRequestMirror", "HTTPRouteRequestMultipleMirrors", "HTTPRouteRequestPercentageMirror", "HTTPRouteRequestTimeout",
	"HTTPRouteResponseHeaderModification", "HTTPRouteSchemeRedirect", "ReferenceGrant",
}

// GatewayStatuses are the statuses a build computed for the Gateway API
// objects Portico serves, by name ("namespace/name"; a GatewayClass's name
// alone). Routes hold only the parents that are Portico's Gateways.
type GatewayStatuses struct {
	Classes  map[string][]metav1.Condition
	Gateways map[string]gatewayv1.GatewayStatus
	Routes   map[string][]gatewayv1.RouteParentStatus
	// Groups are the group that serves each Gateway.
	Groups map[string]string
}

// gwListener is one listener of a Gateway as the build sees it.
type gwListener struct {
	l        *gatewayv1.Listener
	status   gatewayv1.ListenerStatus
	accepted bool     // routes may attach
	cert     string   // HTTPS: its certificate's name
	group    string   // its Gateway's group
	view     string   // its Gateway's view ("" for the group's VIPs)
	port     uint16   // its port in the view (0 outside one)
	of       *gwAcc   // its Gateway
	routes   []string // the routes attached to it
}

// gwAcc is one of Portico's Gateways.
type gwAcc struct {
	gw        *gatewayv1.Gateway
	group     string
	view      string       // key(gw) when it has addresses of its own, else ""
	vips      []netip.Addr // its addresses (its group's when view is "")
	nowhere   bool         // its routes are served nowhere: no address of its own yet (and it shares none), or its group is full
	listeners []*gwListener
	status    gatewayv1.GatewayStatus
}

// condition builds a condition of an object's generation; the writer sets
// its transition time.
func condition(t string, ok bool, reason, msg string, gen int64) metav1.Condition {
	st := metav1.ConditionFalse
	if ok {
		st = metav1.ConditionTrue
	}
	return metav1.Condition{Type: t, Status: st, Reason: reason, Message: msg, ObservedGeneration: gen}
}

// gateways translates the Gateway API objects, once the Ingresses have been:
// an Ingress keeps the Locations it had (Rank 0 before every route's).
func (b *builder) gateways(defaultGroup string, poolsFor func(metav1.Object) *Pools) {
	b.gw = GatewayStatuses{Classes: map[string][]metav1.Condition{}, Gateways: map[string]gatewayv1.GatewayStatus{}, Routes: map[string][]gatewayv1.RouteParentStatus{}}
	b.gw.Groups = map[string]string{}
	ours := map[string]string{} // class -> its group ("" for the default)
	for _, c := range b.st.GatewayClasses {
		if string(c.Spec.ControllerName) != v1alpha1.GatewayControllerName {
			continue
		}
		group, err := b.classGroup(c)
		if err != nil {
			b.gw.Classes[c.Name] = []metav1.Condition{condition(string(gatewayv1.GatewayClassConditionStatusAccepted), false,
				string(gatewayv1.GatewayClassReasonInvalidParameters), err.Error(), c.Generation)}
			continue
		}
		ours[c.Name] = group
		b.gw.Classes[c.Name] = []metav1.Condition{condition(string(gatewayv1.GatewayClassConditionStatusAccepted), true,
			string(gatewayv1.GatewayClassReasonAccepted), "served by Portico", c.Generation)}
	}
	if len(ours) == 0 {
		return
	}
	var gws []*gatewayv1.Gateway
	for _, g := range b.st.Gateways {
		if _, ok := ours[string(g.Spec.GatewayClassName)]; ok {
			gws = append(gws, g)
		}
	}
	slices.SortFunc(gws, func(x, y *gatewayv1.Gateway) int { return older(x, y) })
	accs := map[string]*gwAcc{}
	for _, g := range gws {
		a := b.gateway(g, cmp.Or(ours[string(g.Spec.GatewayClassName)], defaultGroup), poolsFor(g))
		accs[key(g)] = a
		b.gw.Groups[key(g)] = a.group
	}
	routes := slices.Clone(b.st.HTTPRoutes)
	slices.SortFunc(routes, func(x, y *gatewayv1.HTTPRoute) int { return older(x, y) })
	rt := &routeTable{}
	for order, r := range routes {
		b.httpRoute(r, order, accs, rt)
	}
	// An HTTPS listener's certificate answers every name its hostname covers,
	// routed or not (a request no route takes then gets its 404 over TLS),
	// when no route's listener gave the host one.
	// A listener's hostname is a host like a route's: one another namespace
	// owns (mayRoute) gets no certificate from it.
	for _, g := range gws {
		for _, l := range accs[key(g)].listeners {
			host := hostnameOf(l.l.Hostname)
			if !l.accepted || l.cert == "" || l.of.nowhere {
				continue
			}
			if ok, o := b.mayRoute(host, g.Namespace); !ok {
				b.problem(kindGateway, g, "spec.listeners["+string(l.l.Name)+"].hostname", model.ReasonHostTaken,
					"host %q belongs to namespace %s (%s claimed it first); its certificate is not served", host, o.namespace, o.by)
				continue
			}
			if s := b.listenerServer(l, modelHost(host)); s.srv.TLSCertificate == "" {
				s.srv.TLSCertificate, s.certFrom = l.cert, key(g)
			}
		}
	}
	// In a view, each listener's hostname is a host of its own (a listener
	// without one, the catch-all), with no route (404) or only those attached
	// to it: a request goes to the most specific listener its host matches,
	// and no less specific one's routes take it (Gateway API's listener
	// isolation).
	for _, g := range gws {
		for _, l := range accs[key(g)].listeners {
			if host := hostnameOf(l.l.Hostname); l.accepted && l.view != "" && !l.of.nowhere {
				if ok, _ := b.mayRoute(host, g.Namespace); ok || host == "" {
					b.listenerServer(l, modelHost(host))
				}
			}
		}
	}
	rt.rank(b)
	for k, a := range accs {
		if g := b.groupsOut[a.group]; g != nil {
			served(g, kindGateway+" "+k, a.gw.Generation)
			// A request no route takes gets 404 (Gateway API's answer; a view's
			// always), unless the group's annotation says how to answer it.
			if svc := b.services[a.group]; a.view == "" && svc != nil && svc.Annotations[v1alpha1.AnnotationUnmatchedHost] == "" {
				g.UnmatchedHost = model.UnmatchedHostNotFound
			}
		}
		for _, l := range a.listeners {
			a.status.Listeners = append(a.status.Listeners, l.status)
		}
		b.gw.Gateways[k] = a.status
	}
}

// classGroup is the group a GatewayClass's parametersRef names (a group
// Service), "" when it names none.
func (b *builder) classGroup(c *gatewayv1.GatewayClass) (string, error) {
	p := c.Spec.ParametersRef
	if p == nil {
		return "", nil
	}
	if p.Group != "" || p.Kind != "Service" || p.Namespace == nil || *p.Namespace == "" {
		return "", fmt.Errorf("parametersRef must name a group Service (kind Service, with its namespace), not %s %s", refKind(&p.Group, &p.Kind), p.Name)
	}
	k := string(*p.Namespace) + "/" + p.Name
	if b.groupsOut[k] == nil {
		return "", fmt.Errorf("parametersRef: Service %s is not a Portico group", k)
	}
	return k, nil
}

// gateway checks a Gateway and its listeners.
func (b *builder) gateway(gw *gatewayv1.Gateway, defaultGroup string, pools *Pools) *gwAcc {
	gen := gw.Generation
	a := &gwAcc{gw: gw, group: defaultGroup}
	if v := gw.Annotations[v1alpha1.AnnotationGroup]; v != "" {
		a.group = groupRef(v, gw.Namespace)
	}
	g := b.groupsOut[a.group]
	accepted := condition(string(gatewayv1.GatewayConditionAccepted), true, string(gatewayv1.GatewayReasonAccepted), "", gen)
	programmed := condition(string(gatewayv1.GatewayConditionProgrammed), true, string(gatewayv1.GatewayReasonProgrammed), "", gen)
	httpPort, httpsPort := uint16(80), uint16(443)
	switch {
	case a.group == "" || g == nil:
		msg := fmt.Sprintf("no Portico group serves it: group %q does not exist", a.group)
		accepted = condition(accepted.Type, false, string(gatewayv1.GatewayReasonNoResources), msg, gen)
		programmed = condition(programmed.Type, false, string(gatewayv1.GatewayReasonNoResources), msg, gen)
		g = nil
	default:
		httpPort, httpsPort = cmp.Or(g.HTTPPort, httpPort), cmp.Or(g.HTTPSPort, httpsPort)
		vips, shared, reason, msg := b.gatewayAddresses(gw, g, pools)
		switch {
		case reason == string(gatewayv1.GatewayReasonUnsupportedAddress):
			accepted = condition(accepted.Type, false, reason, msg, gen)
			programmed = condition(programmed.Type, false, string(gatewayv1.GatewayReasonAddressNotUsable), msg, gen)
		case reason != "":
			programmed = condition(programmed.Type, false, reason, msg, gen)
		case len(vips) == 0:
			programmed = condition(programmed.Type, false, string(gatewayv1.GatewayReasonAddressNotAssigned),
				fmt.Sprintf("group %s has no VIP yet", a.group), gen)
		}
		switch {
		case !shared && len(vips) > 0:
			a.view = key(gw)
		case !shared:
			a.nowhere = true // its routes go to no host until it has addresses
		}
		for _, v := range vips {
			a.status.Addresses = append(a.status.Addresses, gatewayv1.GatewayStatusAddress{Type: ptr(gatewayv1.IPAddressType), Value: v.String()})
		}
		a.vips = vips
	}
	valid := 0
	for i := range gw.Spec.Listeners {
		l := b.listener(gw, &gw.Spec.Listeners[i], httpPort, httpsPort, a.view != "" || a.nowhere)
		l.group, l.view, l.of = a.group, a.view, a
		if a.view != "" {
			l.port = uint16(l.l.Port)
		}
		a.listeners = append(a.listeners, l)
		if l.accepted {
			valid++
		}
	}
	b.conflicts(a)
	if valid < len(a.listeners) && accepted.Status == metav1.ConditionTrue {
		accepted.Reason = string(gatewayv1.GatewayReasonListenersNotValid)
		accepted.Message = fmt.Sprintf("%d of %d listeners are not valid", len(a.listeners)-valid, len(a.listeners))
		if valid == 0 {
			accepted.Status = metav1.ConditionFalse
			programmed = condition(programmed.Type, false, string(gatewayv1.GatewayReasonInvalid), "no valid listener", gen)
		}
	}
	if g == nil {
		for _, l := range a.listeners {
			l.accepted = false
		}
	}
	if a.view != "" {
		b.gatewayView(a) // admitted by age beside the L4 Services (admitViews)
	}
	a.status.Conditions = []metav1.Condition{accepted, programmed}
	return a
}

// listener checks one listener: its protocol and port (the group's nginx
// serves HTTP and HTTPS on its two ports), the route kinds it allows and its
// certificates.
//
// A Gateway with addresses of its own (own) may listen on any port not
// reserved on the edges (Options.ReservedPorts): nginx's HTTP and HTTPS
// listeners serve every one of them (the agents' sk_lookup program steers
// the others to them); one that shares its group's VIPs has the group's
// two ports alone.
func (b *builder) listener(gw *gatewayv1.Gateway, l *gatewayv1.Listener, httpPort, httpsPort uint16, own bool) *gwListener {
	gen := gw.Generation
	out := &gwListener{l: l, accepted: true}
	out.status.Name = l.Name
	accepted := condition(string(gatewayv1.ListenerConditionAccepted), true, string(gatewayv1.ListenerReasonAccepted), "", gen)
	resolved := condition(string(gatewayv1.ListenerConditionResolvedRefs), true, string(gatewayv1.ListenerReasonResolvedRefs), "", gen)
	refuse := func(reason, msg string) {
		if out.accepted {
			accepted = condition(accepted.Type, false, reason, msg, gen)
			out.accepted = false
		}
	}
	switch l.Protocol {
	case gatewayv1.HTTPProtocolType, gatewayv1.HTTPSProtocolType:
		// nginx's own two ports are reserved for L4 Services: they are these
		// listeners'.
		mine := uint16(l.Port) == httpPort || uint16(l.Port) == httpsPort
		if by := b.reserved[model.Port{Protocol: model.TCP, Port: uint16(l.Port)}]; own && by != "" && !mine {
			refuse(string(gatewayv1.ListenerReasonPortUnavailable), fmt.Sprintf("port %d is reserved on the edges (%s)", l.Port, by))
		}
	}
	switch l.Protocol {
	case gatewayv1.HTTPProtocolType:
		if uint16(l.Port) != httpPort && !own {
			refuse(string(gatewayv1.ListenerReasonPortUnavailable), fmt.Sprintf("this group's nginx serves HTTP on port %d", httpPort))
		}
	case gatewayv1.HTTPSProtocolType:
		if uint16(l.Port) != httpsPort && !own {
			refuse(string(gatewayv1.ListenerReasonPortUnavailable), fmt.Sprintf("this group's nginx serves HTTPS on port %d", httpsPort))
		}
	default:
		refuse(string(gatewayv1.ListenerReasonUnsupportedProtocol), fmt.Sprintf("protocol %q is not served (HTTP and HTTPS are)", l.Protocol))
		out.status.SupportedKinds = []gatewayv1.RouteGroupKind{}
	}
	if l.Protocol == gatewayv1.HTTPProtocolType || l.Protocol == gatewayv1.HTTPSProtocolType {
		out.status.SupportedKinds = []gatewayv1.RouteGroupKind{}
		kinds := []gatewayv1.RouteGroupKind{{Kind: kindHTTPRoute}}
		if l.AllowedRoutes != nil && len(l.AllowedRoutes.Kinds) > 0 {
			kinds = l.AllowedRoutes.Kinds
		}
		for _, k := range kinds {
			if (k.Group == nil || *k.Group == gatewayGroup) && k.Kind == kindHTTPRoute {
				out.status.SupportedKinds = append(out.status.SupportedKinds, gatewayv1.RouteGroupKind{Group: ptr(gatewayv1.Group(gatewayGroup)), Kind: kindHTTPRoute})
				continue
			}
			resolved = condition(resolved.Type, false, string(gatewayv1.ListenerReasonInvalidRouteKinds),
				fmt.Sprintf("route kind %s is not served (HTTPRoute is)", k.Kind), gen)
		}
	}
	if l.Protocol == gatewayv1.HTTPSProtocolType {
		switch {
		case l.TLS == nil || len(l.TLS.CertificateRefs) == 0:
			resolved = condition(resolved.Type, false, string(gatewayv1.ListenerReasonInvalidCertificateRef), "an HTTPS listener needs a certificate", gen)
		case l.TLS.Mode != nil && *l.TLS.Mode != gatewayv1.TLSModeTerminate:
			refuse(string(gatewayv1.ListenerReasonUnsupportedValue), "an HTTPS listener terminates TLS (mode Terminate)")
		default:
			for i, ref := range l.TLS.CertificateRefs {
				name, reason, msg := b.listenerCert(gw, ref)
				if name != "" {
					if out.cert == "" {
						out.cert = name
					}
					continue
				}
				if resolved.Status == metav1.ConditionTrue {
					resolved = condition(resolved.Type, false, reason, fmt.Sprintf("tls.certificateRefs[%d]: %s", i, msg), gen)
				}
			}
		}
	}
	programmed := condition(string(gatewayv1.ListenerConditionProgrammed), true, string(gatewayv1.ListenerReasonProgrammed), "", gen)
	if !out.accepted || resolved.Status == metav1.ConditionFalse {
		programmed = condition(programmed.Type, false, string(gatewayv1.ListenerReasonInvalid), "", gen)
	}
	if l.Protocol == gatewayv1.HTTPSProtocolType && out.cert == "" {
		out.accepted = false // nothing to serve it with
	}
	out.status.Conditions = []metav1.Condition{accepted, programmed, resolved,
		condition(string(gatewayv1.ListenerConditionConflicted), false, string(gatewayv1.ListenerReasonNoConflicts), "", gen)}
	return out
}

// conflicts marks listeners that share a port with another protocol, or a
// port, protocol and hostname with another listener; neither is served.
func (b *builder) conflicts(a *gwAcc) {
	for i, x := range a.listeners {
		for j, y := range a.listeners {
			if i == j || x.l.Port != y.l.Port {
				continue
			}
			reason := ""
			switch {
			case x.l.Protocol != y.l.Protocol:
				reason = string(gatewayv1.ListenerReasonProtocolConflict)
			case hostnameOf(x.l.Hostname) == hostnameOf(y.l.Hostname):
				reason = string(gatewayv1.ListenerReasonHostnameConflict)
			default:
				continue
			}
			x.accepted = false
			c := &x.status.Conditions[3]
			c.Status, c.Reason, c.Message = metav1.ConditionTrue, reason, fmt.Sprintf("listener %s uses the same port", y.l.Name)
			p := &x.status.Conditions[1]
			p.Status, p.Reason = metav1.ConditionFalse, string(gatewayv1.ListenerReasonInvalid)
			break
		}
	}
}

func hostnameOf(h *gatewayv1.Hostname) string {
	if h == nil {
		return ""
	}
	return strings.ToLower(string(*h))
}

// listenerCert resolves a listener's certificate reference to a Certificate
// name; else why not (a listener condition's reason).
func (b *builder) listenerCert(gw *gatewayv1.Gateway, ref gatewayv1.SecretObjectReference) (name, reason, msg string) {
	if (ref.Group != nil && *ref.Group != "") || (ref.Kind != nil && *ref.Kind != "Secret") {
		return "", string(gatewayv1.ListenerReasonInvalidCertificateRef), fmt.Sprintf("%s is not a Secret", refKind(ref.Group, ref.Kind))
	}
	ns := gw.Namespace
	if ref.Namespace != nil && *ref.Namespace != "" {
		ns = string(*ref.Namespace)
	}
	k := ns + "/" + string(ref.Name)
	if ns != gw.Namespace && !b.granted(gatewayGroup, kindGateway, gw.Namespace, "", "Secret", ns, string(ref.Name)) {
		return "", string(gatewayv1.ListenerReasonRefNotPermitted), fmt.Sprintf("no ReferenceGrant in %s lets Gateways of %s use Secret %s", ns, gw.Namespace, ref.Name)
	}
	sec := b.secrets[k]
	if sec == nil {
		return "", string(gatewayv1.ListenerReasonInvalidCertificateRef), fmt.Sprintf("Secret %s does not exist", k)
	}
	crt, key := sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey]
	if sec.Type != corev1.SecretTypeTLS || len(crt) == 0 || len(key) == 0 {
		return "", string(gatewayv1.ListenerReasonInvalidCertificateRef), fmt.Sprintf("Secret %s is not a kubernetes.io/tls Secret with %s and %s", k, corev1.TLSCertKey, corev1.TLSPrivateKeyKey)
	}
	if _, err := tls.X509KeyPair(crt, key); err != nil {
		return "", string(gatewayv1.ListenerReasonInvalidCertificateRef), fmt.Sprintf("Secret %s: %v", k, err)
	}
	if _, ok := b.certs[k]; !ok {
		b.certs[k] = model.Certificate{Name: k, CertPEM: slices.Clone(crt), KeyPEM: slices.Clone(key)}
	}
	return k, "", ""
}

func refKind(g *gatewayv1.Group, k *gatewayv1.Kind) string {
	s := ""
	if k != nil {
		s = string(*k)
	}
	if g != nil && *g != "" {
		s += "." + string(*g)
	}
	return s
}

// granted reports whether a ReferenceGrant in toNS lets objects of fromGroup
// and fromKind in fromNS refer to the object toName (any name when the grant
// names none) of toGroup and toKind.
func (b *builder) granted(fromGroup, fromKind, fromNS, toGroup, toKind, toNS, toName string) bool {
	for _, g := range b.st.ReferenceGrants {
		if g.Namespace != toNS {
			continue
		}
		from := slices.ContainsFunc(g.Spec.From, func(f gatewayv1.ReferenceGrantFrom) bool {
			return string(f.Group) == fromGroup && string(f.Kind) == fromKind && string(f.Namespace) == fromNS
		})
		to := slices.ContainsFunc(g.Spec.To, func(t gatewayv1.ReferenceGrantTo) bool {
			return string(t.Group) == toGroup && string(t.Kind) == toKind && (t.Name == nil || *t.Name == "" || string(*t.Name) == toName)
		})
		if from && to {
			return true
		}
	}
	return false
}

// routeLoc is one location an HTTPRoute asks for, before ranking.
type routeLoc struct {
	srv   *serverAcc
	loc   model.Location
	order int // the route's place, oldest first
	rule  int
	match int
}

// routeTable collects the routes' locations, to rank them by Gateway API's
// precedence once every route is read.
type routeTable struct{ locs []routeLoc }

// rank gives each route's location its Rank, per server: the method first,
// then the most headers, the most query parameters, the oldest route, its rule
// and match order. (The path's precedence, Exact and then the longest prefix,
// is the table's own.) Ranks start at 1: an Ingress's location (0) comes first.
func (rt *routeTable) rank(b *builder) {
	slices.SortStableFunc(rt.locs, func(x, y routeLoc) int {
		mx, my := x.loc.Match, y.loc.Match
		return cmp.Or(
			-cmp.Compare(boolInt(mx.Method != ""), boolInt(my.Method != "")),
			-cmp.Compare(len(mx.Headers), len(my.Headers)),
			-cmp.Compare(len(mx.Query), len(my.Query)),
			cmp.Compare(x.order, y.order), cmp.Compare(x.rule, y.rule), cmp.Compare(x.match, y.match))
	})
	next := map[*serverAcc]uint32{}
	for _, rl := range rt.locs {
		next[rl.srv]++
		rl.loc.Rank = next[rl.srv]
		rl.srv.locations = append(rl.srv.locations, rl.loc)
	}
}

func boolInt(v bool) int {
	if v {
		return 1
	}
	return 0
}

// attachment is a listener a route attaches to, and the hosts it serves there.
type attachment struct {
	l     *gwListener
	hosts []string
}

// httpRoute attaches a route to the listeners of Portico's Gateways its
// parentRefs name, and adds its rules to their hosts.
func (b *builder) httpRoute(r *gatewayv1.HTTPRoute, order int, accs map[string]*gwAcc, rt *routeTable) {
	gen := r.Generation
	src := key(r)
	var parents []gatewayv1.RouteParentStatus
	var atts []attachment
	for _, pr := range r.Spec.ParentRefs {
		if (pr.Group != nil && *pr.Group != gatewayGroup) || (pr.Kind != nil && *pr.Kind != kindGateway) {
			continue
		}
		ns := r.Namespace
		if pr.Namespace != nil && *pr.Namespace != "" {
			ns = string(*pr.Namespace)
		}
		a := accs[ns+"/"+string(pr.Name)]
		if a == nil {
			continue // not Portico's
		}
		accepted, more := b.attach(r, pr, a)
		atts = append(atts, more...)
		parents = append(parents, gatewayv1.RouteParentStatus{ParentRef: pr, ControllerName: v1alpha1.GatewayControllerName,
			Conditions: []metav1.Condition{accepted}})
	}
	if len(parents) == 0 {
		return
	}
	rules, resolved, partial := b.routeRules(r)
	if len(rules) == 0 && len(r.Spec.Rules) > 0 {
		atts = nil
	}
	for i := range parents {
		c := &parents[i].Conditions
		if len(rules) == 0 && len(r.Spec.Rules) > 0 && (*c)[0].Status == metav1.ConditionTrue {
			(*c)[0] = condition((*c)[0].Type, false, string(gatewayv1.RouteReasonUnsupportedValue), partial.Message, gen)
		}
		*c = append(*c, resolved)
		if partial.Status == metav1.ConditionTrue && len(rules) > 0 {
			*c = append(*c, partial)
		}
	}
	b.gw.Routes[src] = parents
	for _, at := range atts {
		if g := b.groupsOut[at.l.group]; g != nil {
			served(g, kindHTTPRoute+" "+src, gen)
		}
	}
	// Each host once per group and view, with the certificate of the first
	// HTTPS listener that serves it.
	type hostKey struct {
		group, view string
		port        uint16
		host        string
	}
	done := map[hostKey]bool{}
	for _, at := range atts {
		group := at.l.group
		if at.l.of.nowhere {
			continue
		}
		for _, h := range at.hosts {
			if ok, o := b.mayRoute(h, r.Namespace); !ok {
				b.problem(kindHTTPRoute, r, "spec.hostnames", model.ReasonHostTaken,
					"host %q belongs to namespace %s (%s claimed it first); not served", h, o.namespace, o.by)
				continue
			}
			if shadowed(at.l, h) {
				continue
			}
			s := b.listenerServer(at.l, modelHost(h))
			if at.l.cert != "" && s.srv.TLSCertificate == "" {
				s.srv.TLSCertificate, s.certFrom = at.l.cert, src
			}
			hk := hostKey{group, at.l.view, at.l.port, h}
			if done[hk] {
				continue
			}
			done[hk] = true
			for _, rl := range rules {
				rl.srv = s
				rl.order = order
				rt.locs = append(rt.locs, rl)
			}
		}
	}
}

// listenerServer is the Server of host on listener l's view and port; in a
// view it names l (listener isolation gives each host one listener).
func (b *builder) listenerServer(l *gwListener, host string) *serverAcc {
	s := b.serverIn(l.group, l.view, l.port, host)
	if l.view != "" && s.srv.Listener == "" {
		s.srv.Listener = string(l.l.Name)
	}
	return s
}

// shadowed reports whether another accepted listener of l's Gateway, on its
// port, takes every request for host h (a hostname of a route attached to l)
// because its hostname is more specific than l's: isolation, in a view.
func shadowed(l *gwListener, h string) bool {
	if l.view == "" {
		return false
	}
	mine := specificity(hostnameOf(l.l.Hostname))
	for _, o := range l.of.listeners {
		if o == l || !o.accepted || o.l.Port != l.l.Port {
			continue
		}
		if oh := hostnameOf(o.l.Hostname); oh != "" && specificity(oh) > mine && hostMatches(oh, h) {
			return true
		}
	}
	return false
}

// specificity orders listener hostnames: none, then wildcards by their
// number of labels, then exact names.
func specificity(h string) int {
	switch {
	case h == "":
		return 0
	case strings.HasPrefix(h, "*."):
		return 1 + strings.Count(h, ".")
	}
	return 1 << 10
}

// served has g's edges report generation gen of the object k ("Kind
// namespace/name") once they serve it (model.Group.Ingresses).
func served(g *model.Group, k string, gen int64) {
	if g.Ingresses == nil {
		g.Ingresses = map[string]int64{}
	}
	g.Ingresses[k] = gen
}

// modelHost is a Gateway API hostname as a Server's Host: "*.x" matches any
// number of labels there ("**.x").
func modelHost(h string) string {
	if rest, ok := strings.CutPrefix(h, "*."); ok {
		return "**." + rest
	}
	return h
}

// attach finds the listeners of a a parentRef attaches r to, and the hosts r
// serves on each; the Accepted condition says why none, when none.
func (b *builder) attach(r *gatewayv1.HTTPRoute, pr gatewayv1.ParentReference, a *gwAcc) (metav1.Condition, []attachment) {
	gen := r.Generation
	var out []attachment
	matched, allowed := false, false
	for _, l := range a.listeners {
		if pr.SectionName != nil && *pr.SectionName != l.l.Name {
			continue
		}
		if pr.Port != nil && *pr.Port != l.l.Port {
			continue
		}
		matched = true
		if !b.allows(a.gw, l, r) {
			continue
		}
		hosts := intersect(hostnameOf(l.l.Hostname), r.Spec.Hostnames)
		// Attached: by the parentRef, the listener's allowedRoutes and a
		// hostname in common, whatever the listener's other conditions and the
		// route's rules (the specification's attachedRoutes).
		if len(hosts) > 0 && !slices.Contains(l.routes, key(r)) {
			l.routes = append(l.routes, key(r))
			l.status.AttachedRoutes++
		}
		if !l.accepted {
			continue
		}
		allowed = true
		if len(hosts) > 0 {
			out = append(out, attachment{l: l, hosts: hosts})
		}
	}
	switch {
	case !matched:
		return condition(string(gatewayv1.RouteConditionAccepted), false, string(gatewayv1.RouteReasonNoMatchingParent),
			"no listener of the Gateway matches the parentRef's sectionName and port", gen), nil
	case !allowed:
		return condition(string(gatewayv1.RouteConditionAccepted), false, string(gatewayv1.RouteReasonNotAllowedByListeners),
			"no listener of the Gateway allows this route", gen), nil
	case len(out) == 0:
		return condition(string(gatewayv1.RouteConditionAccepted), false, string(gatewayv1.RouteReasonNoMatchingListenerHostname),
			"no hostname of the route matches a listener's", gen), nil
	}
	return condition(string(gatewayv1.RouteConditionAccepted), true, string(gatewayv1.RouteReasonAccepted), "", gen), out
}

// allows reports whether listener l of gw lets route r attach: its kinds
// include HTTPRoute and its namespaces r's.
func (b *builder) allows(gw *gatewayv1.Gateway, l *gwListener, r *gatewayv1.HTTPRoute) bool {
	if !slices.ContainsFunc(l.status.SupportedKinds, func(k gatewayv1.RouteGroupKind) bool { return k.Kind == kindHTTPRoute }) {
		return false
	}
	from := gatewayv1.NamespacesFromSame
	var sel *metav1.LabelSelector
	if ar := l.l.AllowedRoutes; ar != nil && ar.Namespaces != nil {
		if ar.Namespaces.From != nil {
			from = *ar.Namespaces.From
		}
		sel = ar.Namespaces.Selector
	}
	switch from {
	case gatewayv1.NamespacesFromAll:
		return true
	case gatewayv1.NamespacesFromSame:
		return r.Namespace == gw.Namespace
	case gatewayv1.NamespacesFromSelector:
		s, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil || sel == nil {
			return false
		}
		for _, ns := range b.st.Namespaces {
			if ns.Name == r.Namespace {
				return s.Matches(labels.Set(ns.Labels))
			}
		}
	}
	return false
}

// intersect is the hosts a route serves on a listener: its hostnames that
// the listener's matches (or the listener's when it is the narrower
// wildcard); every host ("") when neither names one.
func intersect(listener string, route []gatewayv1.Hostname) []string {
	if len(route) == 0 {
		return []string{listener}
	}
	var out []string
	add := func(h string) {
		if !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	for _, rh := range route {
		h := strings.ToLower(string(rh))
		switch {
		case listener == "":
			add(h)
		case hostMatches(listener, h):
			add(h)
		case hostMatches(h, listener):
			add(listener)
		}
	}
	return out
}

// hostMatches reports whether pattern (a hostname or "*.suffix", any number
// of labels) covers h (a hostname, or a wildcard all of whose hosts it covers).
func hostMatches(pattern, h string) bool {
	if pattern == h {
		return true
	}
	suffix, ok := strings.CutPrefix(pattern, "*")
	if !ok {
		return false
	}
	rest := strings.TrimPrefix(h, "*")
	return strings.HasSuffix(rest, suffix) && len(rest) > len(suffix)
}

// routeRules translates a route's rules into locations (without their
// server, route order and rank), and says whether its backends resolved and
// whether rules had to be left out (PartiallyInvalid).
func (b *builder) routeRules(r *gatewayv1.HTTPRoute) (locs []routeLoc, resolved, partial metav1.Condition) {
	gen := r.Generation
	src := key(r)
	resolved = condition(string(gatewayv1.RouteConditionResolvedRefs), true, string(gatewayv1.RouteReasonResolvedRefs), "", gen)
	partial = condition(string(gatewayv1.RouteConditionPartiallyInvalid), false, string(gatewayv1.RouteReasonUnsupportedValue), "", gen)
	for ri, rule := range r.Spec.Rules {
		field := fmt.Sprintf("spec.rules[%d]", ri)
		base, err := routeFilters(rule.Filters)
		if err != nil {
			b.problem(kindHTTPRoute, r, field+".filters", model.ReasonInvalidRule, "%v; rule not served", err)
			partial = condition(partial.Type, true, string(gatewayv1.RouteReasonUnsupportedValue), field+": "+err.Error(), gen)
			continue
		}
		for fi, flt := range rule.Filters {
			m := flt.RequestMirror
			if flt.Type != gatewayv1.HTTPRouteFilterRequestMirror || m == nil {
				continue
			}
			bk, reason, msg := b.routeBackend(r, gatewayv1.HTTPBackendRef{BackendRef: gatewayv1.BackendRef{BackendObjectReference: m.BackendRef}})
			if reason != "" {
				b.problem(kindHTTPRoute, r, fmt.Sprintf("%s.filters[%d].requestMirror", field, fi), model.ReasonServiceNotFound, "%s; not mirrored", msg)
				if resolved.Status == metav1.ConditionTrue {
					resolved = condition(resolved.Type, false, reason, msg, gen)
				}
				continue
			}
			mirror := model.Mirror{Upstream: bk.Upstream}
			switch {
			case m.Fraction != nil:
				mirror.Numerator, mirror.Denominator = uint32(max(m.Fraction.Numerator, 0)), uint32(max(ptrOr(m.Fraction.Denominator, 100), 1))
				mirror.Numerator = min(mirror.Numerator, mirror.Denominator)
			case m.Percent != nil:
				mirror.Numerator, mirror.Denominator = uint32(min(max(*m.Percent, 0), 100)), 100
			}
			base.Filters.Mirrors = append(base.Filters.Mirrors, mirror)
		}
		// Where the rule sends requests: its redirect, else its backends.
		var target model.Location
		timeouts, err := routeTimeouts(rule.Timeouts)
		if err != nil {
			b.problem(kindHTTPRoute, r, field+".timeouts", model.ReasonInvalidRule, "%v; nginx's are used", err)
			partial = condition(partial.Type, true, string(gatewayv1.RouteReasonUnsupportedValue), field+".timeouts: "+err.Error(), gen)
		}
		switch {
		case base.Status != 0:
			target = base
		default:
			target.Filters = base.Filters
			var bes []model.Backend
			for bi, be := range rule.BackendRefs {
				bk, reason, msg := b.routeBackend(r, be)
				if reason != "" {
					b.problem(kindHTTPRoute, r, fmt.Sprintf("%s.backendRefs[%d]", field, bi), model.ReasonServiceNotFound, "%s; its share answers 500", msg)
					if resolved.Status == metav1.ConditionTrue {
						resolved = condition(resolved.Type, false, reason, msg, gen)
					}
				}
				for fi, bf := range be.Filters {
					if bf.Type == gatewayv1.HTTPRouteFilterRequestHeaderModifier && bf.RequestHeaderModifier != nil {
						bk.RequestHeaders = headerChanges(*bf.RequestHeaderModifier)
						continue
					}
					msg := fmt.Sprintf("%s.backendRefs[%d].filters[%d]: filter %s on a backend is not served", field, bi, fi, bf.Type)
					b.problem(kindHTTPRoute, r, fmt.Sprintf("%s.backendRefs[%d].filters[%d]", field, bi, fi), model.ReasonInvalidRule, "filter %s on a backend is not served", bf.Type)
					partial = condition(partial.Type, true, string(gatewayv1.RouteReasonUnsupportedValue), msg, gen)
				}
				bes = append(bes, bk)
			}
			switch {
			case len(bes) == 0:
				target.Status = 500 // no backend: Gateway API's answer
			case len(bes) == 1 && bes[0].Weight > 0 && bes[0].RequestHeaders.IsZero():
				target.Upstream, target.Status = bes[0].Upstream, bes[0].Status
			default:
				target.Backends = bes
			}
		}
		matches := rule.Matches
		if len(matches) == 0 {
			matches = []gatewayv1.HTTPRouteMatch{{}}
		}
		for mi, m := range matches {
			loc, err := routeMatch(m)
			if err != nil {
				b.problem(kindHTTPRoute, r, fmt.Sprintf("%s.matches[%d]", field, mi), model.ReasonInvalidRule, "%v; match not served", err)
				partial = condition(partial.Type, true, string(gatewayv1.RouteReasonUnsupportedValue), fmt.Sprintf("%s.matches[%d]: %v", field, mi, err), gen)
				continue
			}
			if (target.Filters.Redirect != nil && target.Filters.Redirect.Path.Type == model.PathChangePrefix ||
				target.Filters.Rewrite != nil && target.Filters.Rewrite.Path.Type == model.PathChangePrefix) && loc.Type != model.PathPrefix {
				b.problem(kindHTTPRoute, r, fmt.Sprintf("%s.matches[%d]", field, mi), model.ReasonInvalidRule, "ReplacePrefixMatch needs a PathPrefix match; match not served")
				partial = condition(partial.Type, true, string(gatewayv1.RouteReasonUnsupportedValue), fmt.Sprintf("%s.matches[%d]: ReplacePrefixMatch needs a PathPrefix match", field, mi), gen)
				continue
			}
			loc.Upstream, loc.Backends, loc.Status, loc.Filters = target.Upstream, target.Backends, target.Status, target.Filters
			loc.Timeouts = timeouts
			loc.Source = src
			locs = append(locs, routeLoc{loc: loc, rule: ri, match: mi})
		}
	}
	return locs, resolved, partial
}

// routeTimeouts translates a rule's timeouts ("0s": none).
func routeTimeouts(t *gatewayv1.HTTPRouteTimeouts) (model.Timeouts, error) {
	var out model.Timeouts
	if t == nil {
		return out, nil
	}
	for _, d := range []struct {
		name string
		v    *gatewayv1.Duration
		to   *uint32
	}{{"request", t.Request, &out.Request}, {"backendRequest", t.BackendRequest, &out.Backend}} {
		if d.v == nil {
			continue
		}
		v, err := time.ParseDuration(string(*d.v))
		switch {
		case err != nil || v < 0:
			return model.Timeouts{}, fmt.Errorf("%s %q is not a duration", d.name, *d.v)
		case v == 0 || v >= model.NoTimeout*time.Millisecond:
			*d.to = model.NoTimeout
		default:
			*d.to = uint32(max(v/time.Millisecond, 1))
		}
	}
	return out, nil
}

// routeMatch translates a match's path, method, headers and query.
func routeMatch(m gatewayv1.HTTPRouteMatch) (model.Location, error) {
	loc := model.Location{Path: "/", Type: model.PathPrefix}
	if p := m.Path; p != nil {
		if p.Value != nil {
			loc.Path = *p.Value
		}
		switch t := ptrOr(p.Type, gatewayv1.PathMatchPathPrefix); t {
		case gatewayv1.PathMatchExact:
			loc.Type = model.PathExact
		case gatewayv1.PathMatchPathPrefix:
		default:
			return loc, fmt.Errorf("path match type %s is not served", t)
		}
	}
	if m.Method != nil {
		loc.Match.Method = string(*m.Method)
	}
	seen := map[string]bool{}
	for _, h := range m.Headers {
		if t := ptrOr(h.Type, gatewayv1.HeaderMatchExact); t != gatewayv1.HeaderMatchExact {
			return loc, fmt.Errorf("header match type %s is not served", t)
		}
		n := strings.ToLower(string(h.Name))
		if seen[n] {
			continue // the first of equivalent names counts
		}
		seen[n] = true
		loc.Match.Headers = append(loc.Match.Headers, model.NameValue{Name: n, Value: h.Value})
	}
	seen = map[string]bool{}
	for _, q := range m.QueryParams {
		if t := ptrOr(q.Type, gatewayv1.QueryParamMatchExact); t != gatewayv1.QueryParamMatchExact {
			return loc, fmt.Errorf("query match type %s is not served", t)
		}
		if seen[string(q.Name)] {
			continue
		}
		seen[string(q.Name)] = true
		loc.Match.Query = append(loc.Match.Query, model.NameValue{Name: string(q.Name), Value: q.Value})
	}
	return loc, nil
}

// routeFilters translates a rule's filters: header modifiers, a redirect
// (which sets the location's Status) and a rewrite.
func routeFilters(fs []gatewayv1.HTTPRouteFilter) (model.Location, error) {
	var loc model.Location
	f := &loc.Filters
	for i, flt := range fs {
		switch flt.Type {
		case gatewayv1.HTTPRouteFilterRequestHeaderModifier:
			if flt.RequestHeaderModifier != nil {
				f.RequestHeaders = headerChanges(*flt.RequestHeaderModifier)
			}
		case gatewayv1.HTTPRouteFilterResponseHeaderModifier:
			if flt.ResponseHeaderModifier != nil {
				f.ResponseHeaders = headerChanges(*flt.ResponseHeaderModifier)
			}
		case gatewayv1.HTTPRouteFilterRequestRedirect:
			rr := flt.RequestRedirect
			if rr == nil {
				continue
			}
			rd := &model.Redirect{Scheme: ptrOr(rr.Scheme, ""), Host: strings.ToLower(string(ptrOr(rr.Hostname, ""))),
				Port: uint16(ptrOr(rr.Port, 0))}
			pc, err := pathChange(rr.Path)
			if err != nil {
				return loc, fmt.Errorf("filters[%d]: %w", i, err)
			}
			rd.Path = pc
			f.Redirect = rd
			loc.Status = ptrOr(rr.StatusCode, 302)
		case gatewayv1.HTTPRouteFilterURLRewrite:
			rw := flt.URLRewrite
			if rw == nil {
				continue
			}
			w := &model.Rewrite{Host: strings.ToLower(string(ptrOr(rw.Hostname, "")))}
			pc, err := pathChange(rw.Path)
			if err != nil {
				return loc, fmt.Errorf("filters[%d]: %w", i, err)
			}
			w.Path = pc
			f.Rewrite = w
		case gatewayv1.HTTPRouteFilterRequestMirror:
			// routeRules resolves its backend.
		case gatewayv1.HTTPRouteFilterCORS:
			c := flt.CORS
			if c == nil {
				continue
			}
			cors := &model.CORS{AllowCredentials: ptrOr(c.AllowCredentials, false), MaxAge: uint32(max(c.MaxAge, 0))}
			for _, o := range c.AllowOrigins {
				cors.AllowOrigins = append(cors.AllowOrigins, string(o))
			}
			for _, m := range c.AllowMethods {
				cors.AllowMethods = append(cors.AllowMethods, string(m))
			}
			for _, h := range c.AllowHeaders {
				cors.AllowHeaders = append(cors.AllowHeaders, string(h))
			}
			for _, h := range c.ExposeHeaders {
				cors.ExposeHeaders = append(cors.ExposeHeaders, string(h))
			}
			f.CORS = cors
		default:
			return loc, fmt.Errorf("filters[%d]: filter %s is not served", i, flt.Type)
		}
	}
	return loc, nil
}

func pathChange(p *gatewayv1.HTTPPathModifier) (model.PathChange, error) {
	if p == nil {
		return model.PathChange{}, nil
	}
	switch p.Type {
	case gatewayv1.FullPathHTTPPathModifier:
		return model.PathChange{Type: model.PathChangeFull, Value: ptrOr(p.ReplaceFullPath, "/")}, nil
	case gatewayv1.PrefixMatchHTTPPathModifier:
		return model.PathChange{Type: model.PathChangePrefix, Value: cmp.Or(ptrOr(p.ReplacePrefixMatch, "/"), "/")}, nil
	}
	return model.PathChange{}, fmt.Errorf("path modifier %s is not served", p.Type)
}

func headerChanges(h gatewayv1.HTTPHeaderFilter) model.HeaderChanges {
	var c model.HeaderChanges
	for _, s := range h.Set {
		c.Set = append(c.Set, model.NameValue{Name: string(s.Name), Value: s.Value})
	}
	for _, a := range h.Add {
		c.Add = append(c.Add, model.NameValue{Name: string(a.Name), Value: a.Value})
	}
	c.Remove = slices.Clone(h.Remove)
	return c
}

// routeBackend resolves a backendRef to an upstream; when it does not
// resolve, to a share answered 500, with the ResolvedRefs reason and why.
func (b *builder) routeBackend(r *gatewayv1.HTTPRoute, be gatewayv1.HTTPBackendRef) (bk model.Backend, reason, msg string) {
	bk.Weight = uint32(ptrOr(be.Weight, 1))
	fail := func(reason gatewayv1.RouteConditionReason, format string, args ...any) (model.Backend, string, string) {
		return model.Backend{Status: 500, Weight: bk.Weight}, string(reason), fmt.Sprintf(format, args...)
	}
	ref := be.BackendObjectReference
	if (ref.Group != nil && *ref.Group != "") || (ref.Kind != nil && *ref.Kind != "Service") {
		return fail(gatewayv1.RouteReasonInvalidKind, "backend %s %s is not a Service", refKind(ref.Group, ref.Kind), ref.Name)
	}
	ns := r.Namespace
	if ref.Namespace != nil && *ref.Namespace != "" {
		ns = string(*ref.Namespace)
	}
	if ns != r.Namespace && !b.granted(gatewayGroup, kindHTTPRoute, r.Namespace, "", "Service", ns, string(ref.Name)) {
		return fail(gatewayv1.RouteReasonRefNotPermitted, "no ReferenceGrant in %s lets HTTPRoutes of %s use Service %s", ns, r.Namespace, ref.Name)
	}
	svcKey := ns + "/" + string(ref.Name)
	svc := b.services[svcKey]
	if svc == nil {
		return fail(gatewayv1.RouteReasonBackendNotFound, "Service %s does not exist", svcKey)
	}
	if ref.Port == nil {
		return fail(gatewayv1.RouteReasonBackendNotFound, "backend Service %s names no port", svcKey)
	}
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		if p := &svc.Spec.Ports[i]; p.Port == int32(*ref.Port) && (p.Protocol == "" || p.Protocol == corev1.ProtocolTCP) {
			sp = p
		}
	}
	if sp == nil || svc.Spec.Type == corev1.ServiceTypeExternalName {
		return fail(gatewayv1.RouteReasonBackendNotFound, "Service %s has no TCP port %d", svcKey, *ref.Port)
	}
	port := strconv.Itoa(int(sp.Port))
	id := "svc|" + svcKey + "|" + port
	if b.upstreams[id] == nil {
		b.upstreamOf(ns+"-"+string(ref.Name)+"-"+port, id, b.serviceEndpoints(svcKey, sp), true)
	}
	bk.Upstream = id
	return bk, "", ""
}

func ptr[T any](v T) *T { return &v }

func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}
