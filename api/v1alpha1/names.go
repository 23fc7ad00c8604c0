package v1alpha1

// Names Portico reads and writes on Kubernetes objects: the annotations and
// labels operators and users set, and those Portico's processes write for each
// other (the agents' status Leases' are api/agentstatus's).
const (
	// ControllerName is the IngressClass spec.controller Portico serves.
	ControllerName = "portico.io/ingress-controller"
	// LoadBalancerClass marks a LoadBalancer Service as an L4 Service Portico
	// serves (a group when it is also labelled portico.io/group=true).
	LoadBalancerClass = "portico.io/vip"
	// LabelGroup ("true") marks a Service as a Portico group.
	LabelGroup = "portico.io/group"
	// AnnotationGroup binds an Ingress, Pod or IngressClass to a group.
	AnnotationGroup = "portico.io/group"
	// AnnotationGroupSelector asks the scheduler for a group matching a label selector.
	AnnotationGroupSelector = "portico.io/group-selector"
	// AnnotationVIP holds a group's VIPs (comma-separated).
	AnnotationVIP = "portico.io/vip"
	// AnnotationVIPAlias is another name for AnnotationVIP, read the same way.
	AnnotationVIPAlias = "ingress.alpha.k8s.io/ingress-vip"
	// AnnotationVRID holds a group's VRRP virtual router id (1..255).
	AnnotationVRID = "portico.io/vrid"
	// AnnotationUnmatchedHost ("close" or "not-found") on a group says how its nginx
	// answers a host no Ingress of the group names: close the connection (the
	// default) or answer 404.
	AnnotationUnmatchedHost = "portico.io/unmatched-host"
	// AnnotationProxyProtocol ("true"/"false") on an L4 Service sends the
	// client's address to its endpoints in a PROXY protocol header (v1 on TCP,
	// v2 on every UDP datagram).
	AnnotationProxyProtocol = "portico.io/proxy-protocol"
	// AnnotationUDPIdleTimeout (a duration, 1s to 1h) on an L4 Service ends a UDP
	// session after that long without a datagram (default 30s).
	AnnotationUDPIdleTimeout = "portico.io/udp-idle-timeout"
	// AnnotationAffinity ("cookie") on an Ingress keeps each client on one
	// endpoint of every path it routes, by a cookie.
	AnnotationAffinity = "portico.io/affinity"
	// AnnotationSessionCookieName names that cookie (default DefaultSessionCookie).
	AnnotationSessionCookieName = "portico.io/session-cookie-name"
	// AnnotationSessionCookieMaxAge (seconds) makes it outlive the browser
	// session; without it, it is a session cookie.
	AnnotationSessionCookieMaxAge = "portico.io/session-cookie-max-age"
	// DefaultSessionCookie is the affinity cookie's name when none is given.
	DefaultSessionCookie = "portico-affinity"
	// AnnotationSSLRedirect ("true"/"false") redirects HTTP to HTTPS for an Ingress's hosts.
	AnnotationSSLRedirect = "portico.io/ssl-redirect"
	// LabelMicroservice ("true") marks a pod route.
	LabelMicroservice = "microservice"
	// LabelFederatedIngress marks an Ingress a federation controller propagated
	// (its value names the FederatedIngress in the host cluster).
	LabelFederatedIngress = "portico.io/federated-ingress"
	// AnnotationFederationHealth ("All") on a federated Ingress: the site counts as
	// serving it only while every backend Service it names has a ready endpoint
	// (default: any of them).
	AnnotationFederationHealth = "portico.io/federation-health"
	// AnnotationHostDelegates on an Ingress (or pod route) of the namespace that
	// owns a host (controlplane's hostOwners) lists the other namespaces that may route paths of
	// it too, separated by commas or spaces ("*": every namespace).
	AnnotationHostDelegates = "portico.io/host-delegates"
	// AnnotationTrafficHosts lists a pod route's hosts.
	AnnotationTrafficHosts = "trafficHosts"
	// AnnotationPublicPaths lists a pod route's PORT:PATH entries.
	AnnotationPublicPaths = "publicPaths"
)
