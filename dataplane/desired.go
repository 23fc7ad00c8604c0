package dataplane

import (
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/portico-edge/portico/controlplane/model"
)

// Desired is what the maps should say: plain data, built by the agent from the
// model snapshot plus what only this node knows (replica MACs, which replica is
// local).
type Desired struct {
	Seed   uint32 // cluster-wide flow hash seed, equal on every node
	Groups []Group
	// Tunnel is this node's IPv4 address for tunnels between sites (a
	// federation, Group.Remotes): packets for another site's edge leave from
	// it, and packets other sites send to it are steered here. Required with
	// Remotes.
	Tunnel netip.Addr
	// Differ: this node's liveness verdicts differ from another edge's
	// (liveness.Checker.Differ). Its ring then gives a replica's slots to
	// others where theirs do not (or the other way round), and no transition
	// of its own shows it: a connection it opens there is off the other
	// edges' rings, and once its verdict agrees again its chain for that
	// connection and theirs may not meet. So every new connection it directs
	// is pinned where it goes, as in a slot a transition moved (bpf/README.md,
	// "Verdicts that differ"): per-flow state while verdicts differ only.
	Differ bool
}

// Group is a set of VIP addresses served by the same replicas.
type Group struct {
	Name     string
	VIPs     []netip.Addr
	Ports    []model.Port // empty: every TCP and UDP port; else the others are closed (dropped)
	Backends []Backend
	// Remotes are the edges of the other sites that serve the group's VIPs
	// (anycast, in a federation), where a site hand-over (Handover) sends the
	// connections this site does not have. They are never in the ring.
	Remotes []Remote
	// Spill are the edges of the site this one overflows to, and SpillRatio
	// (0 to 0.9) the share of the ring's slots that go to them: new
	// connections there are sent through tunnels and served by that site; the
	// slots are always the same ones for a ratio (a fixed order of slots), so
	// a higher ratio only adds slots and a lower one only takes the last ones
	// back, and the ring transition keeps every connection where it started.
	Spill      []Remote
	SpillRatio float64
}

// Remote is an edge of another site, reached through a tunnel.
type Remote struct {
	Site string           // the site's name (Handover selects by it)
	Addr netip.Addr       // the edge's IPv4 tunnel address
	MAC  net.HardwareAddr // the next hop's MAC towards it
}

// Backend is one replica of a group as this node sees it.
type Backend struct {
	Addr     netip.Addr
	MAC      net.HardwareAddr // required unless Local
	Weight   uint32           // 0 counts as 1
	Local    bool             // this node: XDP_PASS
	Draining bool             // keeps its flows, gets no new ones (unless no replica of its group serves)
	// Down: the liveness checks say the replica cannot serve. It gets no new
	// flows and keeps its place in the table, so no other replica's flows move.
	// In a flow's chain it comes after every replica that serves: a survivor's
	// connection is found before a packet goes to a node that may be dead, and
	// its own connections still reach it when it is reachable (Local, or with a
	// MAC) and the check was wrong (a replica too slow for a moment under load).
	// Without a MAC it gets no entry and its flows are picked again, as if
	// removed. A UDP flow cannot be told from a new one, so it is picked again
	// rather than sent to a node that may be dead.
	Down bool
}

type backendKey struct {
	vip   uint32
	addr  netip.Addr
	spill bool // a Group.Spill entry (another site's edge can be both)
}

// keyOf is the key of a backend entry as the maps hold it.
func keyOf(be lbBackend) backendKey {
	return backendKey{be.VipId, addrFrom16(be.Addr), be.Flags&uint16(lbBackendFlagsBACKEND_F_SPILL) != 0}
}

// keys lists the backend keys of the group's replicas, remote and spill edges
// for one VIP.
func (g Group) keys(vip uint32) []backendKey {
	var out []backendKey
	for _, b := range g.Backends {
		out = append(out, backendKey{vip: vip, addr: b.Addr.Unmap()})
	}
	for _, r := range g.Remotes {
		out = append(out, backendKey{vip: vip, addr: r.Addr.Unmap()})
	}
	for _, r := range g.Spill {
		out = append(out, backendKey{vip: vip, addr: r.Addr.Unmap(), spill: true})
	}
	return out
}

