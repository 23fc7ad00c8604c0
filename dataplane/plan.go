package dataplane

import (
	"fmt"
	"net/netip"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/portico-edge/portico/controlplane/model"
)

// plan is every entry the maps should hold for one Desired, with its ids
// assigned: what Apply writes.
type plan struct {
	peers map[lbPeerKey]bool // every remote backend's MAC
	// sitePeers: every other site's edge's tunnel address (Remotes, Spill).
	sitePeers map[lbSitePeerKey]bool
	vipIDs    map[netip.Addr]uint32
	vipKeys   map[lbVipKey]lbVipVal
	backends  map[uint32]lbBackend
	rings     map[uint32][]uint32
	digests   map[uint32]string
	arrival   map[uint32][]uint32 // with d.arriving: vip id -> the ring before this node joined
	// remotes, handGroup: see applied.
	remotes   map[uint32][]remoteID
	handGroup map[uint32]string
}

// plan validates want and assigns ids, reusing the ones already in the maps. It
// only reserves new ids in d.st once the whole of want is valid.
func (d *Dataplane) plan(want Desired) (plan, error) {
	p := plan{
		vipKeys:   map[lbVipKey]lbVipVal{},
		backends:  map[uint32]lbBackend{},
		rings:     map[uint32][]uint32{},
		digests:   map[uint32]string{},
		arrival:   map[uint32][]uint32{},
		remotes:   map[uint32][]remoteID{},
		handGroup: map[uint32]string{},
	}
	groupOf, err := validate(want)
	if err != nil {
		return p, err
	}
	p.peers, p.sitePeers = peersOf(want)
	if p.vipIDs, err = d.assignVIPIDs(groupOf); err != nil {
		return p, err
	}
	ids := d.newBackendIDs(want, p.vipIDs)
	for _, g := range want.Groups {
		if err := d.planGroup(&p, g, ids); err != nil {
			return p, err
		}
	}
	ids.reserve()
	return p, nil
}

// peersOf is what peers and site_peers should hold for want: the MAC of every
// replica on another node that has one, and the IPv4 tunnel address of every
// other site's edge (Remotes, Spill).
func peersOf(want Desired) (map[lbPeerKey]bool, map[lbSitePeerKey]bool) {
	peers, sitePeers := map[lbPeerKey]bool{}, map[lbSitePeerKey]bool{}
	for _, g := range want.Groups {
		for _, b := range g.Backends {
			if !b.Local && len(b.MAC) == 6 {
				var k lbPeerKey
				copy(k.Mac[:], b.MAC)
				peers[k] = true
			}
		}
		for _, r := range slices.Concat(g.Remotes, g.Spill) {
			if r.Addr.Unmap().Is4() {
				sitePeers[lbSitePeerKey{Addr: r.Addr.Unmap().As4()}] = true
			}
		}
	}
	return peers, sitePeers
}

// planGroup adds to p the entries of one group's VIPs: their keys, the
// backends of their replicas and remote edges, and their rings.
func (d *Dataplane) planGroup(p *plan, g Group, ids *backendIDs) error {
	tabs, err := d.tables(g)
	if err != nil {
		return fmt.Errorf("group %s: %w", g.Name, err)
	}
	serves := len(tabs.tab.Slots) > 0 // some replica takes new flows
	for _, v := range g.VIPs {
		v = v.Unmap()
		vipID := p.vipIDs[v]
		p.addVIPKeys(v, vipID, g.Ports)
		idOf, err := p.addBackends(g, vipID, ids)
		if err != nil {
			return err
		}
		if serves && len(g.Remotes) > 0 {
			if err := p.addRemotes(g, vipID, ids); err != nil {
				return err
			}
		}
		if serves {
			if err := p.addRing(g, vipID, tabs, idOf, ids); err != nil {
				return err
			}
		}
	}
	return nil
}

// tables is what every VIP of a group shares: its table, and with d.arriving
// the table the other directors held before this node's replica joined
// (arrivalTable); both empty when no replica serves. One table per group: every
// VIP of the group spreads over the same replicas, so only the backend ids
// differ between their rings. The table is built from every replica; the slots
// of draining and down ones go to a table of the serving ones, so that a
// replica turning draining or down moves no other replica's flows. When no
// replica serves, the draining ones that are not down take new flows (as
// kube-proxy falls back to serving terminating endpoints): a rollout whose
// terminating pods meet a drain leaves every replica draining for a moment,
// and without a ring each director would take every packet for itself, so
// that a connection it accepted breaks when another director takes the VIP,
// and one the others held breaks at once.
func (d *Dataplane) tables(g Group) (groupTables, error) {
	var members, ring []MaglevBackend
	serving := map[netip.Addr]bool{}
	takes := Backend.serves
	if !slices.ContainsFunc(g.Backends, Backend.serves) {
		takes = func(b Backend) bool { return !b.Down }
	}
	for _, b := range g.Backends {
		mb := MaglevBackend{Addr: b.Addr.Unmap(), Weight: b.Weight}
		members = append(members, mb)
		if takes(b) {
			ring = append(ring, mb)
			serving[mb.Addr] = true
		}
	}
	var t groupTables
	if len(ring) == 0 {
		return t, nil
	}
	var err error
	if d.arriving {
		if t.arrival, err = arrivalTable(g.Backends, members, d.opts.RingSize); err != nil {
			return t, err
		}
	}
	if t.tab, err = BuildTable(ring, d.opts.RingSize); err != nil {
		return t, err
	}
	if len(members) > len(ring) {
		all, err := BuildTable(members, d.opts.RingSize)
		if err != nil {
			return t, err
		}
		t.tab = all.Fill(func(a netip.Addr) bool { return serving[a] }, t.tab)
	}
	t.digest = t.tab.Digest()
	return t, nil
}

