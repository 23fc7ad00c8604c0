// Package model is the plain-data picture of what Portico should serve, built by the
// control plane from Kubernetes objects and consumed by the data plane, nginx and the
// status writers. It holds no Kubernetes types and no pointers: two snapshots built
// from the same objects are Equal, field for field, on every node, and Validate
// checks the rules each type documents.
package model

import (
	"net/netip"
	"reflect"
	"regexp"
)

// Snapshot is everything one build of the cluster state produced. Every slice is
// sorted by its documented key so that equal inputs give equal snapshots.
type Snapshot struct {
	Groups       []Group       // sorted by Name
	Servers      []Server      // sorted by (Group, View, Port, Host)
	Upstreams    []Upstream    // sorted by Name
	Certificates []Certificate // sorted by Name
	Services     []Service     // sorted by Name
	Views        []View        // sorted by Name
}

// Equal reports whether two snapshots describe the same desired state.
func (s Snapshot) Equal(o Snapshot) bool { return reflect.DeepEqual(s, o) }

// Group is a set of ingress replicas behind shared VIPs: a Service whose endpoints
// are Portico agents.
type Group struct {
	Name     string       // "namespace/name" of the group Service
	VIPs     []netip.Addr // sorted; at most MaxVIPsPerFamily of each address family
	VRID     uint8        // VRRP virtual router id, 1..255; 0 until one is assigned
	Ports    []Port       // sorted by (Protocol, Port); empty means every port
	Replicas []Replica    // sorted by Addr
	// HTTPPort and HTTPSPort are the public ports the group's nginx serves HTTP
	// and HTTPS on: the group Service's TCP ports named "http" and "https". 0
	// leaves the agent's own (--http-port, --https-port; 80 and 443).
	HTTPPort, HTTPSPort uint16
	// UnmatchedHost is how the group's nginx answers a host none of its Servers
	// names when it has no catch-all Server (portico.io/unmatched-host).
	UnmatchedHost UnmatchedHost
	// Ingresses are the Ingresses bound to the group, "namespace/name" ->
	// metadata.generation, and the Gateways and HTTPRoutes it serves, "Kind
	// namespace/name": an agent whose nginx serves this snapshot reports them,
	// and the controller writes an Ingress's address (a Gateway's Programmed)
	// once every edge of its group serves its generation.
	Ingresses map[string]int64
	// Federated are the group's Ingresses a federation propagated (labelled
	// portico.io/federated-ingress), "namespace/name" -> whether a backend it names
	// has a ready endpoint in this cluster; nil when there are none. In BGP mode
	// the group's edges announce its VIPs by it (the site's own health).
	Federated map[string]bool
}

// MaxVIPsPerFamily bounds a group's VIPs of one address family (one VRRP
// virtual router carries them all).
const MaxVIPsPerFamily = 8

// What one group's edges hold, its own VIPs and those of its L4 Services
// together: the build refuses the newest L4 Service that would go beyond any
// of these, so that no edge's data plane or announcer ever fails on them.
const (
	// MaxGroupVIPs is xdp_lb's VIP addresses (LB_MAX_VIPS, which a dataplane
	// test checks).
	MaxGroupVIPs = 256
	// MaxGroupVIPKeys is xdp_lb's (VIP, port, protocol) keys (LB_MAX_VIP_KEYS).
	MaxGroupVIPKeys = 1024
	// MaxGroupBackends is xdp_lb's backends, one per VIP address and replica
	// (LB_MAX_BACKENDS, id 0 unused).
	MaxGroupBackends = 4095
	// MaxVRRPAddrs4 is the IPv4 addresses one VRRP advert carries (an 8-bit
	// count); MaxVRRPAddrs6 the IPv6 ones that fit in IPv6's minimum MTU
	// (1280 bytes, less 48 of headers, 16 per address).
	MaxVRRPAddrs4 = 255
	MaxVRRPAddrs6 = 77
)

// UnmatchedHost is how nginx answers a request for a host it has no Server for.
type UnmatchedHost string

