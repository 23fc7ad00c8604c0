package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// IngressClaimResource is the IngressClaim resource.
var IngressClaimResource = GroupVersion.WithResource("ingressclaims")

// LabelClaim names the IngressClaim a group Service or DaemonSet was made for.
const LabelClaim = "portico.io/claim"

// ReclaimPolicy says what happens to a claim once every Ingress it lists is gone.
// +kubebuilder:validation:Enum=Retain;Delete
type ReclaimPolicy string

const (
	ReclaimRetain ReclaimPolicy = "Retain"
	ReclaimDelete ReclaimPolicy = "Delete"
)

// Claim phases.
const (
	ClaimPending  = "Pending"
	ClaimBound    = "Bound"
	ClaimReleased = "Released"
)

// IngressClaim asks for a Portico group on demand. The control plane's leader
// creates the group Service and an agent DaemonSet (both owned by the claim),
// binds the listed Ingresses to the group, reports the VIP in status, and applies
// the reclaim policy once every listed Ingress is gone: Retain keeps everything
// (phase Released), Delete removes the DaemonSet, the Service and the claim.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=iclaim
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Group",type=string,JSONPath=`.status.group`
// +kubebuilder:printcolumn:name="VIPs",type=string,JSONPath=`.status.vips`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.status.replicas`
// +kubebuilder:printcolumn:name="Reclaim",type=string,JSONPath=`.spec.reclaimPolicy`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type IngressClaim struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec IngressClaimSpec `json:"spec"`
	// +optional
	Status IngressClaimStatus `json:"status,omitempty"`
}

// IngressClaimSpec lists the Ingresses and how the group's agents are placed.
type IngressClaimSpec struct {
	// Ingresses in the claim's namespace to bind to the provisioned group.
	Ingresses []IngressReference `json:"ingresses"`
	// Template says how the group's agents are placed.
	// +optional
	Template ReplicaTemplate `json:"template,omitempty"`
	// ReclaimPolicy is what happens once every listed Ingress is gone.
	// +optional
	// +kubebuilder:default=Retain
	ReclaimPolicy ReclaimPolicy `json:"reclaimPolicy,omitempty"`
}

// IngressReference names an Ingress in the claim's namespace.
type IngressReference struct {
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
}

// ReplicaTemplate places the group's agents. Its agents are privileged
// hostNetwork pods, so what they run as and where is the operator's: the
// node selector narrows the operator's (--claim-node-selector, whose labels
// win), and Interface and ServiceAccountName are kept for old claims but never
// used: the operator's interface (--claim-iface) and the manifest's ServiceAccount
// portico-agent run them (Event ClaimTemplateOverridden when they differ).
type ReplicaTemplate struct {
	// NodeSelector is the nodes the agent DaemonSet runs on, within the
	// operator's (the chart's claims.nodeSelector, --claim-node-selector): it
	// narrows them, and where it names a label the operator's selector sets, the
	// operator's value is used (Event ClaimTemplateOverridden).
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// Replicas is the agents the group should have; status.readyReplicas is
	// compared against it.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:default=2
	Replicas int32 `json:"replicas,omitempty"`
	// Interface is not used: the agents' edge interface is the operator's (the
	// chart's claims.iface or iface, --claim-iface); a claim naming another gets
	// Event ClaimTemplateOverridden. Kept so older claims stay valid.
	// +optional
	Interface string `json:"interface,omitempty"`
	// ServiceAccountName is not used: the agents run as ServiceAccount
	// portico-agent in the claim's namespace, which the operator creates with the
	// agent's permissions (deploy/rbac.yaml); a claim naming another gets Event
	// ClaimTemplateOverridden. Kept so older claims stay valid.
	// +optional
	ServiceAccountName string `json:"serviceAccountName,omitempty"`
}

// IngressClaimStatus is what the leader reports back.
type IngressClaimStatus struct {
	// Phase is Pending (no listed Ingress exists yet), Bound, or Released
	// (Retain, every Ingress gone).
	// +optional
	Phase string `json:"phase,omitempty"`
	// Group is the namespace/name of the group Service.
	// +optional
	Group string `json:"group,omitempty"`
	// +optional
	VIPs []string `json:"vips,omitempty"`
	// +optional
	BoundIngresses []string `json:"boundIngresses,omitempty"`
	// Replicas is the template's replicas (default 2): the agents the group should
	// have.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`
	// ReadyReplicas counts the ready agents in the group's EndpointSlices; while
	// it is below Replicas, Message says so ("1/3 replicas ready").
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`
	// Message is what the claim waits for (a VIP, agents), empty when nothing.
	// +optional
	Message string `json:"message,omitempty"`
	// ObservedGeneration is the claim's metadata.generation this status is for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions are Bound (the listed Ingresses are bound to the claim's
	// group) and Ready (bound, with a VIP and every replica ready), for
	// `kubectl wait --for=condition=Ready`.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// The IngressClaim's condition types and reasons.
const (
	ClaimConditionBound = "Bound"
	ClaimConditionReady = "Ready"

	// ClaimReasonBound: Bound is True; Ready is True with it when nothing is
	// waited for.
	ClaimReasonBound = "Bound"
	// ClaimReasonPending: no listed Ingress exists yet.
	ClaimReasonPending = "Pending"
	// ClaimReasonReleased: every listed Ingress is gone and the group is kept
	// (reclaim policy Retain).
	ClaimReasonReleased = "Released"
	// ClaimReasonNotAllowed: claims are not served in the claim's namespace.
	ClaimReasonNotAllowed = "NotAllowed"
	// ClaimReasonNameTaken: a Service of the claim's name exists and is not
	// the claim's.
	ClaimReasonNameTaken = "NameTaken"
	// ClaimReasonWaitingForVIP: bound, and the group has no VIP yet.
	ClaimReasonWaitingForVIP = "WaitingForVIP"
	// ClaimReasonWaitingForReplicas: bound, and fewer agents are ready than
	// the template asks for.
	ClaimReasonWaitingForReplicas = "WaitingForReplicas"
)

// IngressClaimList is a list of IngressClaims.
//
// +kubebuilder:object:root=true
type IngressClaimList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IngressClaim `json:"items"`
}
