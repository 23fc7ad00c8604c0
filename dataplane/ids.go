package dataplane

import (
	"fmt"
	"net/netip"
	"slices"
)

// assignVIPIDs gives each VIP address of want (groupOf's keys) its id: the one
// it has in the maps, or for a new VIP the lowest free id.
func (d *Dataplane) assignVIPIDs(groupOf map[netip.Addr]string) (map[netip.Addr]uint32, error) {
	ids := map[netip.Addr]uint32{}
	used := map[uint32]bool{}
	for a := range groupOf {
		if id, ok := d.st.vipIDs[a]; ok {
			ids[a] = id
			used[id] = true
		}
	}
	newVIPs := []netip.Addr{}
	for a := range groupOf {
		if _, ok := ids[a]; !ok {
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
			return ids, fmt.Errorf("more than %d VIP addresses", lbLbLimitsLB_MAX_VIPS)
		}
		ids[a] = next
		used[next] = true
	}
	return ids, nil
}

// backendIDs assigns the backend ids of one plan: one per (VIP, replica), kept
// while the pair exists, new ones taken round-robin so a freed id is not reused
// soon (flows may still name it). It writes to the applied state only in
// reserve, once the whole plan is valid.
type backendIDs struct {
	st      *applied
	ids     map[backendKey]uint32 // the plan's keys so far, with their ids
	used    map[uint32]bool
	retired map[uint32]bool // the ids a removed backend may want back
	next    uint32          // where the round-robin search goes on
}

// newBackendIDs starts the backend ids of a plan for want, whose VIPs have
// the ids vipIDs: every key want keeps has its id already.
func (d *Dataplane) newBackendIDs(want Desired, vipIDs map[netip.Addr]uint32) *backendIDs {
	b := &backendIDs{st: &d.st, ids: map[backendKey]uint32{}, used: map[uint32]bool{}, retired: map[uint32]bool{}, next: d.st.nextID}
	for _, g := range want.Groups {
		for _, v := range g.VIPs {
			for _, k := range g.keys(vipIDs[v.Unmap()]) {
				if id, ok := d.st.backendIDs[k]; ok {
					b.ids[k] = id
					b.used[id] = true
				}
			}
		}
	}
	for _, id := range d.st.retired {
		b.retired[id] = true
	}
	return b
}

// alloc takes a free id: first one no removed backend may want back; one that
// may, if none is left.
func (b *backendIDs) alloc() (uint32, error) {
	for _, spare := range []bool{false, true} {
		for range lbLbLimitsLB_MAX_BACKENDS {
			id := b.next
			b.next++
			if b.next >= uint32(lbLbLimitsLB_MAX_BACKENDS) {
				b.next = 1
			}
			if !b.used[id] && b.st.backends[id] == (lbBackend{}) && (spare || !b.retired[id]) {
				b.used[id] = true
				return id, nil
			}
		}
	}
	return 0, fmt.Errorf("more than %d backends", lbLbLimitsLB_MAX_BACKENDS-1)
}

// idFor is a key's backend id: the one it has, the one it had when it was
// removed if no other has taken it, or a new one.
func (b *backendIDs) idFor(k backendKey) (uint32, error) {
	if id, ok := b.ids[k]; ok {
		return id, nil
	}
	if id, ok := b.st.retired[k]; ok && !b.used[id] && b.st.backends[id] == (lbBackend{}) {
		b.used[id] = true
		b.ids[k] = id
		return id, nil
	}
	id, err := b.alloc()
	if err == nil {
		b.ids[k] = id
	}
	return id, err
}

// reserve records the plan's ids in the applied state: a removed backend that
// came back, or whose id another took, is retired no more.
func (b *backendIDs) reserve() {
	b.st.nextID = b.next
	for k, id := range b.ids {
		b.st.backendIDs[k] = id
		delete(b.st.retired, k)
	}
	for k, id := range b.st.retired {
		if b.used[id] {
			delete(b.st.retired, k) // another backend has it now
		}
	}
}
