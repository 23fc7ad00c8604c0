package lab

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

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/portico-edge/portico/api/sites"
	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/dataplane"
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
	A, B   *Lab
	Router *Router
	traffic.Target
	// C, with SitesOptions.Third, is a third site behind a second router,
	// Router2 (AS 65001, peering with Router), with a client of its own
	// (Client2): another region.
	C       *Lab
	Router2 *Router
	Client2 traffic.Target
	shared  *Lab // the network, the routers and the clients
}

// all lists the sites.
func (s *Sites) all() []*Lab {
	out := []*Lab{s.A, s.B}
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
	// BFD is the router's and the agents' BFD interval.
	BFD time.Duration
	T   testing.TB
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
	bgpo := &BGPOptions{BFD: o.BFD, T: o.T}
	s = &Sites{}
	defer func() {
		if err != nil {
			s.Close()
			s = nil
		}
	}()
	newLab := func(subnet byte, name string) (*Lab, error) {
		dir, err := os.MkdirTemp("", "portico-lab-"+name+"-")
		if err != nil {
			return nil, err
		}
		l := &Lab{Portico: o.Portico, Dir: dir, agents: map[int]*Agent{}, bgp: bgpo, subnet: subnet, name: name}
		l.closers = append(l.closers, func() error { return os.RemoveAll(dir) })
		return l, nil
	}
	if s.shared, err = newLab(216, ""); err != nil {
		return s, err
	}
	if s.shared.Net, err = netlab.New("pf"); err != nil {
		return s, err
	}
	s.shared.closers = append(s.shared.closers, s.shared.Net.Close)
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
	edgesOf := func(sites ...*Lab) []netip.Addr {
		var edges []netip.Addr
		for _, site := range sites {
			for i := range o.Edges {
				edges = append(edges, site.edgeAddr(i))
			}
		}
		return edges
	}
	for _, site := range s.all() {
		site.Net = s.shared.Net
		site.sitesFile = filepath.Join(site.Dir, "peers.yaml")
	}
	rt := routerSpec{name: "rt", asn: routerASN, subnets: []byte{216, 218}, client: bgpClient, edges: edgesOf(s.A, s.B)}
	if o.Third {
		rt.routers = []routerPeer{{rt2Link.Addr(), router2ASN}}
	}
	r, c, err := s.shared.newRouter(bgpo, rt)
	if err != nil {
		return s, err
	}
	s.Router, s.Target = r, traffic.Target{NS: c.NS, VIP: VIP}
	if o.Third {
		r2, c2, err := s.shared.newRouter(bgpo, routerSpec{name: "rt2", asn: router2ASN, subnets: []byte{220},
			client: client2, edges: edgesOf(s.C), routers: []routerPeer{{rtLink.Addr(), routerASN}}})
		if err != nil {
			return s, err
		}
		s.Router2, s.Client2 = r2, traffic.Target{NS: c2.NS, VIP: VIP}
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
		if err := site.buildSite(ctx, Options{Edges: o.Edges, Pods: o.Pods, BGP: bgpo}); err != nil {
			return s, fmt.Errorf("site %s: %w", site.name, err)
		}
	}
	// The sites reach each other's edges, and both clients, through their
	// routers (the tunnels of a site hand-over, replies to another region).
	for _, site := range s.all() {
		var dsts []string
		for _, o := range s.others(site) {
			dsts = append(dsts, fmt.Sprintf("10.%d.0.0/24", o.subnet))
		}
		if o.Third {
			dsts = append(dsts, client2.Masked().String())
		}
		for _, e := range site.Edges {
			for _, d := range dsts {
				if err := netlab.IP("-n", e.NS, "route", "add", d, "via", site.routerAddr().String()); err != nil {
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
		{"-n", s.Router2.NS, "route", "replace", clientSubnet.String(), "via", rtLink.Addr().String()},
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
	for _, l := range []*Lab{s.A, s.B, s.C, s.shared} {
		if l != nil {
			errs = append(errs, l.Close())
		}
	}
	return errors.Join(errs...)
}

// others lists the other sites.
func (s *Sites) others(l *Lab) []*Lab {
	var out []*Lab
	for _, o := range s.all() {
		if o != l {
			out = append(out, o)
		}
	}
	return out
}

// other is the other site of a two-site lab.
func (s *Sites) other(l *Lab) *Lab { return s.others(l)[0] }

// SetPeers writes a site's --federation-peers file: the other sites' edges with
// peers, none without (each site on its own, the baseline). Agents follow the
// file within seconds.
func (s *Sites) SetPeers(l *Lab, peers bool) error {
	return s.WriteSites(l, SiteFile{Peers: peers})
}

// SiteFile is what the test tells a site's agents (sites.File).
type SiteFile struct {
	Peers bool // the other site's edges are listed
	// Draining: this site drains from DrainFrom on; PeerDraining: the other
	// sites drain.
	Draining     bool
	DrainFrom    time.Time
	PeerDraining bool
	// Overflow: this site's capacity and where it spills above it.
	Overflow *sites.Overflow
}

// WriteSites writes a site's --federation-peers file (atomically, as the
// kubelet updates a mounted ConfigMap).
func (s *Sites) WriteSites(l *Lab, sf SiteFile) error {
	f := sites.File{Site: l.name, Draining: sf.Draining, Overflow: sf.Overflow}
	if !sf.DrainFrom.IsZero() {
		f.DrainFrom = &metav1.Time{Time: sf.DrainFrom}
	}
	if sf.Peers {
		for _, o := range s.others(l) {
			p := sites.Peer{Name: o.name, Draining: sf.PeerDraining}
			for i := range o.Edges {
				p.Edges = append(p.Edges, o.edgeAddr(i).String())
			}
			f.Peers = append(f.Peers, p)
		}
	}
	b, err := yaml.Marshal(f)
	if err != nil {
		return err
	}
	tmp := l.sitesFile + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, l.sitesFile)
}

// Remotes counts, per edge of a site, the other site's edges its maps hold for
// the VIP (SetPeers followed).
func (s *Sites) Remotes(l *Lab) ([]int, error) {
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
			if v.Addr != VIP {
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
func (s *Sites) NewFlows(l *Lab) (uint64, error) {
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
			if v.Addr == VIP {
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
					return fmt.Errorf("site %s's edges hold %v remote edges, want %d each", l.name, n, want)
				}
			}
		}
		return nil
	})
	return err
}

// Reasons sums a site's edges' xdp_lb counters of one reason.
func (s *Sites) Reasons(l *Lab, r dataplane.Reason) (uint64, error) {
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

// Up serves each site's pods behind the Service "echo" and the federated Ingress
// for echo.lab, starts every agent, and waits until every edge of both sites is
// ready and in the router's route and echo.lab is served.
func (s *Sites) Up(ctx context.Context, timeout time.Duration) error {
	for _, l := range s.all() {
		if err := l.startEcho(ctx, l.FederatedIngress); err != nil {
			return err
		}
	}
	c := s.HTTPClient(false, 2*time.Second)
	_, err := testenv.Poll(ctx, timeout, 100*time.Millisecond, func() error {
		for _, l := range s.all() {
			if err := l.agentExited(); err != nil {
				return err
			}
			if err := l.agentsReady(); err != nil {
				return err
			}
		}
		if err := s.Router.announced(len(s.A.Edges) + len(s.B.Edges)); err != nil {
			return err
		}
		if s.C != nil {
			if err := s.Router2.announced(len(s.C.Edges)); err != nil {
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
				return l.name
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
	if err := s.Router.FRR.VtyJSON("show ip bgp "+VIP.String()+"/32 json", &route); err != nil {
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

// SetBackendReady marks a site's echo pods ready or not (the site's federated
// Ingress then has a ready backend there, or none).
func (l *Lab) SetBackendReady(ctx context.Context, ready bool) error {
	c := l.Kube.DiscoveryV1().EndpointSlices(AppNamespace)
	es, err := c.Get(ctx, "echo-lab", metav1.GetOptions{})
	if err != nil {
		return err
	}
	for i := range es.Endpoints {
		es.Endpoints[i].Conditions.Ready = ptr(ready)
	}
	_, err = c.Update(ctx, es, metav1.UpdateOptions{})
	return err
}

// FederatedIngress is Ingress with the label `portico federation` gives the
// Ingresses it propagates.
func (l *Lab) FederatedIngress(ctx context.Context, name, host, service string) error {
	if err := l.Ingress(ctx, name, host, service); err != nil {
		return err
	}
	c := l.Kube.NetworkingV1().Ingresses(AppNamespace)
	ing, err := c.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	ing.Labels = map[string]string{v1alpha1.LabelFederatedIngress: name}
	_, err = c.Update(ctx, ing, metav1.UpdateOptions{})
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
