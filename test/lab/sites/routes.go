package sites

import (
	"context"
	"fmt"
	"time"

	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/test/lab"
	"github.com/portico-edge/portico/test/testenv"
)

// Remotes counts, per edge of a site, the other site's edges its maps hold for
// the VIP (SetPeers followed).
func (s *Sites) Remotes(l *lab.Lab) ([]int, error) {
	var out []int
	for i, e := range l.Edges {
		in, err := dataplane.OpenPinned(l.Agent(i).PinPath)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", e.Name, err)
		}
		vs, err := in.VIPs()
		in.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", e.Name, err)
		}
		n := 0
		for _, v := range vs {
			if v.Addr != lab.VIP {
				continue
			}
			for _, b := range v.Backends {
				if b.Remote {
					n++
				}
			}
		}
		out = append(out, n)
	}
	return out, nil
}

// NewFlows sums the new connections (SYNs) a site's edges directed to the VIP:
// the ones the router sent them, and the ones another site spilled to them.
func (s *Sites) NewFlows(l *lab.Lab) (uint64, error) {
	var n uint64
	for i, e := range l.Edges {
		in, err := dataplane.OpenPinned(l.Agent(i).PinPath)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", e.Name, err)
		}
		vs, err := in.VIPs()
		in.Close()
		if err != nil {
			return 0, fmt.Errorf("%s: %w", e.Name, err)
		}
		for _, v := range vs {
			if v.Addr == lab.VIP {
				n += v.Counters.NewFlows
			}
		}
	}
	return n, nil
}

// WaitRemotes waits until every edge of every site holds the other sites' edges
// for the VIP (peers), or none (!peers): the agents followed SetPeers.
func (s *Sites) WaitRemotes(timeout time.Duration, peers bool) error {
	_, err := testenv.Poll(context.Background(), timeout, 100*time.Millisecond, func() error {
		for _, l := range s.all() {
			want := 0
			if peers {
				for _, o := range s.others(l) {
					want += len(o.Edges)
				}
			}
			n, err := s.Remotes(l)
			if err != nil {
				return err
			}
			for _, r := range n {
				if r != want {
					return fmt.Errorf("site %s's edges hold %v remote edges, want %d each", l.SiteName(), n, want)
				}
			}
		}
		return nil
	})
	return err
}

// Reasons sums a site's edges' xdp_lb counters of one reason.
func (s *Sites) Reasons(l *lab.Lab, r dataplane.Reason) (uint64, error) {
	var n uint64
	for i, e := range l.Edges {
		in, err := dataplane.OpenPinned(l.Agent(i).PinPath)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", e.Name, err)
		}
		c, err := in.Counters()
		in.Close()
		if err != nil {
			return 0, fmt.Errorf("%s: %w", e.Name, err)
		}
		n += c.Reasons[r]
	}
	return n, nil
}

// Hops is the set of sites whose edges are in the router's route to the VIP,
// and how many edges of each.
func (s *Sites) Hops() (map[string]int, error) {
	hops, err := s.Router.Nexthops()
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, h := range hops {
		out[s.SiteOf(h.String())]++
	}
	return out, nil
}

// HopsAre is a condition for testenv.Poll: the router's route to the VIP has a next
// hops through site a's edges and b through site b's.
func (s *Sites) HopsAre(a, b int) func() error {
	return func() error {
		h, err := s.Hops()
		if err != nil {
			return err
		}
		if h["a"] != a || h["b"] != b {
			return fmt.Errorf("the router's next hops by site: %v, want a %d, b %d", h, a, b)
		}
		return nil
	}
}

// SiteOf names the site of an edge address ("" for none).
func (s *Sites) SiteOf(addr string) string {
	for _, l := range s.all() {
		for _, e := range l.Edges {
			if e.Addr.Addr().String() == addr {
				return l.SiteName()
			}
		}
	}
	return ""
}

// Paths counts the router's BGP paths to the VIP by site: a withdrawn site has
// none, a de-preferenced one still has its paths (not in the route).
func (s *Sites) Paths() (map[string]int, error) {
	var route struct {
		Paths []struct {
			Nexthops []struct {
				IP string `json:"ip"`
			} `json:"nexthops"`
		} `json:"paths"`
	}
	if err := s.Router.FRR.VtyJSON("show ip bgp "+lab.VIP.String()+"/32 json", &route); err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, p := range route.Paths {
		for _, h := range p.Nexthops {
			out[s.SiteOf(h.IP)]++
		}
	}
	return out, nil
}

// UpdatesReceived sums the BGP UPDATE messages the router received from every
// edge: a change of routing would add to it.
func (s *Sites) UpdatesReceived() (int, error) {
	var peers map[string]struct {
		MessageStats struct {
			UpdatesRecv int `json:"updatesRecv"`
		} `json:"messageStats"`
	}
	if err := s.Router.FRR.VtyJSON("show bgp neighbors json", &peers); err != nil {
		return 0, err
	}
	n := 0
	for _, p := range peers {
		n += p.MessageStats.UpdatesRecv
	}
	return n, nil
}
