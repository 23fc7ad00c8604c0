package v1alpha1

import (
	"encoding/json"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FederatedIngressResource is the FederatedIngress resource.
var FederatedIngressResource = GroupVersion.WithResource("federatedingresses")

// FederatedIngress is one Ingress for many clusters. It lives in a federation's
// host cluster only, beside `portico federation` (its controller), which renders
// spec.template, with the overrides for each cluster (RFC 7386 JSON merge
// patches), into an Ingress of the same namespace and name in every cluster
// spec.placement lists, and reports what each site serves in status.sites.
// Member clusters are Secrets labelled portico.io/member-cluster in the
// controller's namespace, holding a kubeconfig under the key "kubeconfig".
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=fing
// +kubebuilder:printcolumn:name="Clusters",type=string,JSONPath=`.spec.placement.clusters`
// +kubebuilder:printcolumn:name="Propagated",type=integer,JSONPath=`.status.propagated`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.ready`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type FederatedIngress struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec FederatedIngressSpec `json:"spec"`
	// +optional
	Status FederatedIngressStatus `json:"status,omitempty"`
}

// FederatedIngressSpec is the Ingress to propagate, where, and how it differs per
// cluster.
type FederatedIngressSpec struct {
	// Template is the Ingress each member serves, before overrides.
	Template IngressTemplate `json:"template"`
	// Placement names the member clusters that serve the Ingress.
	Placement Placement `json:"placement"`
	// Overrides change the Ingress for one cluster each, in order.
	// +optional
	Overrides []ClusterOverride `json:"overrides,omitempty"`
	// Policy is how each site judges itself for this Ingress (it travels with
	// the member's Ingress).
	// +optional
	Policy FederationPolicy `json:"policy,omitempty"`
}

// HealthPolicy says when a site counts as able to serve the Ingress.
// +kubebuilder:validation:Enum=Any;All
type HealthPolicy string

const (
	// HealthAny (the default): a backend Service the Ingress names has a ready
	// endpoint in the site.
	HealthAny HealthPolicy = "Any"
	// HealthAll: every backend Service the Ingress names has one (a site that
	// can serve only part of the paths gives the clients to another site).
	HealthAll HealthPolicy = "All"
)

// FederationPolicy is how the sites judge themselves for this Ingress. It travels
// with the member's Ingress (annotation portico.io/federation-health), so each
// site decides alone (fail-static).
type FederationPolicy struct {
	// Health is Any (the default: a site serves the Ingress while a backend
	// Service it names has a ready endpoint there) or All (while every one has).
	// +optional
	Health HealthPolicy `json:"health,omitempty"`
	// AnycastVIP is the address every placed site must serve the Ingress on
	// (each site's group VIP, portico.io/vip on its group Service): a site whose
	// Ingress status lists another is reported in its status.
	// +optional
	AnycastVIP string `json:"anycastVIP,omitempty"`
	// Sites are per-site capacities: above its capacity a site spills new
	// connections to the site OverflowTo names (api/sites File.Overflow). They are
	// the site's (its edges serve every federated Ingress of the group): when
	// several FederatedIngresses set one site's, the first by namespace/name
	// counts; a member Secret's portico.io/capacity annotations count only where
	// none does.
	// +optional
	Sites []SitePolicy `json:"sites,omitempty"`
	// OverflowLimitPercent is the most of a site's new connections that spill
	// (default 50, at most 90).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=90
	OverflowLimitPercent int32 `json:"overflowLimitPercent,omitempty"`
	// DrainGrace is how long a draining site stays de-preferenced before it
	// withdraws the VIPs (default: until the drain ends). Its connections go on
	// either way: the other sites send them to it through tunnels.
	// +optional
	DrainGrace *metav1.Duration `json:"drainGrace,omitempty"`
}

// SitePolicy is one site's capacity and where it overflows.
type SitePolicy struct {
	// Cluster is the site's member cluster.
	Cluster string `json:"cluster"`
	// Capacity is in new connections a second, for the whole site.
	// +kubebuilder:validation:Minimum=1
	Capacity int32 `json:"capacity"`
	// OverflowTo is the member cluster the site spills new connections to above
	// its capacity.
	OverflowTo string `json:"overflowTo"`
}

// IngressTemplate is the member Ingress before overrides: its labels, annotations
// and spec.
type IngressTemplate struct {
	// +optional
	Metadata IngressTemplateMeta `json:"metadata,omitempty"`
	// Spec is a networking.k8s.io/v1 IngressSpec (validated by each member's API
	// server).
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:validation:Type=object
	// +kubebuilder:pruning:PreserveUnknownFields
	Spec networkingv1.IngressSpec `json:"spec"`
}

