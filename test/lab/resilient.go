package lab

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/portico-edge/portico/test/netlab"
)

// resilientGroup makes the lab router forward the VIP by a resilient nexthop
// group (BGPOptions.Resilient): one nexthop object per edge, a group of type
// resilient over those FRR's route names, and a route to the VIP by that group
// with a lower metric than FRR's, so the kernel prefers it. A loop follows FRR's
// route every few milliseconds, as a router's own resilient ECMP follows its RIB:
// a withdrawn edge leaves the group (only its buckets move), a returning one
// joins it (buckets move to it until the group is balanced). FRR 8.4 cannot
// install BGP routes by resilient groups itself.
type resilientGroup struct {
	ns    string
	h     *netlink.Handle
	quit  chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	group []netip.Addr // the members now
	err   error        // the last failure to follow FRR's route
	log   []string     // every change of the group, with its time
}

// Nexthop ids far above zebra's own (it installs its routes by nexthop objects
// numbered from a few dozen up).
const (
	resilientGroupID = 500000000
	resilientBuckets = 128
	resilientMetric  = 10 // FRR installs BGP routes with metric 20
)

// nexthopID is the router's nexthop object for the edge at a.
func nexthopID(a netip.Addr) int { return resilientGroupID + 1 + int(a.As4()[3]) }

func startResilientGroup(ns string, edges []netip.Addr) (*resilientGroup, error) {
	nsh, err := netns.GetFromName(ns)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", ns, err)
	}
	h, err := netlink.NewHandleAt(nsh)
	nsh.Close()
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", ns, err)
	}
	for _, a := range edges {
		if err := netlab.IP("-n", ns, "nexthop", "add", "id", fmt.Sprint(nexthopID(a)), "via", a.String(), "dev", "eth0"); err != nil {
			h.Close()
			return nil, err
		}
	}
	g := &resilientGroup{ns: ns, h: h, quit: make(chan struct{}), done: make(chan struct{})}
	go g.follow()
	return g, nil
}

// follow keeps the group equal to FRR's route until stop.
func (g *resilientGroup) follow() {
	defer close(g.done)
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-g.quit:
			return
		case <-t.C:
		}
		hops, err := g.frrHops()
		if err == nil {
			err = g.set(hops)
		}
		g.mu.Lock()
		g.err = err
		g.mu.Unlock()
	}
}

// frrHops reads FRR's route to the VIP (protocol bgp) from the kernel, sorted.
func (g *resilientGroup) frrHops() ([]netip.Addr, error) {
	rs, err := g.h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{
		Dst:      &net.IPNet{IP: VIP.AsSlice(), Mask: net.CIDRMask(32, 32)},
		Protocol: unix.RTPROT_BGP,
	}, netlink.RT_FILTER_DST|netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return nil, fmt.Errorf("list routes in %s: %w", g.ns, err)
	}
	var hops []netip.Addr
	for _, r := range rs {
		if r.Gw != nil {
			if a, ok := netip.AddrFromSlice(r.Gw.To4()); ok {
				hops = append(hops, a)
			}
		}
		for _, p := range r.MultiPath {
			if a, ok := netip.AddrFromSlice(p.Gw.To4()); ok {
				hops = append(hops, a)
			}
		}
	}
	slices.SortFunc(hops, netip.Addr.Compare)
	return slices.Compact(hops), nil
}

// set makes the group's members hops (the route goes while there are none).
func (g *resilientGroup) set(hops []netip.Addr) error {
	g.mu.Lock()
	same := slices.Equal(g.group, hops)
	had := len(g.group) > 0
	g.mu.Unlock()
	if same {
		return nil
	}
	id, route := fmt.Sprint(resilientGroupID), VIP.String()+"/32"
	if len(hops) == 0 {
		if err := netlab.IP("-n", g.ns, "route", "del", route, "metric", fmt.Sprint(resilientMetric)); err != nil {
			return err
		}
		if err := netlab.IP("-n", g.ns, "nexthop", "del", "id", id); err != nil {
			return err
		}
	} else {
		ids := make([]string, len(hops))
		for i, a := range hops {
			ids[i] = fmt.Sprint(nexthopID(a))
		}
		// idle_timer 0: a returning edge gets its share of buckets at once;
		// unbalanced_timer 0: no time limit on imbalance.
		if err := netlab.IP("-n", g.ns, "nexthop", "replace", "id", id, "group", strings.Join(ids, "/"), "type", "resilient",
			"buckets", fmt.Sprint(resilientBuckets), "idle_timer", "0", "unbalanced_timer", "0"); err != nil {
			return err
		}
		if !had {
			if err := netlab.IP("-n", g.ns, "route", "replace", route, "nhid", id, "metric", fmt.Sprint(resilientMetric)); err != nil {
				return err
			}
		}
	}
	g.mu.Lock()
	g.group = hops
	g.log = append(g.log, fmt.Sprintf("%s %v", time.Now().Format("15:04:05.000"), hops))
	g.mu.Unlock()
	return nil
}

// history is every change of the group so far, oldest first.
func (g *resilientGroup) history() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.log)
}

// members is the group's membership now, and the last failure to follow FRR.
func (g *resilientGroup) members() ([]netip.Addr, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.group), g.err
}

func (g *resilientGroup) stop() error {
	close(g.quit)
	<-g.done
	g.h.Close()
	return nil
}
