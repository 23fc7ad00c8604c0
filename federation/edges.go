package federation

import (
	"context"
	"slices"

	"k8s.io/client-go/kubernetes"

	"github.com/portico-edge/portico/agent"
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
)

// edgeView is what a site's edges say of one Ingress: how many edges serve its
// group (their nginx lists it), how many serve the member's current generation, and
// what they announce.
type edgeView struct {
	edges, serving int32
	announce       string
}

// edges reads the status Leases the site's agents publish in ns (agent.WriteLease)
// and sums them up for the Ingress ingKey ("namespace/name") at generation gen. A
// stale report (an agent that stopped renewing) counts for nothing: that edge is
// neither serving nor announcing.
func edges(ctx context.Context, client kubernetes.Interface, ns, ingKey string, gen int64) (edgeView, error) {
	states, stale, err := agent.ReadStates(ctx, client, ns)
	if err != nil {
		return edgeView{}, err
	}
	v := edgeView{announce: Withdrawn}
	depref := false
	for _, st := range states {
		served, ok := st.Served[ingKey]
		if !ok || stale[st.Node] {
			continue
		}
		v.edges++
		if served == gen {
			v.serving++
		}
		switch {
		case st.BGP != nil && st.BGP.Preference == "normal" && len(st.BGP.Announced) > 0:
			v.announce = Announced
		case st.BGP != nil && st.BGP.Preference == "depreferenced" && len(st.BGP.Announced) > 0:
			depref = true
		case st.BGP == nil && slices.Contains(mapValues(st.VRRP), "master"):
			v.announce = Announced
		}
	}
	if v.announce != Announced && depref {
		v.announce = Depreferenced
	}
	return v, nil
}

func mapValues(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
