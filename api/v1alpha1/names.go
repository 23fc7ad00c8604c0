package v1alpha1

// Names Portico reads and writes on Kubernetes objects: the annotations and
// labels operators and users set, and those Portico's processes write for each
// other (the agents' status Leases' are api/agentstatus's).
const (
	// ControllerName is the IngressClass spec.controller Portico serves.
	ControllerName = "portico.io/ingress-controller"
	// GatewayControllerName is the GatewayClass spec.controllerName Portico
	// serves (Gateway API).
	GatewayControllerName = "portico.io/gateway-controller"
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
	// (its value names the FederatedIngress in the host cluster; the namespace is
	// the Ingress's own). The member's control plane reads it: in BGP mode its
	// edges announce by the health of such Ingresses (model.Group.Federated).
	LabelFederatedIngress = "portico.io/federated-ingress"
	// AnnotationFederationHealth ("All") on a federated Ingress: the site counts as
	// serving it only while every backend Service it names has a ready endpoint
	// (default: any of them).
	AnnotationFederationHealth = "portico.io/federation-health"
	// AnnotationFederationGeneration on a federated Ingress is the
	// FederatedIngress generation it was rendered from.
	AnnotationFederationGeneration = "portico.io/federation-generation"
	// FederationFinalizer holds a FederatedIngress until its Ingresses are gone
	// from every member cluster.
	FederationFinalizer = "portico.io/federation"
	// LabelMemberCluster marks a Secret in the federation controller's namespace
	// as a member cluster's kubeconfig; a non-empty value names the cluster (else
	// the Secret's name).
	LabelMemberCluster = "portico.io/member-cluster"
	// KeyMemberKubeconfig is the member Secret's key holding the kubeconfig.
	KeyMemberKubeconfig = "kubeconfig"
	// AnnotationAgentsNamespace on a member Secret names the namespace of the
	// member's Portico agents (their status Leases); default portico-system.
	AnnotationAgentsNamespace = "portico.io/agents-namespace"
	// AnnotationDrain on a member Secret drains the site (a planned drain):
	// "true", or the RFC 3339 time the drain begins. With "true" the federation
	// controller fixes the time, a lead from when it first sees it, in
	// AnnotationDrainFrom, so every site's agents (which read their mounted
	// ConfigMap at their own pace) agree on it and the others are ready first.
	AnnotationDrain     = "portico.io/drain"
	AnnotationDrainFrom = "portico.io/drain-from"
	// AnnotationCapacity on a member Secret is the site's capacity in new
	// connections a second; above it the site spills new connections to the
	// site AnnotationOverflowTo names, at most the share
	// AnnotationOverflowLimit says (default 0.5). Each edge is told its share of
	// the capacity (the routers spread new connections evenly over the edges).
	AnnotationCapacity      = "portico.io/capacity"
	AnnotationOverflowTo    = "portico.io/overflow-to"
	AnnotationOverflowLimit = "portico.io/overflow-limit"
	// AnnotationHostDelegates on an Ingress (or pod route) of the namespace that
	// owns a host (controlplane's hostOwners) lists the other namespaces that may route paths of
	// it too, separated by commas or spaces ("*": every namespace).
	AnnotationHostDelegates = "portico.io/host-delegates"
	// AnnotationIface on a Node names the edge interface of the Portico agents
	// on it, in place of their --iface: one name, or candidates separated by
	// "," of which the first present on the node is used (as MetalLB's
	// L2Advertisement interfaces and kube-vip's vip_interface). Read when an
	// agent starts.
	AnnotationIface = "portico.io/iface"
	// AnnotationTrafficHosts lists a pod route's hosts.
	AnnotationTrafficHosts = "trafficHosts"
	// AnnotationPublicPaths lists a pod route's PORT:PATH entries.
	AnnotationPublicPaths = "publicPaths"
)
