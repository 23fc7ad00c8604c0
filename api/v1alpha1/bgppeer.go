package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BGPPeerResource is the BGPPeer resource.
var BGPPeerResource = GroupVersion.WithResource("bgppeers")

// BFDProfileResource is the BFDProfile resource.
var BFDProfileResource = GroupVersion.WithResource("bfdprofiles")

// BGPPasswordKey is the key of a BGPPeer's passwordSecret that holds the TCP MD5
// password (as MetalLB's).
const BGPPasswordKey = "password"

// Reasons of the Events agents record on BGPPeers.
const (
	// ReasonPeerRefused: the agent does not peer with the router (what is wrong
	// is in the message); the other peers are not affected.
	ReasonPeerRefused = "PeerRefused"
	// ReasonPeerConfigured: the agent's speaker took the peer as it is now.
	ReasonPeerConfigured = "PeerConfigured"
)

// BGPPeer is a router the edges peer with in --announce=bgp mode, as MetalLB's
// BGPPeer, limited to what Portico's speaker honours. Each agent peers with the
// BGPPeers of its own namespace (Portico's, operator-owned) whose nodeSelectors
// match its Node's labels, beside the peers of its --bgp-config file, and follows
// every change live: a new peer is added, a deleted one removed, a changed one
// updated, and the sessions of the others are left alone. The edges' own AS and
// the other speaker-wide settings stay in the file. An agent that cannot use a
// BGPPeer (an unknown BFDProfile, a missing Secret or key, the address of a file
// peer) records an Event on it and keeps its other peers.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,shortName=bgpp,categories=portico
// +kubebuilder:printcolumn:name="Address",type=string,JSONPath=`.spec.address`
// +kubebuilder:printcolumn:name="ASN",type=integer,JSONPath=`.spec.asn`
// +kubebuilder:printcolumn:name="BFD",type=string,JSONPath=`.spec.bfdProfile`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type BGPPeer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec BGPPeerSpec `json:"spec"`
}

// BGPPeerSpec is one router and which edges peer with it.
//
// +kubebuilder:validation:XValidation:rule="!has(self.keepaliveInterval) || has(self.holdTime)",message="keepaliveInterval needs holdTime"
// +kubebuilder:validation:XValidation:rule="!(has(self.ebgpMultiHop) && self.ebgpMultiHop && has(self.bfdProfile))",message="BFD is single hop (RFC 5881): a bfdProfile cannot go with ebgpMultiHop"
type BGPPeerSpec struct {
	// Address is the router's IPv4 or IPv6 address. One address is one peer: a
	// BGPPeer with the address of a --bgp-config peer, or of another BGPPeer
	// selecting the same node, is refused on that node.
	// +kubebuilder:validation:MaxLength=45
	// +kubebuilder:validation:XValidation:rule="isIP(self) && ip.isCanonical(self) && !ip(self).isUnspecified()",message="address must be an IP address in canonical form such as 10.0.0.1 or 2001:db8::1"
	Address string `json:"address"`

	// ASN is the router's autonomous system number (the edges' own is the
	// --bgp-config file's asn; equal: iBGP).
	// +kubebuilder:validation:Format=int64
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4294967295
	// +kubebuilder:validation:XValidation:rule="self != 23456",message="23456 is AS_TRANS (RFC 6793), never a real AS"
	ASN uint32 `json:"asn"`

	// Port is the router's TCP port (default 179).
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port *int32 `json:"port,omitempty"`

	// HoldTime is the BGP hold time proposed to the router, whole seconds from
	// 3s to 65535s (default 9s).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=16
	// +kubebuilder:validation:Pattern=`^([0-9]+h)?([0-9]+m)?([0-9]+s)?$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('3s') && duration(self) <= duration('65535s')",message="holdTime must be whole seconds from 3s to 65535s"
	HoldTime *metav1.Duration `json:"holdTime,omitempty"`

	// KeepaliveInterval is the BGP keepalive interval, whole seconds, at least
	// 1s and below holdTime (default a third of holdTime).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=16
	// +kubebuilder:validation:Pattern=`^([0-9]+h)?([0-9]+m)?([0-9]+s)?$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="keepaliveInterval must be whole seconds, at least 1s"
	KeepaliveInterval *metav1.Duration `json:"keepaliveInterval,omitempty"`

	// EBGPMultiHop lets the router be more than one hop away (TTL 255); without
	// it, eBGP packets go out with TTL 1.
	// +optional
	EBGPMultiHop bool `json:"ebgpMultiHop,omitempty"`

	// NodeSelectors select, by their labels, the nodes whose edges peer with
	// the router: a node matching any of them. Empty: every edge.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	NodeSelectors []metav1.LabelSelector `json:"nodeSelectors,omitempty"`

	// PasswordSecret names a Secret in the BGPPeer's own namespace whose key
	// "password" is the TCP MD5 password (RFC 2385) of the sessions, as MetalLB's
	// (type kubernetes.io/basic-auth suits it). The namespace, if given, must be
	// the BGPPeer's. A change of the password resets the sessions.
	// +optional
	PasswordSecret *corev1.SecretReference `json:"passwordSecret,omitempty"`

	// BFDProfile names a BFDProfile in the BGPPeer's namespace: the sessions
	// then run BFD with its timers, and a BFD failure drops the session at once.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	BFDProfile string `json:"bfdProfile,omitempty"`
}

// BGPPeerList is a list of BGPPeers.
//
// +kubebuilder:object:root=true
type BGPPeerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []BGPPeer `json:"items"`
}

// BFDProfile is a set of BFD timers (RFC 5880, single hop RFC 5881) that BGPPeers
// name, as MetalLB's BFDProfile, limited to what Portico's speaker (GoBGP's BFD)
// honours: no echo mode, no passive mode. A change is taken live, without a
// restart, and applies to each session from its next start: a running BFD
// session keeps its timers (GoBGP could change them only by ending it, which the
// router's BFD would take for a failure and reset the BGP session).
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,shortName=bfdp,categories=portico
// +kubebuilder:printcolumn:name="Transmit",type=integer,JSONPath=`.spec.transmitInterval`
// +kubebuilder:printcolumn:name="Receive",type=integer,JSONPath=`.spec.receiveInterval`
// +kubebuilder:printcolumn:name="Multiplier",type=integer,JSONPath=`.spec.detectMultiplier`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type BFDProfile struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec BFDProfileSpec `json:"spec"`
}

// BFDProfileSpec holds the timers, in milliseconds as MetalLB's.
type BFDProfileSpec struct {
	// TransmitInterval is the desired minimum interval between BFD packets
	// this edge sends, in milliseconds (default 300).
	// +optional
	// +kubebuilder:validation:Minimum=10
	// +kubebuilder:validation:Maximum=60000
	TransmitInterval *uint32 `json:"transmitInterval,omitempty"`

	// ReceiveInterval is the minimum interval between BFD packets this edge
	// can receive, in milliseconds (default 300).
	// +optional
	// +kubebuilder:validation:Minimum=10
	// +kubebuilder:validation:Maximum=60000
	ReceiveInterval *uint32 `json:"receiveInterval,omitempty"`

	// DetectMultiplier is how many intervals without a packet declare the
	// session down (default 3).
	// +optional
	// +kubebuilder:validation:Minimum=2
	// +kubebuilder:validation:Maximum=255
	DetectMultiplier *uint32 `json:"detectMultiplier,omitempty"`
}

// BFDProfileList is a list of BFDProfiles.
//
// +kubebuilder:object:root=true
type BFDProfileList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []BFDProfile `json:"items"`
}
