package controlplane

import (
	"cmp"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// matchingGroups lists the groups whose labels match a selector.
func matchingGroups(groups []*corev1.Service, sel labels.Selector) []*corev1.Service {
	var out []*corev1.Service
	for _, g := range groups {
		if sel.Matches(labels.Set(g.Labels)) {
			out = append(out, g)
		}
	}
	return out
}

// Schedule binds the Ingresses that ask for a group by label selector: each goes,
// oldest first, to the matching group with the fewest bound Ingresses (ties by
// namespace/name), counting the bindings made in the same pass. Bound Ingresses are
// never moved. bindings are Build's for the same objects. It returns the new
// bindings by Ingress ("ns/name" -> group).
func Schedule(ingresses []*networkingv1.Ingress, bindings Bindings, services []*corev1.Service) map[string]string {
	groups := sortedGroups(services)
	bound := map[string]int{}
	for _, g := range groups {
		bound[key(g)] = 0
	}
	ings := slices.Clone(ingresses)
	slices.SortFunc(ings, func(x, y *networkingv1.Ingress) int { return older(x, y) })
	var pending []*networkingv1.Ingress
	for _, ing := range ings {
		bd := bindings[key(ing)]
		switch {
		case !bd.Ours || bd.Err != nil:
		case bd.Group != "":
			if _, ok := bound[bd.Group]; ok {
				bound[bd.Group]++
			}
		case bd.Selector != nil:
			pending = append(pending, ing)
		}
	}
	out := map[string]string{}
	for _, ing := range pending {
		cands := matchingGroups(groups, bindings[key(ing)].Selector)
		if len(cands) == 0 {
			continue // reported by Build
		}
		best := slices.MinFunc(cands, func(x, y *corev1.Service) int {
			return cmp.Or(cmp.Compare(bound[key(x)], bound[key(y)]), cmp.Compare(key(x), key(y)))
		})
		out[key(ing)] = key(best)
		bound[key(best)]++
	}
	return out
}
