package controlplane

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
)

func (b *builder) ingresses(ings []*networkingv1.Ingress) {
	for _, ing := range ings {
		src := key(ing)
		group := b.bindings[src].Group
		g := b.groupsOut[group]
		if g != nil {
			if g.Ingresses == nil {
				g.Ingresses = map[string]int64{}
			}
			g.Ingresses[src] = ing.Generation
		}
		var ups []string // the upstreams this Ingress names
		redirect := false
		if v, ok := ing.Annotations[v1alpha1.AnnotationSSLRedirect]; ok {
			r, err := strconv.ParseBool(v)
			if err != nil {
				b.problem("Ingress", ing, "metadata.annotations["+v1alpha1.AnnotationSSLRedirect+"]", model.ReasonInvalidAnnotation,
					"%q is not true or false", v)
			}
			redirect = r
		}
		aff := b.affinity(ing)
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
		// The default backend answers whatever matches no rule of the Ingress: other
		// hosts (the group's catch-all server) and, on the Ingress's own hosts, paths
		// no rule matches, as ingress-nginx does. A host keeps the default backend
		// of the oldest Ingress that has one; another Ingress with another default
		// backend is reported once, for the group's catch-all server below.
		defUp := ""
		if db := ing.Spec.DefaultBackend; db != nil {
			defUp, _ = b.backend(ing, func() string { return "spec.defaultBackend" }, *db)
			if defUp != "" {
				ups = append(ups, defUp)
			}
		}
		// touch applies the Ingress's host-wide settings to a server it contributes to.
		touched := map[string]bool{}
		touch := func(s *serverAcc) {
			host := s.srv.Host
			if !touched[host] {
				touched[host] = true
				s.srv.SSLRedirect = s.srv.SSLRedirect || redirect
				if defUp != "" && host != "" && s.srv.DefaultUpstream == "" {
					s.srv.DefaultUpstream, s.defFrom = defUp, src
				}
				if c, ok := tlsFor[host]; ok {
					switch {
					case s.srv.TLSCertificate == "":
						s.srv.TLSCertificate, s.certFrom = c, src
					case s.srv.TLSCertificate != c:
						b.problem("Ingress", ing, "spec.tls", model.ReasonTLSConflict,
							"host %q already uses certificate %s from Ingress %s", host, s.srv.TLSCertificate, s.certFrom)
					}
				}
			}
		}
		if defUp != "" {
			s := b.server(group, "")
			if s.srv.DefaultUpstream == "" {
				s.srv.DefaultUpstream, s.defFrom = defUp, src
				touch(s)
			} else {
				b.problem("Ingress", ing, "spec.defaultBackend", model.ReasonDefaultBackendConflict,
					"group %s already has the default backend of Ingress %s", group, s.defFrom)
			}
		}
		for ri, rule := range ing.Spec.Rules {
			host := strings.ToLower(rule.Host)
			if ok, o := b.mayRoute(host, ing.Namespace); !ok {
				b.problem("Ingress", ing, fmt.Sprintf("spec.rules[%d].host", ri), model.ReasonHostTaken,
					"host %q belongs to namespace %s (%s claimed it first, and does not delegate it in %s); not served",
					host, o.namespace, o.by, v1alpha1.AnnotationHostDelegates)
				continue
			}
			if rule.HTTP == nil {
				// A host without paths: all of it goes to the default backend.
				if _, ok := tlsFor[host]; ok || defUp != "" {
					touch(b.server(group, host))
				}
				continue
			}
			for pi, p := range rule.HTTP.Paths {
				// The path's field, for a problem: only one reported builds it.
				field := func() string { return fmt.Sprintf("spec.rules[%d].http.paths[%d]", ri, pi) }
				typ := model.PathImplementationSpecific
				if p.PathType != nil {
					typ = model.PathType(*p.PathType)
				}
				path := p.Path
				if path == "" && typ == model.PathImplementationSpecific {
					path = "/"
				}
				if !strings.HasPrefix(path, "/") || (typ != model.PathExact && typ != model.PathPrefix && typ != model.PathImplementationSpecific) {
					b.problem("Ingress", ing, field()+".path", model.ReasonInvalidPath, "path %q of type %s is not served", p.Path, typ)
					continue
				}
				up, ok := b.backend(ing, func() string { return field() + ".backend" }, p.Backend)
				if ok {
					ups = append(ups, up)
				}
				if !ok {
					continue
				}
				s := b.server(group, host)
				lk := locKey{path, typ}
				if owner, taken := s.locs[lk]; taken {
					b.problem("Ingress", ing, field(), model.ReasonPathConflict,
						"%s path %q of host %q is already routed by %s", typ, path, host, owner)
					continue
				}
				touch(s)
				s.locs[lk] = src
				s.locations = append(s.locations, model.Location{Path: path, Type: typ, Upstream: up, Source: src, Affinity: aff})
			}
		}
		if g != nil && ing.Labels[v1alpha1.LabelFederatedIngress] != "" {
			b.federated(g, ing, src, ups)
		}
	}
}

