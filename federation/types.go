package federation

import (
	"encoding/json"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Resource is the FederatedIngress CRD (deploy/federation/federatedingresses.portico.io.yaml).
var Resource = schema.GroupVersionResource{Group: "portico.io", Version: "v1alpha1", Resource: "federatedingresses"}

// FederatedIngress is one Ingress for many clusters.
type FederatedIngress struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              Spec   `json:"spec"`
	Status            Status `json:"status,omitempty"`
}

// Spec is the Ingress to propagate, where, and how it differs per cluster.
type Spec struct {
	Template  Template   `json:"template"`
	Placement Placement  `json:"placement"`
	Overrides []Override `json:"overrides,omitempty"`
	Policy    Policy     `json:"policy,omitempty"`
}

// HealthPolicy says when a site counts as able to serve the Ingress.
type HealthPolicy string

const (
	// HealthAny (the default): a backend Service the Ingress names has a ready
	// endpoint in the site.
	HealthAny HealthPolicy = "Any"
	// HealthAll: every backend Service the Ingress names has one (a site that
	// can serve only part of the paths gives the clients to another site).
	HealthAll HealthPolicy = "All"
)

// Policy is how the sites judge themselves for this Ingress. It travels with the
// member's Ingress (annotation portico.io/federation-health), so each site decides
// alone (fail-static).
type Policy struct {
	Health HealthPolicy `json:"health,omitempty"`
	// AnycastVIP is the address every placed site must serve the Ingress on
	// (each site's group VIP, portico.io/vip on its group Service): a site whose
	// Ingress status lists another is reported in its status.
	AnycastVIP string `json:"anycastVIP,omitempty"`
	// Sites are per-site capacities: above its capacity a site spills new
	// connections to the site OverflowTo names (api/sites File.Overflow). They are
	// the site's (its edges serve every federated Ingress of the group): when
	// several FederatedIngresses set one site's, the first by namespace/name
	// counts; a member Secret's portico.io/capacity annotations count only where
	// none does.
	Sites []SitePolicy `json:"sites,omitempty"`
	// OverflowLimitPercent is the most of a site's new connections that spill
	// (default 50, at most 90).
	OverflowLimitPercent int32 `json:"overflowLimitPercent,omitempty"`
	// DrainGrace is how long a draining site stays de-preferenced before it
	// withdraws the VIPs (default: until the drain ends). Its connections go on
	// either way: the other sites send them to it through tunnels.
	DrainGrace *metav1.Duration `json:"drainGrace,omitempty"`
}

// SitePolicy is one site's capacity and where it overflows.
type SitePolicy struct {
	Cluster string `json:"cluster"`
	// Capacity is in new connections a second, for the whole site.
	Capacity   int32  `json:"capacity"`
	OverflowTo string `json:"overflowTo"`
}

// Template is the member Ingress before overrides: its labels, annotations and spec.
type Template struct {
	Metadata TemplateMeta             `json:"metadata,omitempty"`
	Spec     networkingv1.IngressSpec `json:"spec"`
}

// TemplateMeta is the part of the Ingress metadata a template sets.
type TemplateMeta struct {
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Placement names the member clusters that serve the Ingress.
type Placement struct {
	Clusters []string `json:"clusters"`
}

// Override changes the Ingress for one cluster.
type Override struct {
	Cluster string `json:"cluster"`
	// Patch is an RFC 7386 JSON merge patch on the rendered Ingress object
	// (metadata.labels, metadata.annotations and spec; null deletes a key).
	Patch json.RawMessage `json:"patch"`
}

// Status is per site, sorted by cluster.
type Status struct {
	ObservedGeneration int64        `json:"observedGeneration,omitempty"`
	Sites              []SiteStatus `json:"sites,omitempty"`
	// Propagated counts the placed sites holding the current generation's Ingress;
	// Ready those of them with a ready backend and an edge whose nginx serves it (for
	// kubectl get).
	Propagated int32 `json:"propagated"`
	Ready      int32 `json:"ready"`
}

// SiteStatus is what one member cluster reports.
type SiteStatus struct {
	Cluster string `json:"cluster"`
	// PropagatedGeneration is the FederatedIngress generation the member's Ingress holds.
	PropagatedGeneration int64 `json:"propagatedGeneration,omitempty"`
	// Addresses are the member Ingress's status.loadBalancer addresses (its VIPs).
	Addresses []string `json:"addresses,omitempty"`
	// ReadyBackends counts the ready endpoints of the Services the Ingress names, in
	// that cluster; Backends all of them.
	ReadyBackends int32 `json:"readyBackends"`
	Backends      int32 `json:"backends"`
	// Edges counts the site's edges whose group serves the Ingress (from their status
	// Leases, renewed); EdgesServing those whose nginx serves its current generation.
	Edges        int32 `json:"edges"`
	EdgesServing int32 `json:"edgesServing"`
	// Announce is what those edges do with the group's VIPs: Announced,
	// Depreferenced (Draining when the site drains, portico.io/drain) or
	// Withdrawn.
	Announce string `json:"announce,omitempty"`
	// AnnounceChanged is when Announce last changed (a failover, a return).
	AnnounceChanged *metav1.Time `json:"announceChanged,omitempty"`
	// Overflow is the share of the site's new connections its edges spill to
	// another site above its capacity, in percent (their mean).
	Overflow int32 `json:"overflow,omitempty"`
	// Error says why the site is not propagated (unreachable, rejected, bad override).
	Error string `json:"error,omitempty"`
}
