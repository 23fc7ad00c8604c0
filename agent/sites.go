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
	Site  string     `json:"site"`
	Peers []PeerSite `json:"peers,omitempty"`
}

// PeerSite is another site of the federation.
type PeerSite struct {
	Name string `json:"name"`
	// Edges are the site's edge nodes' IPv4 tunnel addresses (their
	// --tunnel-address, by default their edge interface's first IPv4 address).
	Edges []string `json:"edges"`
}

// LoadSitesFile reads a SitesFile (YAML or JSON), rejecting unknown fields and
// addresses that are not IPv4.
func LoadSitesFile(path string) (SitesFile, []netip.Addr, error) {
	var f SitesFile
	b, err := os.ReadFile(path)
	if err != nil {
		return f, nil, fmt.Errorf("read federation peers: %w", err)
	}
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return f, nil, fmt.Errorf("federation peers %s: %w", path, err)
	}
	var edges []netip.Addr
	for _, p := range f.Peers {
		if p.Name == "" || p.Name == f.Site {
			return f, nil, fmt.Errorf("federation peers %s: peer %q: a name, not this site's", path, p.Name)
		}
		for _, e := range p.Edges {
			a, err := netip.ParseAddr(e)
			if err != nil || !a.Unmap().Is4() {
				return f, nil, fmt.Errorf("federation peers %s: site %s: edge %q is not an IPv4 address", path, p.Name, e)
			}
			edges = append(edges, a.Unmap())
		}
	}
	slices.SortFunc(edges, netip.Addr.Compare)
	return f, slices.Compact(edges), nil
}

// sites follows the --federation-peers file and finds how to reach the other
// sites' edges: the next hop's MAC on the edge interface (xdp_lb sends tunnel
// packets back out of the interface they came in by).
type sites struct {
	path  string
	ifc   *net.Interface
	neigh *neighbors
	log   *zap.Logger

	mu    sync.Mutex
	stamp time.Time    // the file's modification time when read
	edges []netip.Addr // the other sites' edges, sorted
}

// reload reads the file if it changed and reports whether the edges did. A file
// that cannot be read or is invalid is reported and the last good one kept.
func (s *sites) reload() bool {
	st, err := os.Stat(s.path)
	if err != nil {
		s.log.Warn("federation peers file unreadable: keeping the peers known", zap.Error(err))
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
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
	if slices.Equal(edges, s.edges) {
		return false
	}
	s.edges = edges
	s.log.Info("federation peers", zap.String("site", f.Site), zap.Int("sites", len(f.Peers)), zap.Stringers("edges", edges))
	return true
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
		mac, err := s.nextHopMAC(e)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", e, err))
			continue
		}
		out = append(out, dataplane.Remote{Addr: e, MAC: mac})
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

// watch re-reads the file every few seconds (a mounted ConfigMap changes under
// it) and calls changed when the edges did.
func (s *sites) watch(ctx context.Context, changed func()) error {
	t := time.NewTicker(3 * time.Second)
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
	}
}