// affinity reads an Ingress's cookie affinity annotations. A bad value is
// reported: an unknown affinity or a bad cookie name leaves the Ingress without
// affinity, a bad max-age leaves a session cookie.
func (b *builder) affinity(ing *networkingv1.Ingress) model.CookieAffinity {
	field := func(a string) string { return "metadata.annotations[" + a + "]" }
	v, ok := ing.Annotations[v1alpha1.AnnotationAffinity]
	if !ok {
		return model.CookieAffinity{}
	}
	if strings.TrimSpace(v) != "cookie" {
		b.problem("Ingress", ing, field(v1alpha1.AnnotationAffinity), model.ReasonInvalidAnnotation, "%q is not cookie; no affinity", v)
		return model.CookieAffinity{}
	}
	a := model.CookieAffinity{Cookie: v1alpha1.DefaultSessionCookie}
	if n, ok := ing.Annotations[v1alpha1.AnnotationSessionCookieName]; ok {
		if !model.CookieNameRE.MatchString(n) {
			b.problem("Ingress", ing, field(v1alpha1.AnnotationSessionCookieName), model.ReasonInvalidAnnotation,
				"%q is not a cookie name of 1 to 64 letters, digits, _ and -; no affinity", n)
			return model.CookieAffinity{}
		}
		a.Cookie = n
	}
	if s, ok := ing.Annotations[v1alpha1.AnnotationSessionCookieMaxAge]; ok {
		n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 32)
		if err != nil || n == 0 || n > model.MaxCookieAge {
			b.problem("Ingress", ing, field(v1alpha1.AnnotationSessionCookieMaxAge), model.ReasonInvalidAnnotation,
				"%q is not a number of seconds from 1 to %d; a session cookie is used", s, model.MaxCookieAge)
		} else {
			a.MaxAge = uint32(n)
		}
	}
	return a
}

// certificate returns the Certificate name of an Ingress TLS entry's Secret.
func (b *builder) certificate(ing *networkingv1.Ingress, i int, name string) (string, bool) {
	field := fmt.Sprintf("spec.tls[%d].secretName", i)
	if name == "" {
		b.problem("Ingress", ing, field, model.ReasonSecretNotFound, "no secret named")
		return "", false
	}
	k := ing.Namespace + "/" + name
	sec := b.secrets[k]
	if sec == nil {
		b.problem("Ingress", ing, field, model.ReasonSecretNotFound, "TLS secret %s does not exist; hosts served without TLS", k)
		return "", false
	}
	crt, key := sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey]
	if sec.Type != corev1.SecretTypeTLS || len(crt) == 0 || len(key) == 0 {
		b.problem("Ingress", ing, field, model.ReasonInvalidSecret, "secret %s is not a kubernetes.io/tls secret with %s and %s", k, corev1.TLSCertKey, corev1.TLSPrivateKeyKey)
		return "", false
	}
	if _, ok := b.certs[k]; !ok {
		b.certs[k] = model.Certificate{Name: k, CertPEM: slices.Clone(crt), KeyPEM: slices.Clone(key)}
	}
	return k, true
}

