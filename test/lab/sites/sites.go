// Package sites is the multi-site lab: two or three labs (package lab), each a
// cluster with its own API server, edges and pods, behind FRR routers, serving
// one VIP and one federated Ingress (Sites, StartSites). Its tests need root,
// kube-apiserver and FRR.
package sites

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/portico-edge/portico/test/lab"
	"github.com/portico-edge/portico/test/netlab"
	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

// Sites is the anycast lab of a federation: two clusters, sites "a" and "b",
// each with its own API server, edges (agents with --announce=bgp) and pods, on
// a subnet of its own (10.216.0.0/24 and 10.218.0.0/24, one bridge), behind one
// FRR router that spreads the client's flows over every edge announcing the VIP
// (L4 ECMP). Both sites serve the same VIP and the same Ingress, federated (as
// `portico federation` propagates it), so a site whose Ingress has no ready
// backend de-prefers, then withdraws, the VIP. Each site's agents read
// --federation-peers files naming the other site's edges (SetPeers): what a host
// cluster's federation controller writes.
//
//	client 10.217.0.2 --- rt 10.217.0.1 | 10.216.0.1, 10.218.0.1 --- bridge --- a: edges .11.., pods .21..
//	                                                                          b: edges .11.., pods .21..
type Sites struct {
	A, B   *lab.Lab
	Router *lab.Router
	traffic.Target
	// C, with SitesOptions.Third, is a third site behind a second router,
	// Router2 (AS 65001, peering with Router), with a client of its own
	// (Client2): another region.
	C       *lab.Lab
	Router2 *lab.Router
	Client2 traffic.Target
	shared  *lab.Lab // the network, the routers and the clients
}

// all lists the sites.
func (s *Sites) all() []*lab.Lab {
	out := []*lab.Lab{s.A, s.B}
	if s.C != nil {
		out = append(out, s.C)
	}
	return out
}

// SitesOptions size a Sites lab.
type SitesOptions struct {
	Portico string
	// Edges and Pods per site, default 2 and 1.
	Edges, Pods int
	// BFD is the router's and the agents' BFD interval, BFDMultiplier their
	// detection multiplier (0 for 3).
	BFD           time.Duration
	BFDMultiplier int
	T             testing.TB
	// Third adds site c behind a second router (another region):
	//
	//	client2 10.221.0.2 --- rt2 10.221.0.1 | 10.220.0.1 --- bridge --- c: edges .11.., pods .21..
	//	                        rt2 10.219.0.2 --- 10.219.0.1 rt
	Third bool
}

// StartSites builds both sites (Up starts them). Close removes everything, also
// after a failed StartSites.
func StartSites(ctx context.Context, o SitesOptions) (s *Sites, err error) {
	if o.Edges == 0 {
		o.Edges = 2
	}
	if o.Pods == 0 {
		o.Pods = 1
	}
	if _, err := os.Stat(o.Portico); err != nil {
		return nil, fmt.Errorf("portico binary: %w", err)
	}
	bgpo := &lab.BGPOptions{BFD: o.BFD, BFDMultiplier: o.BFDMultiplier, T: o.T}
	s = &Sites{}
	defer func() {
		if err != nil {
			s.Close()
			s = nil
		}
	}()
	newLab := func(subnet byte, name string) (*lab.Lab, error) {
		return lab.NewSite(o.Portico, subnet, name, bgpo)
	}
	if s.shared, err = newLab(216, ""); err != nil {
		return s, err
	}
	if s.shared.Net, err = netlab.New("pf"); err != nil {
		return s, err
	}
	s.shared.OnClose(s.shared.Net.Close)
	if s.A, err = newLab(216, "a"); err != nil {
		return s, err
	}
	if s.B, err = newLab(218, "b"); err != nil {
		return s, err
	}
	if o.Third {
		if s.C, err = newLab(220, "c"); err != nil {
			return s, err
		}
	}
	edgesOf := func(sites ...*lab.Lab) []netip.Addr {
		var edges []netip.Addr
		for _, site := range sites {
			for i := range o.Edges {
				edges = append(edges, site.EdgeAddr(i))
			}
		}
		return edges
	}
	for _, site := range s.all() {
		site.Net = s.shared.Net
		site.SitesFile = filepath.Join(site.Dir, "peers.yaml")
	}
	rt := lab.RouterSpec{Name: "rt", ASN: lab.RouterASN, Subnets: []byte{216, 218}, Client: lab.BGPClient, Edges: edgesOf(s.A, s.B)}
	if o.Third {
		rt.Routers = []lab.RouterPeer{{Addr: rt2Link.Addr(), ASN: router2ASN}}
	}
	r, c, err := s.shared.NewRouter(bgpo, rt)
	if err != nil {
		return s, err
	}
	s.Router, s.Target = r, traffic.Target{NS: c.NS, VIP: lab.VIP}
	if o.Third {
		r2, c2, err := s.shared.NewRouter(bgpo, lab.RouterSpec{Name: "rt2", ASN: router2ASN, Subnets: []byte{220},
			Client: client2, Edges: edgesOf(s.C), Routers: []lab.RouterPeer{{Addr: rtLink.Addr(), ASN: lab.RouterASN}}})
		if err != nil {
			return s, err
		}
		s.Router2, s.Client2 = r2, traffic.Target{NS: c2.NS, VIP: lab.VIP}
		// The link between the routers, and the routes over it.
		for _, args := range [][]string{
			{"-n", r.NS, "link", "add", "eth2", "type", "veth", "peer", "name", "eth2", "netns", r2.NS},
			{"-n", r.NS, "addr", "add", rtLink.String(), "dev", "eth2"},
			{"-n", r2.NS, "addr", "add", rt2Link.String(), "dev", "eth2"},
		} {
			if err := netlab.IP(args...); err != nil {
				return s, err
			}
		}
		if err := s.LinkRegions(true); err != nil {
			return s, err
		}
	}
	for _, site := range s.all() {
		router := s.Router
		if site == s.C {
			router = s.Router2
		}
		site.Router, site.Client, site.Target = router, c, s.Target
		if err := s.SetPeers(site, false); err != nil {
			return s, err
		}
		if err := site.BuildSite(ctx, lab.Options{Edges: o.Edges, Pods: o.Pods, BGP: bgpo}); err != nil {
			return s, fmt.Errorf("site %s: %w", site.SiteName(), err)
		}
	}
	// The sites reach each other's edges, and both clients, through their
	// routers (the tunnels of a site hand-over, replies to another region).
	for _, site := range s.all() {
		var dsts []string
		for _, o := range s.others(site) {
			dsts = append(dsts, fmt.Sprintf("10.%d.0.0/24", o.Subnet()))
		}
		if o.Third {
			dsts = append(dsts, client2.Masked().String())
		}
		for _, e := range site.Edges {
			for _, d := range dsts {
				if err := netlab.IP("-n", e.NS, "route", "add", d, "via", site.RouterAddr().String()); err != nil {
					return s, err
				}
			}
		}
	}
	return s, nil
}

