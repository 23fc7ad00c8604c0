// Package sites is the federation peers file: what an edge knows of the other
// sites of a federation that serve its group's VIPs. `portico federation` writes
// it into every member cluster's ConfigMap portico-federation-peers; the chart
// mounts it and the agents read it (--federation-peers). A leaf: it imports
// nothing of Portico, so the federation controller that writes it never links
// the data plane.
package sites

import (
	"fmt"
	"net/netip"
	"os"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// File is what an edge knows of the other sites of a federation that serve its
// group's VIPs (anycast): their edges, reached through tunnels. It is what a
// site hand-over needs: when this site starts announcing the VIPs again after
// its federated Ingresses had no ready backend, the routers bring it
// connections the other sites hold, and its edges send each one that no replica
// here has to those sites' edges (dataplane.Dataplane.Handover).
type File struct {
	// Site is this cluster's name in the federation.
	Site string `json:"site"`
	// Draining: this site drains (a planned drain), from DrainFrom on if set.
	// Its edges de-prefer the VIPs, so the routers take every flow to the
	// other sites, whose edges send the connections that live here back
	// through tunnels (they see this site draining in their files); new
	// connections go to the other sites. DrainFrom leaves the other sites'
	// agents, which read their files at their own pace, time to be ready first.
	Draining  bool         `json:"draining,omitempty"`
	DrainFrom *metav1.Time `json:"drainFrom,omitempty"`
	// DrainGrace: a draining site withdraws the VIPs this long after its drain
	// began (nil: it stays de-preferenced until the drain ends).
	DrainGrace *metav1.Duration `json:"drainGrace,omitempty"`
	// Overflow, if set, is this site's capacity and where it spills above it.
	Overflow *Overflow `json:"overflow,omitempty"`
	Peers    []Peer    `json:"peers,omitempty"`
}

// Peer is another site of the federation.
type Peer struct {
	Name string `json:"name"`
	// Edges are the site's edge nodes' IPv4 tunnel addresses (their
	// --tunnel-address, by default their edge interface's first IPv4 address).
	Edges []string `json:"edges"`
	// Draining: the site drains (its File.Draining). This site's edges hand
	// over to it the connections the routers bring here meanwhile.
	Draining bool `json:"draining,omitempty"`
}

// Overflow is a site's capacity and where it spills above it (File.Overflow).
type Overflow struct {
	// CapacityPerEdge is how many new connections a second each edge of this
	// site takes: the site's capacity divided by its edges (the routers spread
	// new connections evenly over them). Above it, an edge sends the excess to
	// To's edges through tunnels (dataplane.Group.Spill), in whole steps, for
	// the new connections only.
	CapacityPerEdge float64 `json:"capacityPerEdge"`
	// To is the peer site that takes the excess (the next closest).
	To string `json:"to"`
	// Limit is the most of an edge's new connections that spill (default
	// DefaultLimit, at most MaxSpill).
	Limit float64 `json:"limit,omitempty"`
}

const (
	// MaxSpill is the most of an edge's new connections an overflow spills
	// (dataplane.MaxSpill): a site keeps at least a tenth of them.
	MaxSpill = 0.9
	// DefaultLimit is Overflow.Limit's default.
	DefaultLimit = 0.5
)

// EffectiveLimit is the overflow's limit, defaulted and capped.
func (o Overflow) EffectiveLimit() float64 {
	switch {
	case o.Limit <= 0:
		return DefaultLimit
	case o.Limit > MaxSpill:
		return MaxSpill
	}
	return o.Limit
}

// Edge is another site's edge.
type Edge struct {
	Site string
	Addr netip.Addr
}

// Load reads a File (YAML or JSON), rejecting unknown fields, and returns it
// with the other sites' edges, sorted by address; addresses that are not IPv4,
// an edge in two sites and an overflow that names no peer are errors.
func Load(path string) (File, []Edge, error) {
	var f File
	b, err := os.ReadFile(path)
	if err != nil {
		return f, nil, fmt.Errorf("read federation peers: %w", err)
	}
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return f, nil, fmt.Errorf("federation peers %s: %w", path, err)
	}
	var edges []Edge
	seen := map[netip.Addr]string{}
	for _, p := range f.Peers {
		if p.Name == "" || p.Name == f.Site {
			return f, nil, fmt.Errorf("federation peers %s: peer %q: a name, not this site's", path, p.Name)
		}
		for _, e := range p.Edges {
			a, err := netip.ParseAddr(e)
			if err != nil || !a.Unmap().Is4() {
				return f, nil, fmt.Errorf("federation peers %s: site %s: edge %q is not an IPv4 address", path, p.Name, e)
			}
			a = a.Unmap()
			if other, dup := seen[a]; dup {
				if other == p.Name {
					continue
				}
				return f, nil, fmt.Errorf("federation peers %s: edge %s in sites %s and %s", path, a, other, p.Name)
			}
			seen[a] = p.Name
			edges = append(edges, Edge{Site: p.Name, Addr: a})
		}
	}
	slices.SortFunc(edges, func(x, y Edge) int { return x.Addr.Compare(y.Addr) })
	if o := f.Overflow; o != nil {
		switch {
		case o.CapacityPerEdge <= 0:
			return f, nil, fmt.Errorf("federation peers %s: overflow.capacityPerEdge %v: want a positive rate", path, o.CapacityPerEdge)
		case !slices.ContainsFunc(f.Peers, func(p Peer) bool { return p.Name == o.To }):
			return f, nil, fmt.Errorf("federation peers %s: overflow.to %q: not a peer", path, o.To)
		case o.Limit < 0 || o.Limit > MaxSpill:
			return f, nil, fmt.Errorf("federation peers %s: overflow.limit %v: want 0 to %v", path, o.Limit, MaxSpill)
		}
	}
	return f, edges, nil
}