// groupTables are the tables of a group's rings.
type groupTables struct {
	tab, arrival Table
	digest       string // tab's
}

// addVIPKeys adds the keys of a VIP address: one per port (every TCP and UDP
// port when ports is empty). With ports named, the address's other TCP and UDP
// ports are closed: xdp_lb drops what reaches them, so no listener of the node
// (the agent's metrics, the liveness checks, the kubelet, ssh) ever answers on
// a VIP.
func (p *plan) addVIPKeys(v netip.Addr, vipID uint32, ports []model.Port) {
	open := ports
	if len(ports) == 0 {
		open = []model.Port{{Protocol: model.TCP}, {Protocol: model.UDP}}
	}
	for _, port := range open {
		proto := uint8(unix.IPPROTO_TCP)
		if port.Protocol == model.UDP {
			proto = unix.IPPROTO_UDP
		}
		p.vipKeys[lbVipKey{Addr: addr16(v), Port: portToMap(port.Port), Proto: proto}] = lbVipVal{VipId: vipID}
	}
	if len(ports) > 0 {
		for _, proto := range []uint8{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
			k := lbVipKey{Addr: addr16(v), Port: 0, Proto: proto}
			if _, every := p.vipKeys[k]; !every {
				p.vipKeys[k] = lbVipVal{VipId: vipID, Flags: uint32(lbVipFlagsVIP_F_CLOSED)}
			}
		}
	}
}

// addBackends adds the backends of a group's replicas for one VIP and says
// each one's id by address. A replica down and without a MAC gets none: the
// flows that name it are picked again.
func (p *plan) addBackends(g Group, vipID uint32, ids *backendIDs) (map[netip.Addr]uint32, error) {
	idOf := map[netip.Addr]uint32{}
	for _, b := range g.Backends {
		if b.Down && !b.Local && len(b.MAC) != 6 {
			continue
		}
		a := b.Addr.Unmap()
		id, err := ids.idFor(backendKey{vip: vipID, addr: a})
		if err != nil {
			return nil, err
		}
		flags := uint16(lbBackendFlagsBACKEND_F_ACTIVE)
		if b.Local {
			flags |= uint16(lbBackendFlagsBACKEND_F_LOCAL)
		}
		if b.Draining || b.Down {
			flags |= uint16(lbBackendFlagsBACKEND_F_DRAINING)
		}
		if b.Down {
			flags |= uint16(lbBackendFlagsBACKEND_F_DOWN)
		}
		p.backends[id] = lbBackend{Addr: addr16(a), Mac: mac6(b.MAC), Flags: flags, VipId: vipID, Weight: max(b.Weight, 1)}
		idOf[a] = id
	}
	return idOf, nil
}

// addRemotes adds the backends of a group's remote edges for one VIP, and
// records them for Handover.
func (p *plan) addRemotes(g Group, vipID uint32, ids *backendIDs) error {
	for _, r := range g.Remotes {
		a := r.Addr.Unmap()
		id, err := ids.idFor(backendKey{vip: vipID, addr: a})
		if err != nil {
			return err
		}
		flags := uint16(lbBackendFlagsBACKEND_F_ACTIVE | lbBackendFlagsBACKEND_F_REMOTE)
		p.backends[id] = lbBackend{Addr: addr16(a), Mac: mac6(r.MAC), Flags: flags, VipId: vipID, Weight: 1}
		p.remotes[vipID] = append(p.remotes[vipID], remoteID{site: r.Site, addr: a, id: id})
	}
	p.handGroup[vipID] = g.Name
	return nil
}

// addRing adds a VIP's ring (the group's table in the VIP's backend ids, with
// its spill slots), its digest, and the arrival ring when there is one.
func (p *plan) addRing(g Group, vipID uint32, tabs groupTables, idOf map[netip.Addr]uint32, ids *backendIDs) error {
	slots := tableIDs(tabs.tab, idOf)
	digest := tabs.digest
	if n := spillSlots(g.SpillRatio, len(slots)); n > 0 {
		if err := p.addSpill(g, vipID, slots, n, ids); err != nil {
			return err
		}
		digest = fmt.Sprintf("%s+spill%d", digest, n)
	}
	p.digests[vipID] = digest
	p.rings[vipID] = slots
	if len(tabs.arrival.Slots) > 0 {
		p.arrival[vipID] = tableIDs(tabs.arrival, idOf)
	}
	return nil
}

// tableIDs is a table's slots, each the backend id idOf gives its replica.
func tableIDs(tab Table, idOf map[netip.Addr]uint32) []uint32 {
	slots := make([]uint32, len(tab.Slots))
	for i, s := range tab.Slots {
		slots[i] = idOf[tab.Backends[s]]
	}
	return slots
}

// arrivalTable is the table the other directors most likely held before this
// node's replica joined (Options.Arrival): members without the local replica and
// the down ones, draining ones still serving, in the same structure as Apply's
// (the missing replicas' slots refilled from a table of the others). Empty when
// no replica would serve.
func arrivalTable(backends []Backend, members []MaglevBackend, size uint32) (Table, error) {
	serving := map[netip.Addr]bool{}
	var ring []MaglevBackend
	for _, b := range backends {
		if !b.Local && !b.Down {
			ring = append(ring, MaglevBackend{Addr: b.Addr.Unmap(), Weight: b.Weight})
			serving[b.Addr.Unmap()] = true
		}
	}
	if len(ring) == 0 {
		return Table{}, nil
	}
	tab, err := BuildTable(ring, size)
	if err != nil || len(ring) == len(members) {
		return tab, err
	}
	all, err := BuildTable(members, size)
	if err != nil {
		return Table{}, err
	}
	return all.Fill(func(a netip.Addr) bool { return serving[a] }, tab), nil
}
