package controlplane

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
)

// TestBuildBindings: Build returns the binding of every Ingress it read, Portico's or
// not, as the scheduler and the Ingress status use it.
func TestBuildBindings(t *testing.T) {
	gs, gsl := g1Objects()
	ours := &networkingv1.IngressClass{ObjectMeta: meta("", "portico", 0, v1alpha1.AnnotationGroup, "edge/g1"),
		Spec: networkingv1.IngressClassSpec{Controller: v1alpha1.ControllerName}}
	theirs := &networkingv1.IngressClass{ObjectMeta: meta("", "other", 0), Spec: networkingv1.IngressClassSpec{Controller: "example.com/other"}}
	byClass := func(name, class string) *networkingv1.Ingress {
		i := ingress("app", name, 0, "", nil)
		i.Spec.IngressClassName = ptr(class)
		return i
	}
	st := state(gs, gsl, ours, theirs,
		ingress("app", "annotated", 0, "", nil, v1alpha1.AnnotationGroup, "g1"),
		ingress("app", "selector", 0, "", nil, v1alpha1.AnnotationGroupSelector, "tier=edge"),
		ingress("app", "empty", 0, "", nil, v1alpha1.AnnotationGroup, " "),
		byClass("by-class", "portico"), byClass("foreign", "other"))

	_, got, _ := Build(st, Options{})

	type view struct {
		Ours, Err              bool
		Group, Selector, Field string
	}
	views := map[string]view{}
	for k, b := range got {
		v := view{Ours: b.Ours, Err: b.Err != nil, Group: b.Group, Field: b.Field}
		if b.Selector != nil {
			v.Selector = b.Selector.String()
		}
		views[k] = v
	}
	want := map[string]view{
		"app/annotated": {Ours: true, Group: "app/g1"},
		"app/selector":  {Ours: true, Selector: "tier=edge"},
		"app/empty":     {Ours: true, Err: true, Field: "metadata.annotations[" + v1alpha1.AnnotationGroup + "]"},
		"app/by-class":  {Ours: true, Group: "edge/g1"},
		"app/foreign":   {},
	}
	if diff := cmp.Diff(want, views); diff != "" {
		t.Errorf("bindings (-want +got):\n%s", diff)
	}
}

// TestBuildIngressGenerations: each group lists the generation of every Ingress
// bound to it (what agents report once their nginx serves it), and only those.
func TestBuildIngressGenerations(t *testing.T) {
	gs, gsl := g1Objects()
	ws, wsl := webObjects()
	pfx := networkingv1.PathTypePrefix
	a := ingress("app", "a", 1, "a.example", []path{{"/", pfx, "web", 80}}, v1alpha1.AnnotationGroup, "edge/g1")
	a.Generation = 7
	b := ingress("app", "b", 2, "b.example", []path{{"/", pfx, "web", 80}}, v1alpha1.AnnotationGroup, "edge/g1")
	b.Generation = 2
	other := ingress("app", "other", 3, "c.example", []path{{"/", pfx, "web", 80}})
	other.Generation = 4
	other.Spec.IngressClassName = ptr("not-portico")
	snap, _, _ := Build(state(gs, gsl, ws, wsl, a, b, other), Options{})
	if len(snap.Groups) != 1 {
		t.Fatalf("groups %+v, want one", snap.Groups)
	}
	want := map[string]int64{"app/a": 7, "app/b": 2}
	if diff := cmp.Diff(want, snap.Groups[0].Ingresses); diff != "" {
		t.Errorf("group %s's Ingresses (-want +got):\n%s", snap.Groups[0].Name, diff)
	}
}

// TestBuildFederated: a federated Ingress (labelled by the federation controller)
// counts as ready in its group when a backend it names has a ready endpoint here,
// whichever rule or the default backend names it, and another Ingress naming the
// same Service port does not change that; Ingresses not federated are not listed.
func TestBuildFederated(t *testing.T) {
	gs, gsl := g1Objects()
	ws, wsl := webObjects()
	empty := backendSvc("app", "empty", sport("http", 80))
	emptySlice := slice("app", "empty", "empty-1", "http", 8080, ep{addr: "10.3.0.1", ready: false})
	pfx := networkingv1.PathTypePrefix
	fed := func(ing *networkingv1.Ingress) *networkingv1.Ingress {
		ing.Labels = map[string]string{v1alpha1.LabelFederatedIngress: ing.Name}
		return ing
	}
	shop := fed(ingress("app", "shop", 1, "shop.example", []path{{"/", pfx, "empty", 80}, {"/api", pfx, "web", 80}}, v1alpha1.AnnotationGroup, "edge/g1"))
	blog := fed(ingress("app", "blog", 2, "blog.example", []path{{"/", pfx, "empty", 80}}, v1alpha1.AnnotationGroup, "edge/g1"))
	wiki := fed(ingress("app", "wiki", 3, "", nil, v1alpha1.AnnotationGroup, "edge/g1"))
	wiki.Spec.DefaultBackend = ptr(backend("web", 80))
	plain := ingress("app", "plain", 4, "plain.example", []path{{"/", pfx, "web", 80}}, v1alpha1.AnnotationGroup, "edge/g1")
	// With the All policy every backend Service named must have a ready endpoint.
	shopAll := fed(ingress("app", "shop-all", 5, "shop-all.example", []path{{"/", pfx, "empty", 80}, {"/api", pfx, "web", 80}},
		v1alpha1.AnnotationGroup, "edge/g1", v1alpha1.AnnotationFederationHealth, "All"))
	webAll := fed(ingress("app", "web-all", 6, "web-all.example", []path{{"/", pfx, "web", 80}, {"/x", pfx, "web", 80}},
		v1alpha1.AnnotationGroup, "edge/g1", v1alpha1.AnnotationFederationHealth, "All"))
	bad := fed(ingress("app", "bad", 7, "bad.example", []path{{"/", pfx, "web", 80}}, v1alpha1.AnnotationGroup, "edge/g1", v1alpha1.AnnotationFederationHealth, "Most"))
	snap, _, problems := Build(state(gs, gsl, ws, wsl, empty, emptySlice, shop, blog, wiki, plain, shopAll, webAll, bad), Options{})
	if len(snap.Groups) != 1 {
		t.Fatalf("groups %+v (problems %v), want one", snap.Groups, problems)
	}
	reported := false
	for _, p := range problems {
		reported = reported || (p.Object == "Ingress app/bad" && p.Reason == model.ReasonInvalidAnnotation)
	}
	if !reported {
		t.Errorf("an unknown health policy is not reported: %v", problems)
	}
	want := map[string]bool{"app/shop": true, "app/blog": false, "app/wiki": true, "app/shop-all": false, "app/web-all": true, "app/bad": true}
	if diff := cmp.Diff(want, snap.Groups[0].Federated); diff != "" {
		t.Errorf("group %s's federated Ingresses (-want +got):\n%s", snap.Groups[0].Name, diff)
	}
	snap, _, _ = Build(state(gs, gsl, ws, wsl, plain), Options{})
	if snap.Groups[0].Federated != nil {
		t.Errorf("no federated Ingress, Federated = %v", snap.Groups[0].Federated)
	}
}
