package dataplane

import (
	"fmt"
	"net/netip"
	"time"
)

// recover rebuilds the id assignments from the pinned maps, so a restarted agent
// keeps every VIP and backend id (and with them the flow table) as it was.
func (d *Dataplane) recover() error {
	st := applied{
		vipIDs:     map[netip.Addr]uint32{},
		vipKeys:    map[lbVipKey]lbVipVal{},
		backendIDs: map[backendKey]uint32{},
		retired:    map[backendKey]uint32{},
		backends:   map[uint32]lbBackend{},
		rings:      map[uint32][]uint32{},
		prevUntil:  map[uint32]time.Duration{},
		prevSlots:  map[uint32][]uint32{},
		midSlots:   map[uint32][][]uint32{},
		midHead:    map[uint32]uint32{},
		digests:    map[uint32]string{},
		peers:      map[lbPeerKey]bool{},
		sitePeers:  map[lbSitePeerKey]bool{},
		nextID:     1,
		remotes:    map[uint32][]remoteID{},
		handGroup:  map[uint32]string{},
		handing:    map[uint32][]uint32{},
	}
	pinned, err := d.maps().read()
	if err != nil {
		return err
	}
	var pk lbPeerKey
	var pv uint32
	for it := d.objs.Peers.Iterate(); it.Next(&pk, &pv); {
		st.peers[pk] = true
	}
	var sk lbSitePeerKey
	for it := d.objs.SitePeers.Iterate(); it.Next(&sk, &pv); {
		st.sitePeers[sk] = true
	}
	var tc lbTunnelCfg
	if err := d.objs.Tunnel.Lookup(uint32(0), &tc); err != nil {
		return fmt.Errorf("read map tunnel: %w", err)
	}
	if tc.Src4 != [4]byte{} {
		st.tunnel = netip.AddrFrom4(tc.Src4)
	}
	for vk, vv := range pinned.vips {
		st.vipKeys[vk] = vv
		st.vipIDs[addrFrom16(vk.Addr)] = vv.VipId
	}
	for id, be := range pinned.backends {
		st.backends[id] = be
		st.backendIDs[keyOf(be)] = id
		st.nextID = max(st.nextID, id+1)
		// The other sites' edges this node sends to are the ones it takes
		// tunnel traffic from: known before the first Apply (an upgrade from
		// a version without site_peers finds it empty).
		if a := addrFrom16(be.Addr); be.Flags&uint16(lbBackendFlagsBACKEND_F_REMOTE) != 0 && a.Is4() {
			k := lbSitePeerKey{Addr: a.As4()}
			if !st.sitePeers[k] {
				if err := d.objs.SitePeers.Put(&k, uint32(1)); err != nil {
					return fmt.Errorf("update map site_peers: %w", err)
				}
				st.sitePeers[k] = true
			}
		}
	}
	// A replica removed before the restart gets its id back when it returns,
	// as it would have from this process: the rings of a transition name it
	// by that id (Apply keeps a removed backend's address in its cleared entry).
	for id, be := range pinned.retired {
		if _, taken := st.backendIDs[keyOf(be)]; !taken {
			st.retired[keyOf(be)] = id
		}
	}
	// Where this node stands in the order chains are walked, from the start
	// (self_addr is not pinned): its local replica's address.
	for _, be := range pinned.backends {
		if be.Flags&uint16(lbBackendFlagsBACKEND_F_LOCAL) != 0 {
			self := addrFrom16(be.Addr)
			if err := d.setSelf(&st, self, tagsExact(self, pinned.backends), false); err != nil {
				return err
			}
			break
		}
	}
	if st.nextID >= uint32(lbLbLimitsLB_MAX_BACKENDS) {
		st.nextID = 1
	}
	// Rings are read back, so the first Apply swaps only a ring that really
	// changes: a restart must not start a transition (or cut one short by making
	// the current ring the previous one).
	for _, id := range st.vipIDs {
		slots, err := d.maps().ring(id, d.opts.RingSize)
		if err != nil {
			return err
		}
		if slots != nil {
			st.rings[id] = slots
		}
		var m lbRingMeta
		if err := d.objs.RingsMeta.Lookup(id, &m); err != nil {
			return fmt.Errorf("read map rings_meta: %w", err)
		}
		if m.PrevUntilNs != 0 {
			st.prevUntil[id] = time.Duration(m.PrevUntilNs)
			// The transition's history, so that the next ring marks its
			// moved slots right.
			if st.prevSlots[id], err = readRing(d.objs.PrevRings, id, d.opts.RingSize); err != nil {
				return err
			}
			st.midHead[id] = m.MidHead % uint32(lbLbLimitsLB_MID_RINGS)
			for k := range min(int(m.MidCount), int(lbLbLimitsLB_MID_RINGS)) {
				mid, err := readRing(d.objs.MidRings, midKey(id, midPlace(st.midHead[id], k)), d.opts.RingSize)
				if err != nil {
					return err
				}
				if mid == nil {
					break
				}
				st.midSlots[id] = append(st.midSlots[id], mid)
			}
		}
	}
	d.st = st
	return nil
}