const (
	// UnmatchedHostClose (the zero value, and the default) closes the connection
	// without an answer (nginx's 444).
	UnmatchedHostClose UnmatchedHost = ""
	// UnmatchedHostNotFound answers 404, as ingress-nginx's default backend does
	// and the Ingress conformance tests expect.
	UnmatchedHostNotFound UnmatchedHost = "NotFound"
)

// Protocol is an L4 protocol a VIP serves.
type Protocol string

const (
	TCP Protocol = "TCP"
	UDP Protocol = "UDP"
)

// Service is an L4 Service: a LoadBalancer Service of class portico.io/vip. Its
// VIPs are announced and steered like its group's, over the group's replicas,
// and every replica's nginx forwards each of its ports to the port's upstream.
type Service struct {
	Name  string        // "namespace/name" of the Service
	Group string        // Group.Name whose replicas serve it
	VIPs  []netip.Addr  // sorted; at most MaxVIPsPerFamily of each address family
	Ports []ServicePort // sorted by (Protocol, Port)
	// ProxyProtocol gives the endpoints the client's address
	// (portico.io/proxy-protocol): a PROXY protocol v1 header on each TCP
	// connection, a v2 header on every UDP datagram.
	ProxyProtocol bool
	// ClientIPAffinity sends every connection and datagram of one client
	// address to the same endpoint (spec.sessionAffinity: ClientIP).
	ClientIPAffinity bool
	// UDPIdleTimeout ends a UDP session (one client address and port, one
	// endpoint) after this many seconds without a datagram
	// (portico.io/udp-idle-timeout); 0 means DefaultUDPIdleTimeout.
	UDPIdleTimeout uint32
}

// DefaultUDPIdleTimeout is a UDP session's idle timeout in seconds when its
// Service does not set one: the kernel's for an unreplied UDP flow.
const DefaultUDPIdleTimeout = 30

// ServicePort is one public port of an L4 Service and where it goes.
type ServicePort struct {
	Protocol Protocol
	Port     uint16
	Upstream string // Upstream.Name
}

// Port is one L4 port of a group's VIPs.
type Port struct {
	Protocol Protocol
	Port     uint16
}

// ReplicaState is how the data plane treats a replica.
type ReplicaState string

const (
	// Ready replicas are in the Maglev ring and receive new flows.
	Ready ReplicaState = "Ready"
	// Draining replicas keep their established flows and receive no new ones.
	Draining ReplicaState = "Draining"
)

// Replica is one ingress replica of a group: a node running a Portico agent.
type Replica struct {
	Node   string     // node name, "" when the EndpointSlice does not say
	Addr   netip.Addr // the node's address on the VIP's L2 segment
	Weight uint32     // relative share of new flows; 0 is treated as 1
	State  ReplicaState
}

// PathType is an Ingress path's match semantics.
type PathType string

const (
	PathExact                  PathType = "Exact"
	PathPrefix                 PathType = "Prefix"
	PathImplementationSpecific PathType = "ImplementationSpecific"
)

// View is a set of a group's VIPs whose HTTP and HTTPS hosts are their own: a
// Gateway with addresses of its own. Its VIPs are announced and steered like
// the group's, over the group's replicas, on Ports; the replicas' nginx
// answers a request that came to one of them on a port from the View's
// Servers of that port alone, and a request to any other address of the
// node from the Servers of no View.
type View struct {
	Name  string       // "namespace/name" of the Gateway
	Group string       // Group.Name whose replicas serve it
	VIPs  []netip.Addr // sorted; at most MaxVIPsPerFamily of each address family
	Ports []Port       // sorted by (Protocol, Port); TCP
	// TLSPorts are those of Ports that serve HTTPS (sorted); the others serve
	// HTTP.
	TLSPorts []uint16
}

