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

	"github.com/portico-edge/portico/api/sites"
	"github.com/portico-edge/portico/dataplane"
)

// peerSites follows the --federation-peers file (api/sites) and finds how to
// reach the other sites' edges: the next hop's MAC on the edge interface (xdp_lb sends tunnel
// packets back out of the interface they came in by).
type peerSites struct {
	path  string
	ifc   *net.Interface
	neigh *neighbors
	log   *zap.Logger

	mu      sync.Mutex
	stamp   time.Time    // the file's modification time when read
	statErr string       // the last failure to find the file (reported once)
	file    sites.File   // the last good file
	edges   []sites.Edge // the other sites' edges, sorted by address
}

// reload reads the file if it changed and reports whether the edges did. A file
// that cannot be read or is invalid is reported and the last good one kept.
func (s *peerSites) reload() bool {
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
	f, edges, err := sites.Load(s.path)
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
func (s *peerSites) draining() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.drainingLocked()
}

func (s *peerSites) drainingLocked() []string {
	var out []string
	for _, p := range s.file.Peers {
		if p.Draining {
			out = append(out, p.Name)
		}
	}
	return out
}

// overflow is the site's overflow, nil without one (or without the file).
func (s *peerSites) overflow() *sites.Overflow {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.file.Overflow
}

// drainingNow reports whether this site drains now (sites.File.Draining, from
// DrainFrom), and whether its drain grace is over (it withdraws).
func (s *peerSites) drainingNow(now time.Time) (draining, withdraw bool) {
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
func (s *peerSites) remotes() []dataplane.Remote {
	s.mu.Lock()
	edges := slices.Clone(s.edges)
	s.mu.Unlock()
	var out []dataplane.Remote
	var errs []error
	for _, e := range edges {
		mac, err := s.nextHopMAC(e.Addr)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", e.Addr, err))
			continue
		}
		out = append(out, dataplane.Remote{Site: e.Site, Addr: e.Addr, MAC: mac})
	}
	if len(errs) > 0 {
		s.log.Warn("other sites' edges left out of the hand-over", zap.Error(errors.Join(errs...)))
	}
	return out
}

// nextHopMAC is the MAC of the next hop towards a on the edge interface.
func (s *peerSites) nextHopMAC(a netip.Addr) (net.HardwareAddr, error) {
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
func (s *peerSites) watch(ctx context.Context, changed func(), tick func(draining []string)) error {
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