// check says what is wrong with another site's edge (kind: remote or spill), ""
// when nothing is.
func (r Remote) check(kind string, tunnel netip.Addr) string {
	switch {
	case !r.Addr.IsValid() || !r.Addr.Unmap().Is4():
		return fmt.Sprintf("%s edge %s is not an IPv4 address", kind, r.Addr)
	case len(r.MAC) != 6:
		return fmt.Sprintf("%s edge %s has no next-hop MAC", kind, r.Addr)
	case !tunnel.IsValid():
		return kind + " edges need a tunnel address"
	}
	return ""
}

// serves reports whether a replica gets new flows: neither draining nor down.
// When no replica of its group serves, the draining ones not down get them
// (Dataplane.tables).
func (b Backend) serves() bool { return !b.Draining && !b.Down }

// validate says what is wrong with want, every problem in one error, and
// otherwise which group each VIP address (unmapped) belongs to.
func validate(want Desired) (map[netip.Addr]string, error) {
	var problems []string
	if want.Tunnel.IsValid() && !want.Tunnel.Unmap().Is4() {
		problems = append(problems, fmt.Sprintf("tunnel address %s is not IPv4", want.Tunnel))
	}
	groupOf := map[netip.Addr]string{}
	for _, g := range want.Groups {
		problems = append(problems, g.problems(groupOf, want.Tunnel)...)
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("invalid data plane input: %s", strings.Join(problems, "; "))
	}
	return groupOf, nil
}

// problems lists what is wrong with a group, given the groups of VIP
// addresses seen so far (groupOf, to which it adds its own) and this node's
// tunnel address.
func (g Group) problems(groupOf map[netip.Addr]string, tunnel netip.Addr) []string {
	var problems []string
	for _, v := range g.VIPs {
		if !v.IsValid() {
			problems = append(problems, fmt.Sprintf("group %s: invalid VIP", g.Name))
			continue
		}
		v = v.Unmap()
		if other, dup := groupOf[v]; dup {
			problems = append(problems, fmt.Sprintf("VIP %s in groups %s and %s", v, other, g.Name))
		}
		groupOf[v] = g.Name
	}
	seen := map[netip.Addr]bool{}
	for _, b := range g.Backends {
		switch {
		case !b.Addr.IsValid():
			problems = append(problems, fmt.Sprintf("group %s: backend without address", g.Name))
		case seen[b.Addr.Unmap()]:
			problems = append(problems, fmt.Sprintf("group %s: backend %s listed twice", g.Name, b.Addr))
		case !b.Local && !b.Down && len(b.MAC) != 6:
			problems = append(problems, fmt.Sprintf("group %s: remote backend %s has no MAC", g.Name, b.Addr))
		}
		seen[b.Addr.Unmap()] = true
	}
	for _, r := range g.Remotes {
		if problem := r.check("remote", tunnel); problem != "" {
			problems = append(problems, fmt.Sprintf("group %s: %s", g.Name, problem))
		} else if seen[r.Addr.Unmap()] {
			problems = append(problems, fmt.Sprintf("group %s: %s is a replica and a remote edge", g.Name, r.Addr))
		}
		seen[r.Addr.Unmap()] = true
	}
	for _, r := range g.Spill {
		if problem := r.check("spill", tunnel); problem != "" {
			problems = append(problems, fmt.Sprintf("group %s: %s", g.Name, problem))
		}
	}
	if g.SpillRatio < 0 || g.SpillRatio > MaxSpill || (g.SpillRatio > 0 && len(g.Spill) == 0) {
		problems = append(problems, fmt.Sprintf("group %s: spill ratio %v: want 0 to %v, and spill edges", g.Name, g.SpillRatio, MaxSpill))
	}
	for _, port := range g.Ports {
		if port.Protocol != model.TCP && port.Protocol != model.UDP {
			problems = append(problems, fmt.Sprintf("group %s: protocol %q", g.Name, port.Protocol))
		}
	}
	return problems
}