// Server is one virtual host served by a group's nginx.
type Server struct {
	Group string // Group.Name that serves this host
	// View is the View.Name whose VIPs the host is served on, "" for the
	// group's own VIPs (and every other address of its replicas); Port, in a
	// View, the one of its Ports it is served on (0 outside Views: every port).
	View string
	Port uint16
	// Listener, in a View, names the Gateway listener whose host this is (the
	// most specific one its name matches): an HTTPS request whose Host is
	// another listener's than the name its TLS handshake gave (SNI) is
	// answered 421, as Gateway API asks of HTTP/2 connections reused across
	// hosts. [a-z0-9-], at most 253 bytes.
	Listener string
	// Host is a lower-case DNS name, a "*.suffix" wildcard (one label, the
	// Ingress rule) or a "**.suffix" wildcard (any number of labels, Gateway
	// API's "*.suffix"); "" is the catch-all.
	Host            string
	TLSCertificate  string     // Certificate.Name, "" for plain HTTP only
	SSLRedirect     bool       // redirect HTTP to HTTPS (portico.io/ssl-redirect)
	Locations       []Location // sorted by (Path, Type, Rank)
	DefaultUpstream string     // Upstream.Name answering paths no Location matches; "" = 404
}

// Location routes one path of a host to an upstream.
type Location struct {
	Path string
	Type PathType
	// Rank orders the Locations of one path and type, lower first: a request
	// takes the first whose Match it meets (Gateway API's precedence, which the
	// builder computes); Ingress paths leave it 0.
	Rank     uint32
	Upstream string // Upstream.Name; "" when Backends or Status say where
	Source   string // "namespace/name" of the Ingress, Pod or route that asked for it
	// Affinity keeps a client on one endpoint of the upstream by a cookie
	// (portico.io/affinity: cookie); its zero value is none.
	Affinity CookieAffinity
	// Match narrows the location to requests with this method, headers and
	// query parameters; its zero value matches every request.
	Match RequestMatch
	// Backends share the location's requests by weight, when Upstream is "".
	Backends []Backend
	// Status, when neither Upstream nor Backends is set, answers every
	// request with it (with Filters.Redirect, a 3xx redirect).
	Status int
	// Filters change the request before it is proxied, or the answer.
	Filters Filters
	// Timeouts bound the time its requests may take.
	Timeouts Timeouts
}

// Timeouts are Gateway API's HTTPRoute timeouts, in milliseconds: Request
// bounds each wait on the backend by what is left of the request's time since
// nginx read it, Backend each wait on one try; 0 leaves nginx's (60 s between
// two reads), NoTimeout (Gateway API's "0s") waits a day.
type Timeouts struct {
	Request, Backend uint32
}

// NoTimeout is a Timeouts value that does not time out (a day).
const NoTimeout = 24 * 3600 * 1000

// RequestMatch is what a request must carry, besides its path, for a Location
// to take it (Gateway API's HTTPRouteMatch): every condition set must hold.
type RequestMatch struct {
	Method  string      // upper-case HTTP method; "" for any
	Headers []NameValue // header name (lower-case) and exact value
	Query   []NameValue // query parameter name and exact value
}

// IsZero reports whether m matches every request.
func (m RequestMatch) IsZero() bool {
	return m.Method == "" && len(m.Headers) == 0 && len(m.Query) == 0
}

// NameValue is a header or query parameter and its value.
type NameValue struct {
	Name, Value string
}

// Backend is one upstream of a Location's weighted share, or, when Upstream
// is "", a status its share of requests is answered with (Gateway API's 500
// for a backend reference that does not resolve).
type Backend struct {
	Upstream string
	Status   int
	Weight   uint32 // 0 takes no requests
	// RequestHeaders change the requests this backend takes, after the
	// Location's own filters (Gateway API's filters on a backendRef).
	RequestHeaders HeaderChanges
}

// Filters are Gateway API's HTTPRoute filters that a Location applies.
type Filters struct {
	// RequestHeaders and ResponseHeaders change the request before it is
	// proxied and the answer before it is sent.
	RequestHeaders, ResponseHeaders HeaderChanges
	// Redirect, with Location.Status a 3xx, answers with a Location built from
	// the request and these replacements.
	Redirect *Redirect
	// Rewrite changes the request's host or path before it is proxied.
	Rewrite *Rewrite
	// CORS answers preflight requests and adds CORS headers to the answers.
	CORS *CORS
	// Mirrors get a copy of the requests (as proxied), whose answers are
	// dropped.
	Mirrors []Mirror
}

