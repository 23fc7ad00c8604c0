package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// VIPPoolResource is the VIPPool resource.
var VIPPoolResource = GroupVersion.WithResource("vippools")

// VIPPool is a set of addresses the operator lets Services take as VIPs, and which
// Services may: an L4 Service (class portico.io/vip) outside the operator's
// namespaces gets a VIP, by its portico.io/vip annotation or by allocation, only
// from a pool that allows it. The nodes' addresses are never handed out, whatever
// a pool lists. Cluster-scoped: only the cluster's operator writes pools.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=vpool,categories=portico
// +kubebuilder:printcolumn:name="Addresses",type=string,JSONPath=`.spec.addresses`
// +kubebuilder:printcolumn:name="Auto-assign",type=boolean,JSONPath=`.spec.autoAssign`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type VIPPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec VIPPoolSpec `json:"spec"`
}

// VIPPoolSpec is what a pool holds and who may use it.
type VIPPoolSpec struct {
	// Addresses are the pool's prefixes, IPv4 or IPv6 ("198.51.100.0/28",
	// "2001:db8:5::/120"); a single address is a /32 or /128. An IPv4 prefix's
	// network and broadcast addresses, and an IPv6 prefix's first address, are
	// never handed out.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=43
	// +kubebuilder:validation:XValidation:rule="self.all(a, isCIDR(a))",message="each address must be a prefix such as 198.51.100.0/28 or 2001:db8::/120"
	// +listType=set
	Addresses []string `json:"addresses"`

	// Exclude lists addresses or prefixes inside Addresses that are never handed
	// out (a router's, a firewall's).
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=43
	// +kubebuilder:validation:XValidation:rule="self.all(a, isCIDR(a) || isIP(a))",message="each exclusion must be an address or a prefix"
	// +listType=set
	Exclude []string `json:"exclude,omitempty"`

	// AutoAssign lets the leader allocate from this pool for Services that name
	// no VIP; false keeps the pool for Services that ask for one of its addresses.
	// +optional
	// +kubebuilder:default=true
	AutoAssign *bool `json:"autoAssign,omitempty"`

	// ServiceAllocation limits the Services that may take this pool's addresses;
	// absent, every namespace's may.
	// +optional
	ServiceAllocation *ServiceAllocation `json:"serviceAllocation,omitempty"`
}

// ServiceAllocation says which Services may take a pool's addresses: a Service
// whose namespace is listed in Namespaces or matches one of NamespaceSelectors
// (when either is given), and that matches one of ServiceSelectors (when given).
type ServiceAllocation struct {
	// Namespaces are namespaces whose Services may use the pool.
	// +optional
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=63
	// +listType=set
	Namespaces []string `json:"namespaces,omitempty"`

	// NamespaceSelectors select namespaces, by their labels, whose Services may
	// use the pool.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	NamespaceSelectors []metav1.LabelSelector `json:"namespaceSelectors,omitempty"`

	// ServiceSelectors select, by their labels, the Services that may use the pool.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	ServiceSelectors []metav1.LabelSelector `json:"serviceSelectors,omitempty"`
}

// VIPPoolList is a list of VIPPools.
//
// +kubebuilder:object:root=true
type VIPPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []VIPPool `json:"items"`
}
