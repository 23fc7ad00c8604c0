package controlplane

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/portico-edge/portico/api/agentstatus"
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

// GroupLoad is what a group's edges measured of their work, added up over the
// edges whose status Lease is fresh and carries a measurement
// (agentstatus.Load).
type GroupLoad struct {
	Edges int // edges that reported
	agentstatus.Load
}

// The steps below which two groups' figures count as equal, so that noise in
// the measurements does not decide: nginx CPU per core, then requests/s, bytes/s
// and new connections/s per edge.
const (
	cpuStep      = 0.05
	requestsStep = 50
	bytesStep    = 1 << 20
	newConnStep  = 50
)

// headroomKey orders groups by load, least loaded first: nginx's CPU share of
// the edges' cores, then requests, bytes and new connections per edge, each in
// steps; a group without a measurement comes after every measured one.
func (g GroupLoad) headroomKey() [5]float64 {
	if g.Edges == 0 || g.Cores == 0 {
		return [5]float64{1}
	}
	per := float64(g.Edges)
	step := func(x, s float64) float64 { return math.Floor(x / s) }
	return [5]float64{0,
		step(g.NginxCPU/float64(g.Cores), cpuStep),
		step(g.Requests/per, requestsStep),
		step(g.Bytes/per, bytesStep),
		step(g.NewConnections/per, newConnStep)}
}

func (g GroupLoad) String() string {
	if g.Edges == 0 || g.Cores == 0 {
		return "no load reported"
	}
	per := float64(g.Edges)
	return fmt.Sprintf("nginx CPU %.0f%% of %d cores, %.0f requests/s, %.0f KiB/s and %.0f new connections/s per edge (%d edges)",
		100*g.NginxCPU/float64(g.Cores), g.Cores, g.Requests/per, g.Bytes/per/1024, g.NewConnections/per, g.Edges)
}

// Scheduled is one binding Schedule made, and why.
type Scheduled struct {
	Ingress, Group string
	Reason         string // for the Event
}

// Schedule binds the Ingresses that ask for a group by label selector: each goes,
// oldest first, to the matching group with the most headroom by the load its
// edges report (GroupLoad.headroomKey), then with the fewest bound Ingresses
// (counting the bindings made in the same pass), then by namespace/name. Bound
// Ingresses are never moved. bindings are Build's for the same objects; loads
// are by group ("namespace/name"), and a group missing from it has no
// measurement.
func Schedule(ingresses []*networkingv1.Ingress, bindings Bindings, services []*corev1.Service, loads map[string]GroupLoad) []Scheduled {
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
	var out []Scheduled
	for _, ing := range pending {
		cands := matchingGroups(groups, bindings[key(ing)].Selector)
		if len(cands) == 0 {
			continue // reported by Build
		}
		order := func(x, y *corev1.Service) int {
			kx, ky := loads[key(x)].headroomKey(), loads[key(y)].headroomKey()
			return cmp.Or(slices.Compare(kx[:], ky[:]), cmp.Compare(bound[key(x)], bound[key(y)]), cmp.Compare(key(x), key(y)))
		}
		slices.SortFunc(cands, order)
		best := cands[0]
		out = append(out, Scheduled{Ingress: key(ing), Group: key(best), Reason: scheduleReason(cands, loads, bound)})
		bound[key(best)]++
	}
	return out
}

// scheduleReason says why the first of the ordered candidates won.
func scheduleReason(cands []*corev1.Service, loads map[string]GroupLoad, bound map[string]int) string {
	best := cands[0]
	lb := loads[key(best)]
	msg := fmt.Sprintf("bound to group %s: ", key(best))
	if len(cands) == 1 {
		return msg + "the only group that matches (" + lb.String() + ")"
	}
	next := cands[1]
	ln := loads[key(next)]
	kb, kn := lb.headroomKey(), ln.headroomKey()
	if slices.Equal(kb[:], kn[:]) {
		return msg + fmt.Sprintf("as much headroom as group %s (%s), and the fewest bound Ingresses among the matches (%d against %d)",
			key(next), lb.String(), bound[key(best)], bound[key(next)])
	}
	return msg + fmt.Sprintf("the most headroom among the matches (%s; next, group %s: %s)", lb.String(), key(next), ln.String())
}
