package federation

import (
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/labels"
	coordinationlisters "k8s.io/client-go/listers/coordination/v1"

	"github.com/portico-edge/portico/api/agentstatus"
)

// Announce states of a site, from its edges' own reports.
const (
	// Announced: an edge of the site announces the group's VIPs as is (BGP) or
	// owns them (VRRP master).
	Announced = "Announced"
	// Depreferenced: the site's edges still announce, but de-preferenced (drained,
	// unhealthy or stopping), so routers prefer other sites' routes.
	Depreferenced = "Depreferenced"
	// Withdrawn: no edge of the site announces.
	Withdrawn = "Withdrawn"
	// Draining: the site drains (portico.io/drain on its member Secret) and its
	// edges are de-preferenced.
	Draining = "Draining"
)

// edgeView is what a site's edges say of one Ingress: how many edges serve its
// group (their nginx lists it), how many serve the member's current generation, and
// what they announce.
type edgeCount struct {
	edges, serving int32
	announce       string
	spill          float64 // the edges' mean spill ratio
}

// edges sums up, for the Ingress ingKey ("namespace/name") at generation gen, the
// status Leases the site's agents publish (agent/lease), as the member's Lease
// informer holds them. A stale report (an agent that stopped renewing) counts for
// nothing: that edge is neither serving nor announcing.
func edges(leases coordinationlisters.LeaseNamespaceLister, ingKey string, gen int64) (edgeCount, error) {
	list, err := leases.List(labels.Everything())
	if err != nil {
		return edgeCount{}, err
	}
	ls := make([]agentstatus.Lease, 0, len(list))
	for _, l := range list {
		ls = append(ls, agentstatus.LeaseOf(l))
	}
	states, stale := agentstatus.DecodeStates(ls)
	v := edgeCount{announce: Withdrawn}
	depref := false
	for _, st := range states {
		served, ok := st.Served[ingKey]
		if !ok || stale[st.Node] {
			continue
		}
		v.edges++
		v.spill += st.Spill
		if served == gen {
			v.serving++
		}
		switch {
		case st.BGP != nil && st.BGP.Preference == agentstatus.PreferenceNormal && len(st.BGP.Announced) > 0:
			v.announce = Announced
		case st.BGP != nil && st.BGP.Preference == agentstatus.PreferenceDepreferenced && len(st.BGP.Announced) > 0:
			depref = true
		case st.BGP == nil && slices.Contains(slices.Collect(maps.Values(st.VRRP)), agentstatus.VRRPMaster):
			v.announce = Announced
		}
	}
	if v.announce != Announced && depref {
		v.announce = Depreferenced
	}
	if v.edges > 0 {
		v.spill /= float64(v.edges)
	}
	return v, nil
}
