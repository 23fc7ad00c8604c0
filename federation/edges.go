package federation

import (
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/labels"
	coordinationlisters "k8s.io/client-go/listers/coordination/v1"

	"github.com/portico-edge/portico/api/agentstatus"
	"github.com/portico-edge/portico/api/v1alpha1"
)

// edgeCount is what a site's edges say of one Ingress: how many edges serve its
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
	v := edgeCount{announce: v1alpha1.SiteWithdrawn}
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
			v.announce = v1alpha1.SiteAnnounced
		case st.BGP != nil && st.BGP.Preference == agentstatus.PreferenceDepreferenced && len(st.BGP.Announced) > 0:
			depref = true
		case st.BGP == nil && slices.Contains(slices.Collect(maps.Values(st.VRRP)), agentstatus.VRRPMaster):
			v.announce = v1alpha1.SiteAnnounced
		}
	}
	if v.announce != v1alpha1.SiteAnnounced && depref {
		v.announce = v1alpha1.SiteDepreferenced
	}
	if v.edges > 0 {
		v.spill /= float64(v.edges)
	}
	return v, nil
}
