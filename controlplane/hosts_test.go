package controlplane

import (
	"slices"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
)

// A host belongs to the namespace that claimed it first: another namespace
// cannot add a path (or a certificate) to it, by Ingress or pod route, unless
// the owner delegates it; a host nobody owns yet goes to whoever names it
// first, whatever namespace.
func TestBuildHostOwnership(t *testing.T) {
	gs, gsl := g1Objects()
	bind := []string{v1alpha1.AnnotationGroup, "edge/g1"}
	pfx := networkingv1.PathTypePrefix
	shop := ingress("team-a", "shop", 1, "shop.example", []path{{"/", pfx, "web", 80}},
		append(bind, v1alpha1.AnnotationHostDelegates, "team-b")...)
	steal := ingress("evil", "login", 2, "shop.example", []path{{"/login", pfx, "web", 80}}, bind...)
	steal.Spec.TLS = []networkingv1.IngressTLS{{Hosts: []string{"shop.example"}, SecretName: "fake"}}
	api := ingress("team-b", "api", 3, "shop.example", []path{{"/api", pfx, "web", 80}}, bind...)
	// evil's own host, and a second rule of its Ingress that names one of team-a's.
	own := ingress("evil", "own", 4, "evil.example", []path{{"/", pfx, "web", 80}}, bind...)
	own.Spec.Rules = append(own.Spec.Rules, networkingv1.IngressRule{Host: "Shop.Example",
		IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{Paths: []networkingv1.HTTPIngressPath{
			{Path: "/admin", PathType: &pfx, Backend: backend("web", 80)}}}}})
	// Newer than evil's claim of evil.example: team-a does not get it.
	late := ingress("team-a", "late", 5, "evil.example", []path{{"/a", pfx, "web", 80}}, bind...)
	st := state(gs, gsl, shop, steal, api, own, late, tlsSecret("evil", "fake"),
		backendSvc("team-a", "web", sport("", 80)), backendSvc("team-b", "web", sport("", 80)), backendSvc("evil", "web", sport("", 80)),
		microservice("evil", "pod", 6, "10.9.0.1", "shop.example evil.example", "80:/pod", bind...))
	snap, _, problems := Build(st, Options{})
	if err := snap.Validate(); err != nil {
		t.Fatal(err)
	}
	routes := map[string][]string{}
	for _, s := range snap.Servers {
		for _, l := range s.Locations {
			routes[s.Host] = append(routes[s.Host], l.Path+" "+l.Source)
		}
		if s.Host == "shop.example" && s.TLSCertificate != "" {
			t.Errorf("shop.example has evil's certificate %s", s.TLSCertificate)
		}
	}
	if want := []string{"/ team-a/shop", "/api team-b/api"}; !slices.Equal(routes["shop.example"], want) {
		t.Errorf("shop.example routes %v, want %v (team-a's, and team-b's by delegation)", routes["shop.example"], want)
	}
	if want := []string{"/ evil/own", "/pod evil/pod"}; !slices.Equal(routes["evil.example"], want) {
		t.Errorf("evil.example routes %v, want %v", routes["evil.example"], want)
	}
	var taken []string
	for _, p := range problems {
		if p.Reason == model.ReasonHostTaken {
			taken = append(taken, p.Object+" "+p.Field)
		}
	}
	want := []string{
		"Ingress evil/login spec.rules[0].host", "Ingress evil/own spec.rules[1].host",
		"Ingress team-a/late spec.rules[0].host", "Pod evil/pod metadata.annotations[trafficHosts]",
	}
	slices.Sort(taken)
	if !slices.Equal(taken, want) {
		t.Errorf("refused %v, want %v", taken, want)
	}
}

// A Service labelled portico.io/group=true outside the operator's namespaces
// is not a group: no Ingress binds to it, by selector or annotation, and it is
// reported; the operator's group keeps its Ingresses.
func TestGroupsOnlyInTheOperatorsNamespaces(t *testing.T) {
	gs, gsl := g1Objects() // edge/g1
	fake := groupSvc("tenant", "g2", 0, v1alpha1.AnnotationVIP, "198.51.100.9")
	fake.Labels["tier"] = "public"
	gs[0].Labels["tier"] = "public"
	pfx := networkingv1.PathTypePrefix
	victim := ingress("team-a", "shop", 1, "shop.example", []path{{"/", pfx, "web", 80}}, v1alpha1.AnnotationGroupSelector, "tier=public")
	bound := ingress("team-a", "bound", 2, "bound.example", []path{{"/", pfx, "web", 80}}, v1alpha1.AnnotationGroup, "tenant/g2")
	st, notAllowed := allowedGroups(state(gs, gsl, fake, victim, bound, backendSvc("team-a", "web", sport("", 80))), []string{"edge"})
	if len(notAllowed) != 1 || notAllowed[0].Reason != model.ReasonGroupNotAllowed || notAllowed[0].Object != "Service tenant/g2" {
		t.Errorf("problems %v, want one GroupNotAllowed on tenant/g2", notAllowed)
	}
	if !IsGroup(fake) {
		t.Error("allowedGroups changed the informer's object")
	}
	snap, bindings, problems := Build(st, Options{})
	if len(snap.Groups) != 1 || snap.Groups[0].Name != "edge/g1" {
		t.Errorf("groups %v, want edge/g1 alone", snap.Groups)
	}
	if g := bindings["team-a/bound"].Group; g != "tenant/g2" || !slices.ContainsFunc(problems, func(p model.Problem) bool {
		return p.Object == "Ingress team-a/bound" && p.Reason == model.ReasonGroupNotFound
	}) {
		t.Errorf("the Ingress bound to tenant/g2 by annotation: binding %q, problems %v; want it reported, not served", g, problems)
	}
	if got := matchingGroups(sortedGroups(st.Services), bindings["team-a/shop"].Selector); len(got) != 1 || key(got[0]) != "edge/g1" {
		t.Errorf("groups matching the selector: %d, want edge/g1 alone", len(got))
	}
}