// IngressTemplateMeta is the part of the Ingress metadata a template sets.
type IngressTemplateMeta struct {
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Placement names the member clusters that serve the Ingress.
type Placement struct {
	// Clusters are the member clusters that serve the Ingress (the names of
	// member Secrets).
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:items:MinLength=1
	Clusters []string `json:"clusters"`
}

// ClusterOverride changes the Ingress for one cluster.
type ClusterOverride struct {
	// Cluster is the member cluster the patch is for.
	// +kubebuilder:validation:MinLength=1
	Cluster string `json:"cluster"`
	// Patch is an RFC 7386 JSON merge patch on the rendered Ingress object
	// (metadata.labels, metadata.annotations and spec; null deletes a key).
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:validation:Type=object
	// +kubebuilder:pruning:PreserveUnknownFields
	Patch json.RawMessage `json:"patch"`
}

// FederatedIngressStatus is per site, sorted by cluster.
type FederatedIngressStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	Sites []SiteStatus `json:"sites,omitempty"`
	// Propagated counts the placed sites holding the current generation's Ingress;
	// Ready those of them with a ready backend and an edge whose nginx serves it (for
	// kubectl get).
	// +optional
	Propagated int32 `json:"propagated"`
	// +optional
	Ready int32 `json:"ready"`
	// Conditions are Propagated (every placed site holds the current
	// generation's Ingress) and Ready (every placed site also has a ready
	// backend and an edge whose nginx serves it), each with the current
	// generation as observedGeneration.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// The FederatedIngress's condition types and reasons.
const (
	FederatedConditionPropagated = "Propagated"
	FederatedConditionReady      = "Ready"

	// FederatedReasonAllSites: every placed site (for Propagated: holds the
	// Ingress; for Ready: also serves it).
	FederatedReasonAllSites = "AllSites"
	// FederatedReasonSitesBehind: some placed sites do not (the message says
	// how many and which).
	FederatedReasonSitesBehind = "SitesBehind"
	// FederatedReasonInvalid: the FederatedIngress does not validate; nothing
	// was changed on the members.
	FederatedReasonInvalid = "Invalid"
	// FederatedReasonNoPlacement: the placement names no cluster.
	FederatedReasonNoPlacement = "NoPlacement"
)

// What a site's edges do with its group's VIPs (SiteStatus.Announce), from their
// own reports.
const (
	// SiteAnnounced: an edge of the site announces the group's VIPs as is (BGP)
	// or owns them (VRRP master).
	SiteAnnounced = "Announced"
	// SiteDepreferenced: the site's edges still announce, but de-preferenced
	// (drained, unhealthy or stopping), so routers prefer other sites' routes.
	SiteDepreferenced = "Depreferenced"
	// SiteWithdrawn: no edge of the site announces.
	SiteWithdrawn = "Withdrawn"
	// SiteDraining: the site drains (portico.io/drain on its member Secret) and
	// its edges are de-preferenced.
	SiteDraining = "Draining"
)

// SiteStatus is what one member cluster reports.
type SiteStatus struct {
	// +optional
	Cluster string `json:"cluster"`
	// PropagatedGeneration is the FederatedIngress generation the member's Ingress holds.
	// +optional
	PropagatedGeneration int64 `json:"propagatedGeneration,omitempty"`
	// Addresses are the member Ingress's status.loadBalancer addresses (its VIPs).
	// +optional
	Addresses []string `json:"addresses,omitempty"`
	// ReadyBackends counts the ready endpoints of the Services the Ingress names, in
	// that cluster; Backends all of them.
	// +optional
	ReadyBackends int32 `json:"readyBackends"`
	// +optional
	Backends int32 `json:"backends"`
	// Edges counts the site's edges whose group serves the Ingress (from their status
	// Leases, renewed); EdgesServing those whose nginx serves its current generation.
	// +optional
	Edges int32 `json:"edges"`
	// +optional
	EdgesServing int32 `json:"edgesServing"`
	// Announce is what those edges do with the group's VIPs: Announced,
	// Depreferenced (Draining when the site drains, portico.io/drain) or
	// Withdrawn.
	// +optional
	Announce string `json:"announce,omitempty"`
	// AnnounceChanged is when Announce last changed (a failover, a return).
	// +optional
	AnnounceChanged *metav1.Time `json:"announceChanged,omitempty"`
	// Overflow is the share of the site's new connections its edges spill to
	// another site above its capacity, in percent (their mean).
	// +optional
	Overflow int32 `json:"overflow,omitempty"`
	// Error says why the site is not propagated (unreachable, rejected, bad override).
	// +optional
	Error string `json:"error,omitempty"`
}

// FederatedIngressList is a list of FederatedIngresses.
//
// +kubebuilder:object:root=true
type FederatedIngressList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []FederatedIngress `json:"items"`
}
