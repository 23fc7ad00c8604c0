// Package controlplane is the first step of Portico's flow: it watches Kubernetes
// (informers) and turns the objects into the plain-data model.Snapshot that the data
// plane, nginx and the status writers consume.
//
// The translation is a pure function, Build, over listed objects; everything invalid
// becomes a model.Problem and the rest still translates. Build also returns each
// Ingress's binding, which scheduling and the Ingress status use. The Controller
// around it runs informers and one rate-limited, coalescing workqueue, fans each new
// snapshot that passes model's Validate out to Sinks (with retries), and, only while
// it holds the leader Lease, makes the cluster-wide writes: VIP and VRID allocation,
// Ingress scheduling, Ingress and Service status, and IngressClaim provisioning.
//
// # Objects and annotations
//
// A group (a set of ingress replicas sharing VIPs) is a Service labelled
// portico.io/group=true (a LoadBalancer one also gets its VIPs in its status).
// Its EndpointSlices list the Portico agents (hostNetwork, so endpoint
// address = node address): ready endpoints are Ready replicas, terminating ones
// Draining. Its ports are the ports its VIPs serve; the TCP ports named "http" and
// "https" are where its nginx serves HTTP and HTTPS. Its VIPs come from the annotation portico.io/vip (comma-separated, up to
// model.MaxVIPsPerFamily of each family; ingress.alpha.k8s.io/ingress-vip is read as an alias) or are
// allocated from the configured pools by the leader, which writes the annotation and,
// for LoadBalancer Services, status.loadBalancer.ingress. Its VRRP id is the
// annotation portico.io/vrid, set by hand or allocated by the leader (lowest free id,
// oldest group first); a duplicate is reported and not applied, so no two groups share
// a VRID. Its annotation portico.io/unmatched-host says how its nginx answers a request
// for a host none of its Ingresses names (when none has a default backend): "close"
// (the default) closes the connection without an answer, "not-found" answers 404, as
// ingress-nginx does; any other value is reported and the default kept.
//
// An L4 Service is a LoadBalancer Service with loadBalancerClass portico.io/vip that
// is not a group. The group its annotation portico.io/group names ("name" in its
// namespace, or "namespace/name"; without it, Options.PodRouteGroup, which the agent
// leaves empty, so the annotation is required and its absence reported) serves it: its VIPs (portico.io/vip, or allocated from the pools like a group's,
// and written to status.loadBalancer.ingress; outside Options.OperatorNamespaces
// only addresses of a pool that allows the Service: a VIPPool, by namespace list,
// namespace labels or Service labels, or a --vip-pool flag's) are announced with the group's and
// steered over the group's replicas, whose nginx forwards each TCP and UDP port to
// the Service's ready endpoints. portico.io/proxy-protocol: "true" gives the
// endpoints the client's address: a PROXY protocol v1 header on each TCP
// connection, a v2 header on every UDP datagram (without it they see the
// replica's address, as behind any L4 proxy);
// spec.sessionAffinity ClientIP keeps a client address on one endpoint (a
// consistent hash, the same on every replica).
//
// An Ingress is bound to a group by, in order: its annotation portico.io/group ("name"
// in the Ingress's namespace, or "namespace/name"); its IngressClass, when the class's
// controller is portico.io/ingress-controller and the class names the group (parameters
// of kind Service, or the class annotation portico.io/group); or a label selector in the
// annotation portico.io/group-selector (on the Ingress or its class), in which case the
// leader picks the matching group with the most headroom by the load its edges report
// (Schedule), then the fewest bound Ingresses, then by name, and records it in
// portico.io/group. Bindings are sticky: a recorded group is never
// replaced, and a missing one is reported.
//
// An Ingress annotated portico.io/affinity: "cookie" keeps each client on one
// endpoint of every path it routes, by a cookie (portico.io/session-cookie-name,
// default portico-affinity; portico.io/session-cookie-max-age in seconds, else a
// session cookie). Another affinity value or a bad cookie name leaves the Ingress
// without affinity, a bad max-age leaves a session cookie; each is reported.
//
// An Ingress's spec.defaultBackend answers what none of its rules match, as the
// Ingress specification says and ingress-nginx does: paths of its own hosts that no
// rule matches, and hosts no Ingress of the group names (the group's catch-all; when
// two Ingresses of a group have different default backends, the older one's is used
// and the other reported). A host keeps the default backend of the oldest Ingress
// that gives it one.
//
// Pods labelled microservice=true with the annotations trafficHosts and publicPaths
// (entries separated by commas or spaces, paths as PORT:PATH) are routed
// directly: every path on every host, Prefix semantics, upstream = pod IP:PORT. They are
// served by the group in their portico.io/group annotation, or the configured default.
//
// A host belongs to the namespace whose Ingress or pod route named it first (the
// oldest); another namespace's rules for it are refused (HostTaken) unless an
// Ingress or pod route of the owner that names the host lists that namespace in
// portico.io/host-delegates ("*": every namespace). The catch-all host is shared.
//
// An L4 Service port the edges already listen on (Options.ReservedPorts, the
// group's HTTP and HTTPS ports) is refused (PortReserved), and so is a Service
// its group's edges cannot hold beside the older ones (GroupFull: model's
// MaxGroup* and MaxVRRPAddrs* limits), newest first.
package controlplane
