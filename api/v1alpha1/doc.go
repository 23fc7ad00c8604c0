// Package v1alpha1 is the portico.io/v1alpha1 API an operator writes: the types,
// their deep copies (zz_generated.deepcopy.go) and their CustomResourceDefinitions
// (deploy/helm/portico/crds; FederatedIngress's, for a federation's host cluster
// only, in deploy/federation) are generated from this package by controller-gen
// (make api; make verify fails when they are stale). It imports nothing of
// Portico's: a client reads these objects without linking the data plane.
//
// +kubebuilder:object:generate=true
// +groupName=portico.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is portico.io/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: "portico.io", Version: "v1alpha1"}
