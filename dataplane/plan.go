package dataplane

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/portico-edge/portico/controlplane/model"
)

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
		peers:     map[lbPeerKey]bool{},
		sitePeers: map[lbSitePeerKey]bool{},
		vipIDs:    map[netip.Addr]uint32{},
		vipKeys:   map[lbVipKey]lbVipVal{},
		backends:  map[uint32]lbBackend{},
		rings:     map[uint32][]uint32{},
		digests:   map[uint32]string{},
		arrival:   map[uint32][]uint32{},
		remotes:   map[uint32][]remoteID{},
		handGroup: map[uint32]string{},
	}
	var problems []string
	if want.Tunnel.IsValid() && !want.Tunnel.Unmap().Is4() {
		problems = append(problems, fmt.Sprintf("tunnel address %s is not IPv4", want.Tunnel))
	}
	groupOf := map[netip.Addr]string{}
	for _, g := range want.Groups {
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
			case !b.Local && len(b.MAC) == 6:
				var k lbPeerKey
				copy(k.Mac[:], b.MAC)
				p.peers[k] = true
			}
			seen[b.Addr.Unmap()] = true
		}
		for _, r := range slices.Concat(g.Remotes, g.Spill) {
			if r.Addr.Unmap().Is4() {
				p.sitePeers[lbSitePeerKey{Addr: r.Addr.Unmap().As4()}] = true
			}
		}
		for _, r := range g.Remotes {
			if problem := r.check("remote", want.Tunnel); problem != "" {
				problems = append(problems, fmt.Sprintf("group %s: %s", g.Name, problem))
			} else if seen[r.Addr.Unmap()] {
				problems = append(problems, fmt.Sprintf("group %s: %s is a replica and a remote edge", g.Name, r.Addr))
			}
			seen[r.Addr.Unmap()] = true
		}
		for _, r := range g.Spill {
			if problem := r.check("spill", want.Tunnel); problem != "" {
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
	}
	if len(problems) > 0 {
		return p, fmt.Errorf("invalid data plane input: %s", strings.Join(problems, "; "))
	}

	// VIP ids: keep the ones in use, give new VIPs the lowest free id.
	used := map[uint32]bool{}
	for a := range groupOf {
		if id, ok := d.st.vipIDs[a]; ok {
			p.vipIDs[a] = id
			used[id] = true
		}
	}
	newVIPs := []netip.Addr{}
	for a := range groupOf {
		if _, ok := p.vipIDs[a]; !ok {
			newVIPs = append(newVIPs, a)
		}
	}
	slices.SortFunc(newVIPs, netip.Addr.Compare)
	next := uint32(0)
	for _, a := range newVIPs {
		for used[next] {
			next++
		}
		if next >= uint32(lbLbLimitsLB_MAX_VIPS) {
			return p, fmt.Errorf("more than %d VIP addresses", lbLbLimitsLB_MAX_VIPS)
		}
		p.vipIDs[a] = next
		used[next] = true
	}

	// Backend ids: one per (VIP, replica); kept while the pair exists, new ones
	// taken round-robin so a freed id is not reused soon (flows may still name it).
	ids := map[backendKey]uint32{}
	usedB := map[uint32]bool{}
	for _, g := range want.Groups {
		for _, v := range g.VIPs {
			for _, k := range g.keys(p.vipIDs[v.Unmap()]) {
				if id, ok := d.st.backendIDs[k]; ok {
					ids[k] = id
					usedB[id] = true
				}
			}
		}
	}
	retiredID := map[uint32]bool{}
	for _, id := range d.st.retired {
		retiredID[id] = true
	}
	nextB := d.st.nextID
	alloc := func() (uint32, error) {
		// An id no removed backend may want back first; one that may, if
		// none is left.
		for _, spare := range []bool{false, true} {
			for range lbLbLimitsLB_MAX_BACKENDS {
				id := nextB
				nextB++
				if nextB >= uint32(lbLbLimitsLB_MAX_BACKENDS) {
					nextB = 1
				}
				if !usedB[id] && d.st.backends[id] == (lbBackend{}) && (spare || !retiredID[id]) {
					usedB[id] = true
					return id, nil
				}
			}
		}
		return 0, fmt.Errorf("more than %d backends", lbLbLimitsLB_MAX_BACKENDS-1)
	}
	// idFor is a key's backend id: the one it has, or a new one.
	idFor := func(k backendKey) (uint32, error) {
		if id, ok := ids[k]; ok {
			return id, nil
		}
		if id, ok := d.st.retired[k]; ok && !usedB[id] && d.st.backends[id] == (lbBackend{}) {
			usedB[id] = true
			ids[k] = id
			return id, nil
		}
		id, err := alloc()
		if err == nil {
			ids[k] = id
		}
		return id, err
	}

	for _, g := range want.Groups {
		var ports []model.Port
		if len(g.Ports) == 0 {
			ports = []model.Port{{Protocol: model.TCP}, {Protocol: model.UDP}}
		} else {
			ports = g.Ports
		}
		// One table per group: every VIP of the group spreads over the same
		// replicas, so only the backend ids differ between their rings. The
		// table is built from every replica; the slots of draining and down ones
		// go to a table of the serving ones, so that a replica turning draining
		// or down moves no other replica's flows.
		var members, ring []MaglevBackend
		serving := map[netip.Addr]bool{}
		for _, b := range g.Backends {
			mb := MaglevBackend{Addr: b.Addr.Unmap(), Weight: b.Weight}
			members = append(members, mb)
			if !b.Draining && !b.Down {
				ring = append(ring, mb)
				serving[mb.Addr] = true
			}
		}
		var tab, arrival Table
		var digest string
		if len(ring) > 0 && d.arriving {
			var err error
			if arrival, err = arrivalTable(g.Backends, members, d.opts.RingSize); err != nil {
				return p, fmt.Errorf("group %s: %w", g.Name, err)
			}
		}
		if len(ring) > 0 {
			var err error
			if tab, err = BuildTable(ring, d.opts.RingSize); err != nil {
				return p, fmt.Errorf("group %s: %w", g.Name, err)
			}
			if len(members) > len(ring) {
				all, err := BuildTable(members, d.opts.RingSize)
				if err != nil {
					return p, fmt.Errorf("group %s: %w", g.Name, err)
				}
				tab = all.Fill(func(a netip.Addr) bool { return serving[a] }, tab)
			}
			digest = tab.Digest()
		}
		for _, v := range g.VIPs {
			v = v.Unmap()
			vipID := p.vipIDs[v]
			for _, port := range ports {
				proto := uint8(unix.IPPROTO_TCP)
				if port.Protocol == model.UDP {
					proto = unix.IPPROTO_UDP
				}
				p.vipKeys[lbVipKey{Addr: addr16(v), Port: portToMap(port.Port), Proto: proto}] = lbVipVal{VipId: vipID}
			}
			// With ports named, the address's other TCP and UDP ports are
			// closed: xdp_lb drops what reaches them, so no listener of the
			// node (the agent's metrics, the liveness checks, the kubelet,
			// ssh) ever answers on a VIP.
			if len(g.Ports) > 0 {
				for _, proto := range []uint8{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
					k := lbVipKey{Addr: addr16(v), Port: 0, Proto: proto}
					if _, every := p.vipKeys[k]; !every {
						p.vipKeys[k] = lbVipVal{VipId: vipID, Flags: uint32(lbVipFlagsVIP_F_CLOSED)}
					}
				}
			}
			idOf := map[netip.Addr]uint32{}
			for _, b := range g.Backends {
				if b.Down && !b.Local && len(b.MAC) != 6 {
					continue // no entry: flows that name it are picked again
				}
				a := b.Addr.Unmap()
				id, err := idFor(backendKey{vip: vipID, addr: a})
				if err != nil {
					return p, err
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
			if len(ring) > 0 && len(g.Remotes) > 0 {
				for _, r := range g.Remotes {
					a := r.Addr.Unmap()
					id, err := idFor(backendKey{vip: vipID, addr: a})
					if err != nil {
						return p, err
					}
					flags := uint16(lbBackendFlagsBACKEND_F_ACTIVE | lbBackendFlagsBACKEND_F_REMOTE)
					p.backends[id] = lbBackend{Addr: addr16(a), Mac: mac6(r.MAC), Flags: flags, VipId: vipID, Weight: 1}
					p.remotes[vipID] = append(p.remotes[vipID], remoteID{site: r.Site, addr: a, id: id})
				}
				p.handGroup[vipID] = g.Name
			}
			if len(ring) == 0 {
				continue
			}
			idByIndex := make([]uint32, len(tab.Backends))
			for i, a := range tab.Backends {
				idByIndex[i] = idOf[a]
			}
			slots := make([]uint32, len(tab.Slots))
			for i, s := range tab.Slots {
				slots[i] = idByIndex[s]
			}
			p.digests[vipID] = digest
			if n := spillSlots(g.SpillRatio, len(slots)); n > 0 {
				spill := make([]uint32, len(g.Spill))
				for i, r := range sortedRemotes(g.Spill) {
					k := backendKey{vip: vipID, addr: r.Addr.Unmap(), spill: true}
					id, err := idFor(k)
					if err != nil {
						return p, err
					}
					flags := uint16(lbBackendFlagsBACKEND_F_ACTIVE | lbBackendFlagsBACKEND_F_REMOTE | lbBackendFlagsBACKEND_F_SPILL)
					p.backends[id] = lbBackend{Addr: addr16(k.addr), Mac: mac6(r.MAC), Flags: flags, VipId: vipID, Weight: 1}
					spill[i] = id
				}
				for j, slot := range spillOrder(len(slots))[:n] {
					slots[slot] = spill[j%len(spill)]
				}
				p.digests[vipID] = fmt.Sprintf("%s+spill%d", digest, n)
			}
			p.rings[vipID] = slots
			if len(arrival.Slots) > 0 {
				a := make([]uint32, len(arrival.Slots))
				for i, s := range arrival.Slots {
					a[i] = idOf[arrival.Backends[s]]
				}
				p.arrival[vipID] = a
			}
		}
	}
	d.st.nextID = nextB
	for k, id := range ids {
		d.st.backendIDs[k] = id
		delete(d.st.retired, k)
	}
	for k, id := range d.st.retired {
		if usedB[id] {
			delete(d.st.retired, k) // another backend has it now
		}
	}
	return p, nil
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
