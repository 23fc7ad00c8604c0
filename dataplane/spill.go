package dataplane

import (
	"cmp"
	"slices"
)

// MaxSpill is the highest Group.SpillRatio: a site keeps at least a tenth of its
// new connections.
const MaxSpill = 0.9

// spillSlots is how many of a ring's slots a spill ratio takes.
func spillSlots(ratio float64, size int) int {
	if ratio <= 0 {
		return 0
	}
	return min(int(ratio*float64(size)+0.5), size)
}

// spillOrder is the order in which a ring's slots spill: a fixed pseudo-random
// permutation of the slot indices (the same on every node, for every ratio), so
// that the slots a ratio spills are spread over the ring and a higher ratio
// spills the same ones and more.
func spillOrder(size int) []int {
	order := make([]int, size)
	keys := make([]uint32, size)
	for i := range order {
		order[i] = i
		x := uint32(i) * 0x9e3779b1
		x ^= x >> 15
		x *= 0x85ebca6b
		x ^= x >> 13
		keys[i] = x
	}
	slices.SortFunc(order, func(a, b int) int {
		if keys[a] != keys[b] {
			return cmp.Compare(keys[a], keys[b])
		}
		return cmp.Compare(a, b)
	})
	return order
}

// sortedRemotes is rs by address.
func sortedRemotes(rs []Remote) []Remote {
	out := slices.Clone(rs)
	slices.SortFunc(out, func(a, b Remote) int { return a.Addr.Compare(b.Addr) })
	return out
}

// addSpill gives n of a VIP's ring slots, the first n in spillOrder, to the
// group's spill edges (by address, in turn), with a backend for each.
func (p *plan) addSpill(g Group, vipID uint32, slots []uint32, n int, ids *backendIDs) error {
	spill := make([]uint32, len(g.Spill))
	for i, r := range sortedRemotes(g.Spill) {
		k := backendKey{vip: vipID, addr: r.Addr.Unmap(), spill: true}
		id, err := ids.idFor(k)
		if err != nil {
			return err
		}
		flags := uint16(lbBackendFlagsBACKEND_F_ACTIVE | lbBackendFlagsBACKEND_F_REMOTE | lbBackendFlagsBACKEND_F_SPILL)
		p.backends[id] = lbBackend{Addr: addr16(k.addr), Mac: mac6(r.MAC), Flags: flags, VipId: vipID, Weight: 1}
		spill[i] = id
	}
	for j, slot := range spillOrder(len(slots))[:n] {
		slots[slot] = spill[j%len(spill)]
	}
	return nil
}