// LinkRegions brings the link between the routers up, with the routes over it
// (each router reaches the other's subnets and client through it), or down (the
// kernel drops the routes through it).
func (s *Sites) LinkRegions(up bool) error {
	if !up {
		return netlab.IP("-n", s.Router.NS, "link", "set", "eth2", "down")
	}
	for _, args := range [][]string{
		{"-n", s.Router.NS, "link", "set", "eth2", "up"},
		{"-n", s.Router2.NS, "link", "set", "eth2", "up"},
		{"-n", s.Router.NS, "route", "replace", "10.220.0.0/24", "via", rt2Link.Addr().String()},
		{"-n", s.Router.NS, "route", "replace", client2.Masked().String(), "via", rt2Link.Addr().String()},
		{"-n", s.Router2.NS, "route", "replace", "10.216.0.0/24", "via", rtLink.Addr().String()},
		{"-n", s.Router2.NS, "route", "replace", "10.218.0.0/24", "via", rtLink.Addr().String()},
		{"-n", s.Router2.NS, "route", "replace", lab.ClientSubnet.String(), "via", rtLink.Addr().String()},
	} {
		if err := netlab.IP(args...); err != nil {
			return err
		}
	}
	return nil
}

// The second router of SitesOptions.Third: its AS, its client, and the link
// between the routers.
const router2ASN = 65001

var (
	client2 = netip.MustParsePrefix("10.221.0.2/24")
	rtLink  = netip.MustParsePrefix("10.219.0.1/30")
	rt2Link = netip.MustParsePrefix("10.219.0.2/30")
)

// Close stops every site and removes the lab.
func (s *Sites) Close() error {
	var errs []error
	for _, l := range []*lab.Lab{s.A, s.B, s.C, s.shared} {
		if l != nil {
			errs = append(errs, l.Close())
		}
	}
	return errors.Join(errs...)
}

// others lists the other sites.
func (s *Sites) others(l *lab.Lab) []*lab.Lab {
	var out []*lab.Lab
	for _, o := range s.all() {
		if o != l {
			out = append(out, o)
		}
	}
	return out
}

// other is the other site of a two-site lab.
func (s *Sites) other(l *lab.Lab) *lab.Lab { return s.others(l)[0] }

// Up serves each site's pods behind the Service "echo" and the federated Ingress
// for echo.lab, starts every agent, and waits until every edge of both sites is
// ready and in the router's route and echo.lab is served.
func (s *Sites) Up(ctx context.Context, timeout time.Duration) error {
	for _, l := range s.all() {
		if err := l.StartEcho(ctx, l.FederatedIngress); err != nil {
			return err
		}
	}
	c := s.HTTPClient(false, 2*time.Second)
	_, err := testenv.Poll(ctx, timeout, 100*time.Millisecond, func() error {
		for _, l := range s.all() {
			if err := l.AgentExited(); err != nil {
				return err
			}
			if err := l.AgentsReady(); err != nil {
				return err
			}
		}
		if err := s.Router.Announced(len(s.A.Edges) + len(s.B.Edges)); err != nil {
			return err
		}
		if s.C != nil {
			if err := s.Router2.Announced(len(s.C.Edges)); err != nil {
				return err
			}
			if _, err := s.Client2.Get(ctx, s.Client2.HTTPClient(false, 2*time.Second), "echo.lab", "/"); err != nil {
				return err
			}
		}
		_, err := s.Get(ctx, c, "echo.lab", "/")
		return err
	})
	return err
}

// logs returns the tails of every agent's log.
func (s *Sites) logs() string {
	var b strings.Builder
	for _, l := range s.all() {
		for i := range l.Edges {
			if a := l.Agent(i); a != nil {
				log := a.Log()
				if len(log) > 5000 {
					log = log[len(log)-5000:]
				}
				fmt.Fprintf(&b, "agent %s log (tail):\n%s\n", a.Edge.Name, log)
			}
		}
	}
	return b.String()
}
