package federation

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/portico-edge/portico/api/v1alpha1"
)

// Validate reports what makes a FederatedIngress unusable as a whole; a problem of one
// cluster's override is reported by MemberIngress for that cluster only.
func Validate(fi *v1alpha1.FederatedIngress) error {
	if len(fi.Spec.Placement.Clusters) == 0 {
		return fmt.Errorf("spec.placement.clusters: empty")
	}
	seen := map[string]bool{}
	for i, c := range fi.Spec.Placement.Clusters {
		if errs := validation.IsDNS1123Subdomain(c); len(errs) > 0 {
			return fmt.Errorf("spec.placement.clusters[%d]: %q: %s", i, c, errs[0])
		}
		if seen[c] {
			return fmt.Errorf("spec.placement.clusters[%d]: %q listed twice", i, c)
		}
		seen[c] = true
	}
	for i, o := range fi.Spec.Overrides {
		if o.Cluster == "" {
			return fmt.Errorf("spec.overrides[%d].cluster: empty", i)
		}
	}
	switch fi.Spec.Policy.Health {
	case "", v1alpha1.HealthAny, v1alpha1.HealthAll:
	default:
		return fmt.Errorf("spec.policy.health: %q is not Any or All", fi.Spec.Policy.Health)
	}
	pol := fi.Spec.Policy
	if pol.AnycastVIP != "" {
		if _, err := netip.ParseAddr(pol.AnycastVIP); err != nil {
			return fmt.Errorf("spec.policy.anycastVIP: %w", err)
		}
	}
	if pol.OverflowLimitPercent < 0 || pol.OverflowLimitPercent > 90 {
		return fmt.Errorf("spec.policy.overflowLimitPercent: %d: want 1 to 90 (0: the default, 50)", pol.OverflowLimitPercent)
	}
	if pol.DrainGrace != nil && pol.DrainGrace.Duration < 0 {
		return fmt.Errorf("spec.policy.drainGrace: negative")
	}
	sites := map[string]bool{}
	for i, sp := range pol.Sites {
		switch {
		case !seen[sp.Cluster]:
			return fmt.Errorf("spec.policy.sites[%d].cluster: %q is not placed", i, sp.Cluster)
		case sites[sp.Cluster]:
			return fmt.Errorf("spec.policy.sites[%d].cluster: %q listed twice", i, sp.Cluster)
		case sp.Capacity <= 0:
			return fmt.Errorf("spec.policy.sites[%d].capacity: want a positive number of new connections a second", i)
		case !seen[sp.OverflowTo] || sp.OverflowTo == sp.Cluster:
			return fmt.Errorf("spec.policy.sites[%d].overflowTo: %q: want another placed cluster", i, sp.OverflowTo)
		}
		sites[sp.Cluster] = true
	}
	return nil
}

// MemberIngress renders the Ingress that cluster serves: the template, then every
// override for cluster in order, then the controller's label and generation
// annotation. It is a pure function of its inputs, so every sync of the same
// generation writes the same object.
func MemberIngress(fi *v1alpha1.FederatedIngress, cluster string) (*networkingv1.Ingress, error) {
	ing := networkingv1.Ingress{
		TypeMeta: metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "Ingress"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        fi.Name,
			Namespace:   fi.Namespace,
			Labels:      fi.Spec.Template.Metadata.Labels,
			Annotations: fi.Spec.Template.Metadata.Annotations,
		},
		Spec: fi.Spec.Template.Spec,
	}
	doc, err := json.Marshal(ing)
	if err != nil {
		return nil, fmt.Errorf("encode template: %w", err)
	}
	for i, o := range fi.Spec.Overrides {
		if o.Cluster != cluster {
			continue
		}
		if doc, err = jsonpatch.MergePatch(doc, o.Patch); err != nil {
			return nil, fmt.Errorf("spec.overrides[%d]: apply merge patch: %w", i, err)
		}
	}
	// Decode strictly, so an override that misspells a field or gives it the wrong
	// type is an error here, not an Ingress the member silently serves without it.
	var out networkingv1.Ingress
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&out); err != nil {
		return nil, fmt.Errorf("overrides for %s: not an Ingress: %w", cluster, err)
	}
	if out.Name != fi.Name || out.Namespace != fi.Namespace || out.Kind != "Ingress" || out.APIVersion != "networking.k8s.io/v1" {
		return nil, fmt.Errorf("overrides for %s: may not change apiVersion, kind, name or namespace", cluster)
	}
	if out.Labels == nil {
		out.Labels = map[string]string{}
	}
	out.Labels[v1alpha1.LabelFederatedIngress] = fi.Name
	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	out.Annotations[v1alpha1.AnnotationFederationGeneration] = strconv.FormatInt(fi.Generation, 10)
	delete(out.Annotations, v1alpha1.AnnotationFederationHealth)
	if fi.Spec.Policy.Health == v1alpha1.HealthAll {
		out.Annotations[v1alpha1.AnnotationFederationHealth] = string(v1alpha1.HealthAll)
	}
	return &out, nil
}

// applyObject is what a server-side apply of ing sends: the object without the
// fields the controller does not own (status, server-set metadata).
func applyObject(ing *networkingv1.Ingress) (*unstructured.Unstructured, error) {
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ing)
	if err != nil {
		return nil, fmt.Errorf("encode ingress: %w", err)
	}
	delete(obj, "status")
	unstructured.RemoveNestedField(obj, "metadata", "creationTimestamp")
	return &unstructured.Unstructured{Object: obj}, nil
}