// Mirror is Gateway API's RequestMirror filter: a copy of a share of the
// requests goes to an endpoint of Upstream, best effort (a copy nginx cannot
// send at once, or whose body it holds on disk, is dropped).
type Mirror struct {
	Upstream string
	// Numerator of Denominator requests are copied; a zero Denominator
	// copies every one.
	Numerator, Denominator uint32
}

// CORS is Gateway API's CORS filter: nginx answers a preflight request (an
// OPTIONS with an Origin and an Access-Control-Request-Method) itself, with
// 204 and, for an allowed origin, the Access-Control-Allow-* headers; the
// answer to any other request from an allowed origin gets
// Access-Control-Allow-Origin (the origin itself), -Credentials and
// -Expose-Headers.
type CORS struct {
	// AllowOrigins are "*", "scheme://host[:port]", or "scheme://*.suffix"
	// (any number of labels before the suffix).
	AllowOrigins []string
	// AllowMethods and AllowHeaders are methods and header names, or "*"
	// (any: the preflight's own are echoed).
	AllowMethods, AllowHeaders []string
	ExposeHeaders              []string
	MaxAge                     uint32 // seconds; 0 sends none
	AllowCredentials           bool
}

// HeaderChanges sets, appends to and removes headers, in that order of
// precedence (Gateway API's HTTPHeaderFilter).
type HeaderChanges struct {
	Set, Add []NameValue
	Remove   []string
}

// IsZero reports whether h changes nothing.
func (h HeaderChanges) IsZero() bool { return len(h.Set) == 0 && len(h.Add) == 0 && len(h.Remove) == 0 }

// Redirect is the parts of a redirect's Location that replace the request's:
// each zero value keeps the request's (Port 0: the scheme's well-known port
// when Scheme is set, else the port the request came to).
type Redirect struct {
	Scheme, Host string
	Port         uint16
	Path         PathChange
}

// Rewrite is Gateway API's URLRewrite filter.
type Rewrite struct {
	Host string
	Path PathChange
}

// PathChange replaces a request's whole path (PathChangeFull) or the prefix its
// Location matched (PathChangePrefix, for Prefix locations) with Value; its
// zero value keeps the path.
type PathChange struct {
	Type  PathChangeType
	Value string
}

// PathChangeType is how a PathChange applies.
type PathChangeType string

const (
	PathChangeFull   PathChangeType = "Full"
	PathChangePrefix PathChangeType = "Prefix"
)

// CookieAffinity is session affinity by cookie: the cookie names the client's
// endpoint by an opaque id derived from the endpoint's address alone, so every
// replica's nginx sends it to the same endpoint, and only clients whose endpoint
// left are moved.
type CookieAffinity struct {
	Cookie string // the cookie's name (CookieNameRE); "" means no affinity
	MaxAge uint32 // seconds; 0 makes it a session cookie
}

// Cookie names Portico accepts: a strict subset of RFC 6265's token, which
// needs no quoting in nginx.conf, Lua or a Set-Cookie header.
var CookieNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// MaxCookieAge bounds CookieAffinity.MaxAge: one year.
const MaxCookieAge = 365 * 24 * 3600

// Upstream is one Service port and its ready endpoints.
type Upstream struct {
	Name      string           // "namespace-service-port", unique
	Endpoints []netip.AddrPort // sorted; empty means the backend answers 503
}

// Certificate is the TLS material of one Secret.
type Certificate struct {
	Name    string // "namespace/name" of the Secret
	CertPEM []byte
	KeyPEM  []byte
}

// Problem is an object (or part of one) that could not be translated. The rest of
// the snapshot is built without it.
type Problem struct {
	Object string // "Kind namespace/name"
	Field  string // the offending field path, e.g. "spec.rules[0].host"
	Reason Reason // why, from a bounded vocabulary (a metric label)
	Detail string // human-readable explanation
}

func (p Problem) String() string {
	s := p.Object
	if p.Field != "" {
		s += " " + p.Field
	}
	return s + ": " + string(p.Reason) + ": " + p.Detail
}