// backend resolves an Ingress backend to an upstream name. A missing Service still
// gets an (empty, so 503) upstream, so the path does not fall through to another route.
// federated records whether a federated Ingress of group g can be served here: a
// ready endpoint behind any upstream it names, or with portico.io/federation-health
// "All" behind every one.
func (b *builder) federated(g *model.Group, ing *networkingv1.Ingress, src string, ups []string) {
	if g.Federated == nil {
		g.Federated = map[string]bool{}
	}
	all := false
	switch v := ing.Annotations[v1alpha1.AnnotationFederationHealth]; v {
	case "", "Any":
	case "All":
		all = true
	default:
		b.problem("Ingress", ing, "metadata.annotations["+v1alpha1.AnnotationFederationHealth+"]", model.ReasonInvalidAnnotation,
			"%q is not Any or All; Any is used", v)
	}
	ready := all && len(ups) > 0
	for _, id := range ups {
		has := len(b.upstreams[id].endpoints) > 0
		if all {
			ready = ready && has
		} else {
			ready = ready || has
		}
	}
	g.Federated[src] = ready
}

func (b *builder) backend(ing *networkingv1.Ingress, field func() string, be networkingv1.IngressBackend) (string, bool) {
	if be.Service == nil {
		b.problem("Ingress", ing, field(), model.ReasonUnsupportedBackend, "only Service backends are served")
		return "", false
	}
	svcKey := ing.Namespace + "/" + be.Service.Name
	svc := b.services[svcKey]
	portLabel := be.Service.Port.Name
	if be.Service.Port.Name == "" {
		portLabel = strconv.Itoa(int(be.Service.Port.Number))
	}
	if svc == nil {
		b.problem("Ingress", ing, field()+".service.name", model.ReasonServiceNotFound, "Service %s does not exist; answering 503", svcKey)
		return b.upstream(ing.Namespace+"-"+be.Service.Name+"-"+portLabel, "svc|"+svcKey+"|"+portLabel, nil), true
	}
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		b.problem("Ingress", ing, field()+".service.name", model.ReasonUnsupportedBackend, "ExternalName Service %s is not served", svcKey)
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
		b.problem("Ingress", ing, field()+".service.port", model.ReasonPortNotFound, "Service %s has no port %s; answering 503", svcKey, portLabel)
		return b.upstream(ing.Namespace+"-"+be.Service.Name+"-"+portLabel, "svc|"+svcKey+"|"+portLabel, nil), true
	}
	port := strconv.Itoa(int(sp.Port))
	id := "svc|" + svcKey + "|" + port
	if b.upstreams[id] != nil {
		return id, true // another path of the same Service port: endpoints known
	}
	return b.upstreamOf(ing.Namespace+"-"+be.Service.Name+"-"+port, id, b.serviceEndpoints(svcKey, sp), true), true
}

// serviceEndpoints lists the ready endpoints of one Service port from its
// EndpointSlices (slice ports carry the Service port's name), sorted and
// without repeats. The result may be the Memo's: it is never modified.
func (b *builder) serviceEndpoints(svcKey string, sp *corev1.ServicePort) []netip.AddrPort {
	proto := sp.Protocol
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	if b.memo == nil {
		return b.parseEndpoints(svcKey, sp.Name, proto)
	}
	k := endpointsKey{svcKey, sp.Name, proto}
	if m, ok := b.memo.used[k]; ok {
		return m.eps
	}
	m, ok := b.memo.endpoints[k]
	if !ok || !slices.Equal(m.slices, b.slices[svcKey]) {
		m = endpointsMemo{slices: b.slices[svcKey], eps: b.parseEndpoints(svcKey, sp.Name, proto)}
	}
	b.memo.used[k] = m
	return m.eps
}

// parseEndpoints is serviceEndpoints without the Memo.
func (b *builder) parseEndpoints(svcKey, portName string, proto corev1.Protocol) []netip.AddrPort {
	var out []netip.AddrPort
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
			if name == portName && pp == proto && p.Port != nil {
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
	slices.SortFunc(out, func(x, y netip.AddrPort) int { return x.Compare(y) })
	return slices.Clip(slices.Compact(out))
}
