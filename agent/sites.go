package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/portico-edge/portico/dataplane"
)

// SitesFile is what an edge knows of the other sites of a federation that serve
// its group's VIPs (anycast): their edges, reached through tunnels
// (--federation-peers; `portico federation` writes it into every member
// cluster's ConfigMap portico-federation-peers, which the chart mounts). It is
// what a site hand-over needs: when this site starts announcing the VIPs again
// after its federated Ingresses had no ready backend, the routers bring it
// connections the other sites hold, and its edges send each one that no replica
// here has to those sites' edges (dataplane.Dataplane.Handover).
type SitesFile struct {
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
	Overflow *Overflow  `json:"overflow,omitempty"`
	Peers    []PeerSite `json:"peers,omitempty"`
}

// PeerSite is another site of the federation.
type PeerSite struct {
	Name string `json:"name"`
	// Edges are the site's edge nodes' IPv4 tunnel addresses (their
	// --tunnel-address, by default their edge interface's first IPv4 address).
	Edges []string `json:"edges"`
	// Draining: the site drains (its SitesFile.Draining). This site's edges
	// hand over to it the connections the routers bring here meanwhile.
	Draining bool `json:"draining,omitempty"`
}

// LoadSitesFile reads a SitesFile (YAML or JSON), rejecting unknown fields and
// addresses that are not IPv4.
func LoadSitesFile(path string) (SitesFile, []siteEdge, error) {
	var f SitesFile
	b, err := os.ReadFile(path)
	if err != nil {
		return f, nil, fmt.Errorf("read federation peers: %w", err)
	}
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return f, nil, fmt.Errorf("federation peers %s: %w", path, err)
	}
	var edges []siteEdge
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
			edges = append(edges, siteEdge{site: p.Name, addr: a})
		}
	}
	slices.SortFunc(edges, func(x, y siteEdge) int { return x.addr.Compare(y.addr) })
	if o := f.Overflow; o != nil {
		switch {
		case o.CapacityPerEdge <= 0:
			return f, nil, fmt.Errorf("federation peers %s: overflow.capacityPerEdge %v: want a positive rate", path, o.CapacityPerEdge)
		case !slices.ContainsFunc(f.Peers, func(p PeerSite) bool { return p.Name == o.To }):
			return f, nil, fmt.Errorf("federation peers %s: overflow.to %q: not a peer", path, o.To)
		case o.Limit < 0 || o.Limit > dataplane.MaxSpill:
			return f, nil, fmt.Errorf("federation peers %s: overflow.limit %v: want 0 to %v", path, o.Limit, dataplane.MaxSpill)
		}
	}
	return f, edges, nil
}

// siteEdge is another site's edge.
type siteEdge struct {
	site string
	addr netip.Addr
}

// sites follows the --federation-peers file and finds how to reach the other
// sites' edges: the next hop's MAC on the edge interface (xdp_lb sends tunnel
// packets back out of the interface they came in by).
type sites struct {
	path  string
	ifc   *net.Interface
	neigh *neighbors
	log   *zap.Logger

	mu      sync.Mutex
	stamp   time.Time  // the file's modification time when read
	statErr string     // the last failure to find the file (reported once)
	file    SitesFile  // the last good file
	edges   []siteEdge // the other sites' edges, sorted by address
}

// reload reads the file if it changed and reports whether the edges did. A file
// that cannot be read or is invalid is reported and the last good one kept.
func (s *sites) reload() bool {
	st, err := os.Stat(s.path)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if err.Error() != s.statErr {
			s.log.Warn("federation peers file unreadable: keeping the peers known", zap.Error(err))
		}
		s.statErr = err.Error()
		return false
	}
	s.statErr = ""
	if st.ModTime().Equal(s.stamp) {
		return false
	}
	f, edges, err := LoadSitesFile(s.path)
	if err != nil {
		s.log.Error("federation peers file invalid: keeping the peers known", zap.Error(err))
		s.stamp = st.ModTime()
		return false
	}
	s.stamp = st.ModTime()
	s.file = f
	s.log.Info("federation peers", zap.String("site", f.Site), zap.Int("sites", len(f.Peers)), zap.Int("edges", len(edges)),
		zap.Bool("draining", f.Draining), zap.Strings("peersDraining", s.drainingLocked()))
	if slices.Equal(edges, s.edges) {
		return false
	}
	s.edges = edges
	return true
}

// draining lists the peers that drain.
func (s *sites) draining() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.drainingLocked()
}

func (s *sites) drainingLocked() []string {
	var out []string
	for _, p := range s.file.Peers {
		if p.Draining {
			out = append(out, p.Name)
		}
	}
	return out
}

// overflow is the site's overflow, nil without one (or without the file).
func (s *sites) overflow() *Overflow {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.file.Overflow
}

// drainingNow reports whether this site drains now (SitesFile.Draining, from
// DrainFrom), and whether its drain grace is over (it withdraws).
func (s *sites) drainingNow(now time.Time) (draining, withdraw bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.file
	if !f.Draining || (f.DrainFrom != nil && now.Before(f.DrainFrom.Time)) {
		return false, false
	}
	if f.DrainGrace == nil {
		return true, false
	}
	from := s.stamp // a drain without a start began when the file said so
	if f.DrainFrom != nil {
		from = f.DrainFrom.Time
	}
	return true, !now.Before(from.Add(f.DrainGrace.Duration))
}

// remotes are the other sites' edges with their next hops' MACs; an edge whose
// next hop is unknown (or not on the edge interface) is left out and reported.
func (s *sites) remotes() []dataplane.Remote {
	s.mu.Lock()
	edges := slices.Clone(s.edges)
	s.mu.Unlock()
	var out []dataplane.Remote
	var errs []error
	for _, e := range edges {
		mac, err := s.nextHopMAC(e.addr)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", e.addr, err))
			continue
		}
		out = append(out, dataplane.Remote{Site: e.site, Addr: e.addr, MAC: mac})
	}
	if len(errs) > 0 {
		s.log.Warn("other sites' edges left out of the hand-over", zap.Error(errors.Join(errs...)))
	}
	return out
}

// nextHopMAC is the MAC of the next hop towards a on the edge interface.
func (s *sites) nextHopMAC(a netip.Addr) (net.HardwareAddr, error) {
	routes, err := netlink.RouteGet(a.AsSlice())
	if err != nil || len(routes) == 0 {
		return nil, fmt.Errorf("no route: %v", err)
	}
	r := routes[0]
	if r.LinkIndex != s.ifc.Index {
		return nil, fmt.Errorf("routed out of another interface than %s", s.ifc.Name)
	}
	hop := a
	if gw, ok := netip.AddrFromSlice(r.Gw); ok && r.Gw != nil {
		hop = gw.Unmap()
	}
	if m, ok := s.neigh.lookup(hop); ok {
		return m, nil
	}
	if err := s.neigh.resolve([]netip.Addr{hop}); err != nil {
		return nil, err
	}
	if m, ok := s.neigh.lookup(hop); ok {
		return m, nil
	}
	return nil, fmt.Errorf("next hop %s unresolved", hop)
}

// watch re-reads the file every second (a mounted ConfigMap changes under it),
// calls changed when the edges did, and every second tick(the draining peers).
func (s *sites) watch(ctx context.Context, changed func(), tick func(draining []string)) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if s.reload() {
			changed()
		}
		tick(s.draining())
	}
}
