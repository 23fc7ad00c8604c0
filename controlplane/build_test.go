package controlplane

import (
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
)

func TestBuild(t *testing.T) {
	gs, gsl := g1Objects()
	ws, wsl := webObjects()
	bind := []string{v1alpha1.AnnotationGroup, "edge/g1"}
	pfx, exact, impl := networkingv1.PathTypePrefix, networkingv1.PathTypeExact, networkingv1.PathTypeImplementationSpecific

	tests := []struct {
		name     string
		st       State
		opts     Options
		want     model.Snapshot
		problems []model.Problem
	}{
		{
			name: "empty",
			st:   State{},
		},
		{
			name: "group: VIP, VRID, ports, ready and draining replicas",
			st:   state(gs, gsl),
			want: model.Snapshot{Groups: []model.Group{g1Group}},
		},
		{
			name: "group: a ready replica on a cordoned or excluded node is draining",
			st: func() State {
				s, sl := g1Objects()
				sl[0].Endpoints[2].Conditions.Ready = ptr(true) // n3
				cordoned := &corev1.Node{ObjectMeta: meta("", "n2", 0), Spec: corev1.NodeSpec{Unschedulable: true}}
				excluded := &corev1.Node{ObjectMeta: meta("", "n3", 0)}
				excluded.Labels = map[string]string{corev1.LabelNodeExcludeBalancers: ""}
				return state(s, sl, cordoned, excluded, &corev1.Node{ObjectMeta: meta("", "n1", 0), Spec: corev1.NodeSpec{Unschedulable: true}})
			}(),
			want: model.Snapshot{Groups: []model.Group{func() model.Group {
				g := g1Group
				g.Replicas = []model.Replica{
					{Node: "n1", Addr: netip.MustParseAddr("10.1.0.1"), Weight: 1, State: model.Draining},
					{Node: "n2", Addr: netip.MustParseAddr("10.1.0.2"), Weight: 1, State: model.Draining},
					{Node: "n3", Addr: netip.MustParseAddr("10.1.0.3"), Weight: 1, State: model.Draining},
				}
				return g
			}()}},
		},
		{
			name: "group: LoadBalancer class, ingress-vip alias annotation, dual stack, node from Node addresses",
			st: state(func() *corev1.Service {
				s := groupSvc("edge", "lb", 0, v1alpha1.AnnotationVIPAlias, "2001:db8::10, 192.0.2.20")
				s.Spec.Type = corev1.ServiceTypeLoadBalancer
				s.Spec.LoadBalancerClass = ptr(v1alpha1.LoadBalancerClass)
				s.Spec.Ports = []corev1.ServicePort{{Port: 53, Protocol: corev1.ProtocolUDP}, {Port: 443}}
				return s
			}(), slice("edge", "lb", "lb-v6", "", 0, ep{addr: "2001:db8:1::2", ready: true}),
				&corev1.Node{ObjectMeta: meta("", "n6", 0), Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "2001:db8:1::2"}}}},
				groupSvc("edge", "not-a-group", 0)),
			want: model.Snapshot{Groups: []model.Group{
				{Name: "edge/lb", VIPs: addrs("192.0.2.20", "2001:db8::10"),
					Ports:    []model.Port{{Protocol: model.TCP, Port: 443}, {Protocol: model.UDP, Port: 53}},
					Replicas: []model.Replica{{Node: "n6", Addr: netip.MustParseAddr("2001:db8:1::2"), Weight: 1, State: model.Ready}}},
				{Name: "edge/not-a-group", Ports: []model.Port{{Protocol: model.TCP, Port: 80}, {Protocol: model.TCP, Port: 443}}, HTTPPort: 80, HTTPSPort: 443},
			}},
		},
		{
			name: "L4 Services: VIPs, ports to upstreams, group by annotation or default, affinity, PROXY protocol; bad ones reported",
			st: func() State {
				l4 := func(name string, age int, kv ...string) *corev1.Service {
					s := backendSvc("shop", name,
						corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
						corev1.ServicePort{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP},
						corev1.ServicePort{Name: "sctp", Port: 9, Protocol: corev1.ProtocolSCTP})
					s.ObjectMeta = meta("shop", name, age, kv...)
					s.Spec.Type = corev1.ServiceTypeLoadBalancer
					s.Spec.LoadBalancerClass = ptr(v1alpha1.LoadBalancerClass)
					return s
				}
				dns := l4("dns", 1, v1alpha1.AnnotationVIP, "192.0.2.53", v1alpha1.AnnotationProxyProtocol, "true", v1alpha1.AnnotationUDPIdleTimeout, "10s")
				dns.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
				udp := slice("shop", "dns", "dns-u", "dns", 5353, ep{addr: "10.2.0.1", ready: true}, ep{addr: "10.2.0.2", ready: false})
				udp.Ports[0].Protocol = ptr(corev1.ProtocolUDP)
				other := backendSvc("shop", "other-class", sport("x", 1))
				other.Spec.Type = corev1.ServiceTypeLoadBalancer
				other.Spec.LoadBalancerClass = ptr("example.com/lb")
				return state(gs, gsl, dns, udp, slice("shop", "dns", "dns-t", "dns-tcp", 5353, ep{addr: "10.2.0.1", ready: true}),
					l4("defaulted", 2, v1alpha1.AnnotationVIP, "192.0.2.54"),
					l4("taken", 3, v1alpha1.AnnotationVIP, "192.0.2.10", v1alpha1.AnnotationGroup, "edge/g1", v1alpha1.AnnotationProxyProtocol, "maybe", v1alpha1.AnnotationUDPIdleTimeout, "500ms"),
					l4("nogroup", 4, v1alpha1.AnnotationGroup, "missing"),
					other)
			}(),
			opts: Options{PodRouteGroup: "edge/g1"},
			want: model.Snapshot{
				Groups: []model.Group{g1Group},
				Services: []model.Service{
					{Name: "shop/defaulted", Group: "edge/g1", VIPs: addrs("192.0.2.54"), Ports: []model.ServicePort{
						{Protocol: model.TCP, Port: 53, Upstream: "shop-defaulted-53-tcp"}, {Protocol: model.UDP, Port: 53, Upstream: "shop-defaulted-53-udp"}}},
					{Name: "shop/dns", Group: "edge/g1", VIPs: addrs("192.0.2.53"), ProxyProtocol: true, ClientIPAffinity: true, UDPIdleTimeout: 10, Ports: []model.ServicePort{
						{Protocol: model.TCP, Port: 53, Upstream: "shop-dns-53-tcp"}, {Protocol: model.UDP, Port: 53, Upstream: "shop-dns-53-udp"}}},
					{Name: "shop/taken", Group: "edge/g1", Ports: []model.ServicePort{
						{Protocol: model.TCP, Port: 53, Upstream: "shop-taken-53-tcp"}, {Protocol: model.UDP, Port: 53, Upstream: "shop-taken-53-udp"}}},
				},
				Upstreams: []model.Upstream{
					{Name: "shop-defaulted-53-tcp"}, {Name: "shop-defaulted-53-udp"},
					{Name: "shop-dns-53-tcp", Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.2.0.1:5353")}},
					{Name: "shop-dns-53-udp", Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.2.0.1:5353")}},
					{Name: "shop-taken-53-tcp"}, {Name: "shop-taken-53-udp"},
				},
			},
			problems: []model.Problem{
				{Object: "Service shop/dns", Field: "spec.ports[2].protocol", Reason: model.ReasonUnsupportedProtocol},
				{Object: "Service shop/defaulted", Field: "spec.ports[2].protocol", Reason: model.ReasonUnsupportedProtocol},
				{Object: "Service shop/taken", Field: "metadata.annotations[portico.io/vip]", Reason: model.ReasonVIPConflict},
				{Object: "Service shop/taken", Field: "metadata.annotations[portico.io/proxy-protocol]", Reason: model.ReasonInvalidAnnotation},
				{Object: "Service shop/taken", Field: "metadata.annotations[portico.io/udp-idle-timeout]", Reason: model.ReasonInvalidAnnotation},
				{Object: "Service shop/taken", Field: "spec.ports[2].protocol", Reason: model.ReasonUnsupportedProtocol},
				{Object: "Service shop/nogroup", Field: "metadata.annotations[portico.io/group]", Reason: model.ReasonGroupNotFound},
			},
		},
		{
			name: "group: public ports from the Service's ports named http and https (TCP only)",
			st: state(func() *corev1.Service {
				s := groupSvc("edge", "custom", 0)
				s.Spec.Ports = []corev1.ServicePort{
					{Name: "http", Port: 8080, Protocol: corev1.ProtocolTCP},
					{Name: "https", Port: 8443, Protocol: corev1.ProtocolUDP},
					{Name: "h3", Port: 8443, Protocol: corev1.ProtocolTCP},
				}
				return s
			}()),
			want: model.Snapshot{Groups: []model.Group{
				{Name: "edge/custom", HTTPPort: 8080,
					Ports: []model.Port{{Protocol: model.TCP, Port: 8080}, {Protocol: model.TCP, Port: 8443}, {Protocol: model.UDP, Port: 8443}}},
			}},
		},
		{
			name: "group: conflicting VIP and VRID go to the older group; several VIPs of a family; bad annotations reported",
			st: state(
				groupSvc("edge", "old", 1, v1alpha1.AnnotationVIP, "192.0.2.10", v1alpha1.AnnotationVRID, "5"),
				groupSvc("edge", "new", 2, v1alpha1.AnnotationVIP, "192.0.2.10,2001:db8::1", v1alpha1.AnnotationVRID, "5"),
				groupSvc("edge", "bad", 3, v1alpha1.AnnotationVIP, "192.0.2.300", v1alpha1.AnnotationVRID, "0"),
				groupSvc("edge", "twice", 4, v1alpha1.AnnotationVIP, "192.0.2.1,192.0.2.1"),
				groupSvc("edge", "alias", 5, v1alpha1.AnnotationVIP, "192.0.2.30", v1alpha1.AnnotationVIPAlias, "192.0.2.31"),
				groupSvc("edge", "several", 6, v1alpha1.AnnotationVIP, "192.0.2.41, 2001:db8::41, 192.0.2.40"),
			),
			want: model.Snapshot{Groups: []model.Group{
				{Name: "edge/alias", VIPs: addrs("192.0.2.30"), Ports: g1Group.Ports, HTTPPort: 80, HTTPSPort: 443},
				{Name: "edge/bad", Ports: g1Group.Ports, HTTPPort: 80, HTTPSPort: 443},
				{Name: "edge/new", VIPs: addrs("2001:db8::1"), Ports: g1Group.Ports, HTTPPort: 80, HTTPSPort: 443},
				{Name: "edge/old", VIPs: addrs("192.0.2.10"), VRID: 5, Ports: g1Group.Ports, HTTPPort: 80, HTTPSPort: 443},
				{Name: "edge/several", VIPs: addrs("192.0.2.40", "192.0.2.41", "2001:db8::41"), Ports: g1Group.Ports, HTTPPort: 80, HTTPSPort: 443},
				{Name: "edge/twice", Ports: g1Group.Ports, HTTPPort: 80, HTTPSPort: 443},
			}},
			problems: []model.Problem{
				{Object: "Service edge/new", Field: "metadata.annotations[portico.io/vip]", Reason: model.ReasonVIPConflict},
				{Object: "Service edge/new", Field: "metadata.annotations[portico.io/vrid]", Reason: model.ReasonVRIDConflict},
				{Object: "Service edge/bad", Field: "metadata.annotations[portico.io/vip]", Reason: model.ReasonInvalidVIP},
				{Object: "Service edge/bad", Field: "metadata.annotations[portico.io/vrid]", Reason: model.ReasonInvalidAnnotation},
				{Object: "Service edge/twice", Field: "metadata.annotations[portico.io/vip]", Reason: model.ReasonInvalidVIP},
				{Object: "Service edge/alias", Field: "metadata.annotations[ingress.alpha.k8s.io/ingress-vip]", Reason: model.ReasonInvalidVIP},
			},
		},
		{
			// The Ingress specification: what matches none of an Ingress's rules goes
			// to its default backend, paths of its own hosts included (ingress-nginx
			// does the same); another Ingress's hosts keep theirs.
			name: "default backend answers the Ingress's unmatched paths and hosts",
			st: state(gs, gsl, ws, wsl,
				func() *networkingv1.Ingress {
					i := ingress("app", "with-default", 1, "a.example", []path{{"/app", pfx, "web", 80}}, bind...)
					i.Spec.Rules = append(i.Spec.Rules, networkingv1.IngressRule{Host: "no-paths.example"})
					i.Spec.DefaultBackend = ptr(backend("web", "admin"))
					return i
				}(),
				ingress("app", "without", 2, "b.example", []path{{"/", pfx, "web", 80}}, bind...)),
			want: model.Snapshot{
				Groups: []model.Group{g1Group},
				Servers: []model.Server{
					{Group: "edge/g1", Host: "", DefaultUpstream: "app-web-9000"},
					{Group: "edge/g1", Host: "a.example", Locations: []model.Location{loc("/app", model.PathPrefix, "app-web-80", "app/with-default")},
						DefaultUpstream: "app-web-9000"},
					{Group: "edge/g1", Host: "b.example", Locations: []model.Location{loc("/", model.PathPrefix, "app-web-80", "app/without")}},
					{Group: "edge/g1", Host: "no-paths.example", DefaultUpstream: "app-web-9000"},
				},
				Upstreams: []model.Upstream{webHTTP, {Name: "app-web-9000", Endpoints: aps("10.2.0.1:9090")}},
			},
		},
		{
			name: "group: unmatched-host annotation; a bad value is reported and the default kept",
			st: state(
				groupSvc("edge", "close", 1, v1alpha1.AnnotationUnmatchedHost, "close"),
				groupSvc("edge", "not-found", 2, v1alpha1.AnnotationUnmatchedHost, " not-found "),
				groupSvc("edge", "bad", 3, v1alpha1.AnnotationUnmatchedHost, "404"),
				groupSvc("edge", "unset", 4),
			),
			want: model.Snapshot{Groups: []model.Group{
				{Name: "edge/bad", Ports: g1Group.Ports, HTTPPort: 80, HTTPSPort: 443},
				{Name: "edge/close", Ports: g1Group.Ports, HTTPPort: 80, HTTPSPort: 443},
				{Name: "edge/not-found", Ports: g1Group.Ports, HTTPPort: 80, HTTPSPort: 443, UnmatchedHost: model.UnmatchedHostNotFound},
				{Name: "edge/unset", Ports: g1Group.Ports, HTTPPort: 80, HTTPSPort: 443},
			}},
			problems: []model.Problem{
				{Object: "Service edge/bad", Field: "metadata.annotations[portico.io/unmatched-host]", Reason: model.ReasonInvalidAnnotation},
			},
		},
		{
			name: "every path type, number and named ports, unset path type",
			st: state(gs, gsl, ws, wsl, ingress("app", "site", 0, "Example.COM", []path{
				{"/exact", exact, "web", 80},
				{"/prefix", pfx, "web", "http"},
				{"/impl", impl, "web", "admin"},
				{"", "", "web", 80},
			}, bind...)),
			want: model.Snapshot{
				Groups: []model.Group{g1Group},
				Servers: []model.Server{{Group: "edge/g1", Host: "example.com", Locations: []model.Location{
					loc("/", model.PathImplementationSpecific, "app-web-80", "app/site"),
					loc("/exact", model.PathExact, "app-web-80", "app/site"),
					loc("/impl", model.PathImplementationSpecific, "app-web-9000", "app/site"),
					loc("/prefix", model.PathPrefix, "app-web-80", "app/site"),
				}}},
				Upstreams: []model.Upstream{webHTTP, {Name: "app-web-9000", Endpoints: aps("10.2.0.1:9090")}},
			},
		},
		{
			name: "same host in several Ingresses: merged, the older wins overlapping paths, TLS and default backend",
			st: state(gs, gsl, ws, wsl, backendSvc("app", "api", sport("", 8080)), tlsSecret("app", "a-cert"), tlsSecret("app", "b-cert"),
				func() *networkingv1.Ingress {
					i := ingress("app", "b-newer", 2, "example.com", []path{{"/", pfx, "api", 8080}, {"/api", pfx, "api", 8080}}, append(bind, v1alpha1.AnnotationSSLRedirect, "true")...)
					i.Spec.TLS = []networkingv1.IngressTLS{{Hosts: []string{"example.com"}, SecretName: "b-cert"}}
					i.Spec.DefaultBackend = ptr(backend("api", 8080))
					return i
				}(),
				func() *networkingv1.Ingress {
					i := ingress("app", "a-older", 1, "example.com", []path{{"/", pfx, "web", 80}, {"/", exact, "web", 80}}, bind...)
					i.Spec.TLS = []networkingv1.IngressTLS{{Hosts: []string{"example.com"}, SecretName: "a-cert"}}
					i.Spec.DefaultBackend = ptr(backend("web", 80))
					return i
				}()),
			want: model.Snapshot{
				Groups: []model.Group{g1Group},
				Servers: []model.Server{
					{Group: "edge/g1", Host: "", DefaultUpstream: "app-web-80"},
					{Group: "edge/g1", Host: "example.com", TLSCertificate: "app/a-cert", SSLRedirect: true, Locations: []model.Location{
						loc("/", model.PathExact, "app-web-80", "app/a-older"),
						loc("/", model.PathPrefix, "app-web-80", "app/a-older"),
						loc("/api", model.PathPrefix, "app-api-8080", "app/b-newer"),
					}, DefaultUpstream: "app-web-80"},
				},
				Upstreams:    []model.Upstream{{Name: "app-api-8080"}, webHTTP},
				Certificates: []model.Certificate{{Name: "app/a-cert", CertPEM: []byte("CERT a-cert"), KeyPEM: []byte("KEY a-cert")}},
			},
			problems: []model.Problem{
				{Object: "Ingress app/b-newer", Field: "spec.defaultBackend", Reason: model.ReasonDefaultBackendConflict},
				{Object: "Ingress app/b-newer", Field: "spec.rules[0].http.paths[0]", Reason: model.ReasonPathConflict},
				{Object: "Ingress app/b-newer", Field: "spec.tls", Reason: model.ReasonTLSConflict},
			},
		},
		{
			name: "missing Service answers 503, missing port, missing and invalid Secret",
			st: state(gs, gsl, ws, wsl, &corev1.Secret{ObjectMeta: meta("app", "opaque", 0), Type: corev1.SecretTypeOpaque},
				func() *networkingv1.Ingress {
					i := ingress("app", "broken", 0, "x.example", []path{{"/gone", pfx, "gone", 80}, {"/noport", pfx, "web", "nope"}, {"/ok", pfx, "web", 80}}, bind...)
					i.Spec.TLS = []networkingv1.IngressTLS{{Hosts: []string{"x.example"}, SecretName: "missing"}, {Hosts: []string{"x.example"}, SecretName: "opaque"}}
					return i
				}()),
			want: model.Snapshot{
				Groups: []model.Group{g1Group},
				Servers: []model.Server{{Group: "edge/g1", Host: "x.example", Locations: []model.Location{
					loc("/gone", model.PathPrefix, "app-gone-80", "app/broken"),
					loc("/noport", model.PathPrefix, "app-web-nope", "app/broken"),
					loc("/ok", model.PathPrefix, "app-web-80", "app/broken"),
				}}},
				Upstreams: []model.Upstream{{Name: "app-gone-80"}, webHTTP, {Name: "app-web-nope"}},
			},
			problems: []model.Problem{
				{Object: "Ingress app/broken", Field: "spec.tls[0].secretName", Reason: model.ReasonSecretNotFound},
				{Object: "Ingress app/broken", Field: "spec.tls[1].secretName", Reason: model.ReasonInvalidSecret},
				{Object: "Ingress app/broken", Field: "spec.rules[0].http.paths[0].backend.service.name", Reason: model.ReasonServiceNotFound},
				{Object: "Ingress app/broken", Field: "spec.rules[0].http.paths[1].backend.service.port", Reason: model.ReasonPortNotFound},
			},
		},
		{
			name: "bad annotations and bindings: the rest still translates",
			st: state(gs, gsl, ws, wsl,
				ingress("app", "bad-redirect", 1, "a.example", []path{{"/", pfx, "web", 80}}, append(bind, v1alpha1.AnnotationSSLRedirect, "yes please")...),
				ingress("app", "no-group", 2, "b.example", []path{{"/", pfx, "web", 80}}, v1alpha1.AnnotationGroup, "edge/missing"),
				ingress("app", "bad-selector", 3, "c.example", []path{{"/", pfx, "web", 80}}, v1alpha1.AnnotationGroupSelector, "a in (b"),
				ingress("app", "no-match", 4, "d.example", []path{{"/", pfx, "web", 80}}, v1alpha1.AnnotationGroupSelector, "tier=gold"),
				ingress("app", "other-controller", 5, "e.example", []path{{"/", pfx, "web", 80}}),
				ingress("app", "relative-path", 6, "f.example", []path{{"rel", pfx, "web", 80}}, bind...),
			),
			want: model.Snapshot{
				Groups:    []model.Group{g1Group},
				Servers:   []model.Server{{Group: "edge/g1", Host: "a.example", Locations: []model.Location{loc("/", model.PathPrefix, "app-web-80", "app/bad-redirect")}}},
				Upstreams: []model.Upstream{webHTTP},
			},
			problems: []model.Problem{
				{Object: "Ingress app/no-group", Field: "metadata.annotations[portico.io/group]", Reason: model.ReasonGroupNotFound},
				{Object: "Ingress app/bad-selector", Field: "metadata.annotations[portico.io/group-selector]", Reason: model.ReasonInvalidAnnotation},
				{Object: "Ingress app/no-match", Field: "metadata.annotations[portico.io/group-selector]", Reason: model.ReasonNoMatchingGroup},
				{Object: "Ingress app/bad-redirect", Field: "metadata.annotations[portico.io/ssl-redirect]", Reason: model.ReasonInvalidAnnotation},
				{Object: "Ingress app/relative-path", Field: "spec.rules[0].http.paths[0].path", Reason: model.ReasonInvalidPath},
			},
		},
		{
			name: "cookie affinity: default and named cookies, max-age; bad values reported, the rest served",
			st: state(gs, gsl, ws, wsl,
				ingress("app", "plain", 1, "a.example", []path{{"/", pfx, "web", 80}}, append(bind, v1alpha1.AnnotationAffinity, "cookie")...),
				ingress("app", "named", 2, "b.example", []path{{"/cart", pfx, "web", 80}, {"/pay", exact, "web", 80}},
					append(bind, v1alpha1.AnnotationAffinity, "cookie", v1alpha1.AnnotationSessionCookieName, "SHOP_id-1", v1alpha1.AnnotationSessionCookieMaxAge, "3600")...),
				ingress("app", "bad-kind", 3, "c.example", []path{{"/", pfx, "web", 80}}, append(bind, v1alpha1.AnnotationAffinity, "ip")...),
				ingress("app", "bad-name", 4, "d.example", []path{{"/", pfx, "web", 80}},
					append(bind, v1alpha1.AnnotationAffinity, "cookie", v1alpha1.AnnotationSessionCookieName, "a;b=c")...),
				ingress("app", "bad-age", 5, "e.example", []path{{"/", pfx, "web", 80}},
					append(bind, v1alpha1.AnnotationAffinity, "cookie", v1alpha1.AnnotationSessionCookieMaxAge, "-1")...),
			),
			want: model.Snapshot{
				Groups: []model.Group{g1Group},
				Servers: []model.Server{
					{Group: "edge/g1", Host: "a.example", Locations: []model.Location{affine(loc("/", model.PathPrefix, "app-web-80", "app/plain"), v1alpha1.DefaultSessionCookie, 0)}},
					{Group: "edge/g1", Host: "b.example", Locations: []model.Location{
						affine(loc("/cart", model.PathPrefix, "app-web-80", "app/named"), "SHOP_id-1", 3600),
						affine(loc("/pay", model.PathExact, "app-web-80", "app/named"), "SHOP_id-1", 3600)}},
					{Group: "edge/g1", Host: "c.example", Locations: []model.Location{loc("/", model.PathPrefix, "app-web-80", "app/bad-kind")}},
					{Group: "edge/g1", Host: "d.example", Locations: []model.Location{loc("/", model.PathPrefix, "app-web-80", "app/bad-name")}},
					{Group: "edge/g1", Host: "e.example", Locations: []model.Location{affine(loc("/", model.PathPrefix, "app-web-80", "app/bad-age"), v1alpha1.DefaultSessionCookie, 0)}},
				},
				Upstreams: []model.Upstream{webHTTP},
			},
			problems: []model.Problem{
				{Object: "Ingress app/bad-kind", Field: "metadata.annotations[portico.io/affinity]", Reason: model.ReasonInvalidAnnotation},
				{Object: "Ingress app/bad-name", Field: "metadata.annotations[portico.io/session-cookie-name]", Reason: model.ReasonInvalidAnnotation},
				{Object: "Ingress app/bad-age", Field: "metadata.annotations[portico.io/session-cookie-max-age]", Reason: model.ReasonInvalidAnnotation},
			},
		},
		{
			name: "IngressClass binding: parameters, annotation, default class, other controllers ignored",
			st: state(gs, gsl, ws, wsl,
				&networkingv1.IngressClass{ObjectMeta: meta("", "by-param", 0), Spec: networkingv1.IngressClassSpec{Controller: v1alpha1.ControllerName,
					Parameters: &networkingv1.IngressClassParametersReference{Kind: "Service", Name: "g1", Namespace: ptr("edge"), Scope: ptr("Namespace")}}},
				&networkingv1.IngressClass{ObjectMeta: meta("", "by-annotation", 0, v1alpha1.AnnotationGroup, "edge/g1", annotationDefaultClass, "true"), Spec: networkingv1.IngressClassSpec{Controller: v1alpha1.ControllerName}},
				&networkingv1.IngressClass{ObjectMeta: meta("", "nginx", 0), Spec: networkingv1.IngressClassSpec{Controller: "k8s.io/ingress-nginx"}},
				func() *networkingv1.Ingress {
					i := ingress("app", "p", 0, "p.example", []path{{"/", pfx, "web", 80}})
					i.Spec.IngressClassName = ptr("by-param")
					return i
				}(),
				ingress("app", "a", 0, "a.example", []path{{"/", pfx, "web", 80}}, annotationIngressClass, "by-annotation"),
				ingress("app", "d", 0, "d.example", []path{{"/", pfx, "web", 80}}),
				func() *networkingv1.Ingress {
					i := ingress("app", "n", 0, "n.example", []path{{"/", pfx, "web", 80}}, bind...)
					i.Spec.IngressClassName = ptr("nginx")
					return i
				}(),
			),
			want: model.Snapshot{
				Groups: []model.Group{g1Group},
				Servers: []model.Server{
					{Group: "edge/g1", Host: "a.example", Locations: []model.Location{loc("/", model.PathPrefix, "app-web-80", "app/a")}},
					{Group: "edge/g1", Host: "d.example", Locations: []model.Location{loc("/", model.PathPrefix, "app-web-80", "app/d")}},
					{Group: "edge/g1", Host: "p.example", Locations: []model.Location{loc("/", model.PathPrefix, "app-web-80", "app/p")}},
				},
				Upstreams: []model.Upstream{webHTTP},
			},
		},
		{
			name: "IPv6 backends and wildcard host",
			st: state(gs, gsl, backendSvc("app", "v6", sport("http", 80)),
				slice("app", "v6", "v6-1", "http", 8080, ep{addr: "2001:db8:2::2", ready: true}, ep{addr: "2001:db8:2::1", ready: true}),
				ingress("app", "six", 0, "*.Example.org", []path{{"/", pfx, "v6", 80}}, bind...)),
			want: model.Snapshot{
				Groups:    []model.Group{g1Group},
				Servers:   []model.Server{{Group: "edge/g1", Host: "*.example.org", Locations: []model.Location{loc("/", model.PathPrefix, "app-v6-80", "app/six")}}},
				Upstreams: []model.Upstream{{Name: "app-v6-80", Endpoints: aps("[2001:db8:2::1]:8080", "[2001:db8:2::2]:8080")}},
			},
		},
		{
			name: "upstream names that would collide get a hash of their identity",
			st: state(gs, gsl, backendSvc("a-b", "c", sport("", 80)), backendSvc("a", "b-c", sport("", 80)),
				ingress("a-b", "i1", 0, "one.example", []path{{"/", pfx, "c", 80}}, bind...),
				ingress("a", "i2", 1, "two.example", []path{{"/", pfx, "b-c", 80}}, bind...)),
			want: model.Snapshot{
				Groups: []model.Group{g1Group},
				Servers: []model.Server{
					{Group: "edge/g1", Host: "one.example", Locations: []model.Location{loc("/", model.PathPrefix, "a-b-c-80-"+shortHash("svc|a-b/c|80"), "a-b/i1")}},
					{Group: "edge/g1", Host: "two.example", Locations: []model.Location{loc("/", model.PathPrefix, "a-b-c-80-"+shortHash("svc|a/b-c|80"), "a/i2")}},
				},
				Upstreams: sortedUpstreams(
					model.Upstream{Name: "a-b-c-80-" + shortHash("svc|a-b/c|80")},
					model.Upstream{Name: "a-b-c-80-" + shortHash("svc|a/b-c|80")}),
			},
		},
		{
			name: "pod routes: every path on every host, replicas share an upstream, conflicts and bad annotations",
			st: state(gs, gsl,
				microservice("shop", "node-1", 1, "10.3.0.1", "test.k8s.local shop.example", "3000:/nodejs,80:/", v1alpha1.AnnotationGroup, "edge/g1"),
				microservice("shop", "node-2", 2, "10.3.0.2", "test.k8s.local,shop.example", "3000:/nodejs 80:/", v1alpha1.AnnotationGroup, "edge/g1"),
				microservice("other", "thief", 3, "10.4.0.1", "shop.example", "80:/"),
				microservice("shop", "pending", 4, "", "shop.example", "80:/"),
				microservice("shop", "bad", 5, "10.3.0.9", "shop.example", "http:/x,8080/y"),
				func() *corev1.Pod {
					p := microservice("shop", "no-paths", 6, "10.3.0.8", "shop.example", "")
					delete(p.Annotations, v1alpha1.AnnotationPublicPaths)
					return p
				}(),
			),
			opts: Options{PodRouteGroup: "edge/g1"},
			want: func() model.Snapshot {
				up := func(host, path string, port int) string {
					return "shop-pod-" + shortHash(host+"|"+path) + "-" + map[int]string{80: "80", 3000: "3000"}[port]
				}
				return model.Snapshot{
					Groups: []model.Group{g1Group},
					Servers: []model.Server{
						{Group: "edge/g1", Host: "shop.example", Locations: []model.Location{
							loc("/", model.PathPrefix, up("shop.example", "/", 80), "shop/node-1"),
							loc("/nodejs", model.PathPrefix, up("shop.example", "/nodejs", 3000), "shop/node-1"),
						}},
						{Group: "edge/g1", Host: "test.k8s.local", Locations: []model.Location{
							loc("/", model.PathPrefix, up("test.k8s.local", "/", 80), "shop/node-1"),
							loc("/nodejs", model.PathPrefix, up("test.k8s.local", "/nodejs", 3000), "shop/node-1"),
						}},
					},
					Upstreams: sortedUpstreams(
						model.Upstream{Name: up("shop.example", "/", 80), Endpoints: aps("10.3.0.1:80", "10.3.0.2:80")},
						model.Upstream{Name: up("shop.example", "/nodejs", 3000), Endpoints: aps("10.3.0.1:3000", "10.3.0.2:3000")},
						model.Upstream{Name: up("test.k8s.local", "/", 80), Endpoints: aps("10.3.0.1:80", "10.3.0.2:80")},
						model.Upstream{Name: up("test.k8s.local", "/nodejs", 3000), Endpoints: aps("10.3.0.1:3000", "10.3.0.2:3000")},
					),
				}
			}(),
			problems: []model.Problem{
				{Object: "Pod other/thief", Field: "metadata.annotations[trafficHosts]", Reason: model.ReasonHostTaken},
				{Object: "Pod shop/bad", Field: "metadata.annotations[publicPaths]", Reason: model.ReasonInvalidAnnotation},
				{Object: "Pod shop/bad", Field: "metadata.annotations[publicPaths]", Reason: model.ReasonInvalidAnnotation},
				{Object: "Pod shop/no-paths", Field: "metadata.annotations[publicPaths]", Reason: model.ReasonInvalidAnnotation},
			},
		},
		{
			name: "pod route without a group",
			st:   state(gs, gsl, microservice("shop", "lost", 1, "10.3.0.1", "a.example", "80:/")),
			want: model.Snapshot{Groups: []model.Group{g1Group}},
			problems: []model.Problem{
				{Object: "Pod shop/lost", Field: "metadata.annotations[portico.io/group]", Reason: model.ReasonGroupNotFound},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, _, problems := Build(tc.st, tc.opts)
			if err := got.Validate(); err != nil {
				t.Errorf("snapshot breaks the model's rules: %v", err)
			}
			if diff := cmp.Diff(tc.want, got, cmpAddrs); diff != "" {
				t.Errorf("snapshot (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.problems, problems, ignoreDetail, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
			// Pure and deterministic: the same objects again, in any list order, give
			// an Equal snapshot.
			rng := rand.New(rand.NewPCG(1, uint64(len(tc.name))))
			for i, order := range []string{"same", "reversed", "shuffled", "shuffled again"} {
				st := reorder(tc.st, func(n int, swap func(i, j int)) {
					switch i {
					case 1:
						for a, b := 0, n-1; a < b; a, b = a+1, b-1 {
							swap(a, b)
						}
					case 2, 3:
						rng.Shuffle(n, swap)
					}
				})
				if again, _, _ := Build(st, tc.opts); !got.Equal(again) {
					t.Errorf("Build on the %s lists differs (-first +again):\n%s", order, cmp.Diff(got, again, cmpAddrs))
				}
			}
		})
	}
}
