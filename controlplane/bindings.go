package controlplane

import (
	"fmt"
	"slices"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
)

// groupRef resolves a group reference ("name" relative to ns, or "ns/name").
func groupRef(ref, ns string) string {
	ref = strings.TrimSpace(ref)
	if strings.Contains(ref, "/") {
		return ref
	}
	return ns + "/" + ref
}

// Binding is how an Ingress is tied to a group.
type Binding struct {
	// Ours is false for Ingresses of other controllers: Portico leaves them alone.
	Ours bool
	// Group is the bound group ("ns/name"), "" while unbound.
	Group string
	// Selector is set when the Ingress asks the scheduler for a group.
	Selector labels.Selector
	// Field and Err describe a binding that could not be read.
	Field string
	Err   error
}

// Bindings are the bindings of a build's Ingresses (every one, Portico's or not) by
// "namespace/name". Build derives them once per sync; scheduling and the Ingress
// status use them.
type Bindings map[string]Binding

// isPorticoClass reports whether an IngressClass is served by Portico.
func isPorticoClass(c *networkingv1.IngressClass) bool {
	return c != nil && c.Spec.Controller == v1alpha1.ControllerName
}

// defaultClass returns the default Portico IngressClass, if any.
func defaultClass(classes map[string]*networkingv1.IngressClass) *networkingv1.IngressClass {
	var names []string
	for n, c := range classes {
		if isPorticoClass(c) && c.Annotations[annotationDefaultClass] == "true" {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return nil
	}
	slices.Sort(names)
	return classes[names[0]]
}

// bindingOf resolves an Ingress's binding (see the package documentation for the order).
func bindingOf(ing *networkingv1.Ingress, classes map[string]*networkingv1.IngressClass) Binding {
	var class *networkingv1.IngressClass
	className := ""
	switch {
	case ing.Spec.IngressClassName != nil:
		className = *ing.Spec.IngressClassName
	case ing.Annotations[annotationIngressClass] != "":
		className = ing.Annotations[annotationIngressClass]
	}
	if className != "" {
		class = classes[className]
	} else {
		class = defaultClass(classes)
	}
	if g, ok := ing.Annotations[v1alpha1.AnnotationGroup]; ok {
		// An explicit or recorded binding wins, unless the Ingress names another
		// controller's class.
		if class != nil && !isPorticoClass(class) {
			return Binding{}
		}
		if strings.TrimSpace(g) == "" {
			return Binding{Ours: true, Field: "metadata.annotations[" + v1alpha1.AnnotationGroup + "]", Err: fmt.Errorf("empty group")}
		}
		return Binding{Ours: true, Group: groupRef(g, ing.Namespace)}
	}
	if sel, ok := ing.Annotations[v1alpha1.AnnotationGroupSelector]; ok && (class == nil || isPorticoClass(class)) {
		return selectorBinding(sel, "metadata.annotations["+v1alpha1.AnnotationGroupSelector+"]")
	}
	if !isPorticoClass(class) {
		return Binding{}
	}
	if p := class.Spec.Parameters; p != nil && p.Kind == "Service" && (p.APIGroup == nil || *p.APIGroup == "") {
		ns := ""
		if p.Namespace != nil {
			ns = *p.Namespace
		}
		if ns == "" {
			return Binding{Ours: true, Field: "IngressClass " + class.Name + " spec.parameters.namespace", Err: fmt.Errorf("a Service parameter needs a namespace")}
		}
		return Binding{Ours: true, Group: ns + "/" + p.Name}
	}
	if g := class.Annotations[v1alpha1.AnnotationGroup]; g != "" {
		if !strings.Contains(g, "/") {
			return Binding{Ours: true, Field: "IngressClass " + class.Name + " metadata.annotations[" + v1alpha1.AnnotationGroup + "]", Err: fmt.Errorf("%q is not namespace/name", g)}
		}
		return Binding{Ours: true, Group: g}
	}
	if sel, ok := class.Annotations[v1alpha1.AnnotationGroupSelector]; ok {
		return selectorBinding(sel, "IngressClass "+class.Name+" metadata.annotations["+v1alpha1.AnnotationGroupSelector+"]")
	}
	return Binding{Ours: true, Field: "IngressClass " + class.Name, Err: fmt.Errorf("the class names no group: set spec.parameters (kind Service) or the %s annotation", v1alpha1.AnnotationGroup)}
}

func selectorBinding(sel, field string) Binding {
	s, err := labels.Parse(sel)
	if err != nil {
		return Binding{Ours: true, Field: field, Err: fmt.Errorf("bad label selector: %w", err)}
	}
	return Binding{Ours: true, Selector: s}
}

// boundIngresses resolves the binding of every Ingress into b.bindings and lists the
// Ingresses bound to an existing group, oldest first, reporting the ones whose
// binding is broken.
func (b *builder) boundIngresses() []*networkingv1.Ingress {
	ings := slices.Clone(b.st.Ingresses)
	slices.SortFunc(ings, func(x, y *networkingv1.Ingress) int { return older(x, y) })
	var out []*networkingv1.Ingress
	for _, ing := range ings {
		bd := bindingOf(ing, b.classes)
		b.bindings[key(ing)] = bd
		switch {
		case !bd.Ours:
		case bd.Err != nil:
			b.problem("Ingress", ing, bd.Field, model.ReasonInvalidAnnotation, "%v", bd.Err)
		case bd.Group == "":
			// Waiting for the scheduler, which needs a matching group.
			if len(matchingGroups(b.groupList, bd.Selector)) == 0 {
				b.problem("Ingress", ing, "metadata.annotations["+v1alpha1.AnnotationGroupSelector+"]", model.ReasonNoMatchingGroup,
					"no group matches selector %q", bd.Selector.String())
			}
		case b.groupsOut[bd.Group] == nil:
			b.problem("Ingress", ing, "metadata.annotations["+v1alpha1.AnnotationGroup+"]", model.ReasonGroupNotFound,
				"group %s does not exist (bindings are sticky: recreate it or rebind by hand)", bd.Group)
		default:
			out = append(out, ing)
		}
	}
	return out
}
