package dataplane

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"slices"
)

// DefaultRingSize is the number of slots in a Maglev table: a prime, as the
// population algorithm needs. Maglev gives every backend of equal weight ⌊m/n⌋ or
// ⌈m/n⌉ slots, so 4099 slots share out within 1% among up to 40 replicas of a VIP
// and within 2.5% among 100 (agent --ring-size raises it: 16381 is Cilium's
// default, 65537 Katran's). Small on purpose: a new flow reads one random slot, and
// the packed ring (16-bit ids) of 8 KB stays in cache where one of 65537 slots
// does not (bpf/README.md has the numbers). It is the size the rings map is
// compiled with (LB_DEFAULT_RING).
const DefaultRingSize = uint32(lbLbLimitsLB_DEFAULT_RING)

// A ring map element holds ringChunk slots of 16-bit backend ids (LB_RING_CHUNK).
const (
	ringChunk    = int(lbLbLimitsLB_RING_CHUNK)
	ringElemSize = 2 * ringChunk
)

// Backend ids must fit a ring's 16-bit slots.
var _ = [1]struct{}{}[lbLbLimitsLB_MAX_BACKENDS>>16]

// ringElems is the number of elements of a ring map of size slots.
func ringElems(size uint32) int { return (int(size) + ringChunk - 1) / ringChunk }

// packRing lays slots out as a ring map's memory: little-endian 16-bit ids,
// element after element.
func packRing(slots []uint32) []byte {
	buf := make([]byte, ringElems(uint32(len(slots)))*ringElemSize)
	for i, s := range slots {
		binary.LittleEndian.PutUint16(buf[2*i:], uint16(s))
	}
	return buf
}

// unpackRing reads size slots back from a ring map's memory.
func unpackRing(packed []byte, size uint32) []uint32 {
	out := make([]uint32, size)
	for i := range out {
		out[i] = uint32(binary.LittleEndian.Uint16(packed[2*i:])) &^ uint32(lbLbLimitsLB_SLOT_MOVED)
	}
	return out
}

// MaglevBackend is one entry of a Maglev table's input.
type MaglevBackend struct {
	Addr   netip.Addr
	Weight uint32 // relative share; 0 counts as 1
}

// Table is a Maglev lookup table: Slots[i] is an index into Backends. Backends are
// sorted by address, so every node that builds a table from the same set gets the
// same bytes, whatever order the set came in.
type Table struct {
	Backends []netip.Addr
	Slots    []uint32
}

// BuildTable populates a Maglev table of size m (a prime) with the paper's
// algorithm (Eisenbud et al., NSDI '16, §3.4), extended with weights: in each round
// a backend earns its weight in credit and claims its next preferred empty slot for
// every max-weight of credit it holds, so slot counts follow the weights.
func BuildTable(in []MaglevBackend, m uint32) (Table, error) {
	if m < 2 || !big.NewInt(int64(m)).ProbablyPrime(20) {
		return Table{}, fmt.Errorf("maglev table size %d is not a prime", m)
	}
	if len(in) == 0 {
		return Table{}, errors.New("maglev table needs at least one backend")
	}
	if uint32(len(in)) > m {
		return Table{}, fmt.Errorf("maglev table of %d slots cannot hold %d backends", m, len(in))
	}
	bs := slices.Clone(in)
	slices.SortFunc(bs, func(a, b MaglevBackend) int { return a.Addr.Compare(b.Addr) })
	for i := 1; i < len(bs); i++ {
		if bs[i].Addr == bs[i-1].Addr {
			return Table{}, fmt.Errorf("maglev backend %s listed twice", bs[i].Addr)
		}
	}

	n := len(bs)
	offset := make([]uint64, n)
	skip := make([]uint64, n)
	weight := make([]uint64, n)
	var maxW uint64
	for i, b := range bs {
		offset[i], skip[i] = permutation(b.Addr, uint64(m))
		weight[i] = max(uint64(b.Weight), 1)
		maxW = max(maxW, weight[i])
	}

	const empty = ^uint32(0)
	slots := make([]uint32, m)
	for i := range slots {
		slots[i] = empty
	}
	next := make([]uint64, n)   // how far each backend has walked its permutation
	credit := make([]uint64, n) // weight earned and not yet spent
	mm := uint64(m)
	for filled := uint32(0); filled < m; {
		for i := 0; i < n && filled < m; i++ {
			credit[i] += weight[i]
			for credit[i] >= maxW && filled < m {
				credit[i] -= maxW
				c := (offset[i] + next[i]*skip[i]) % mm
				for slots[c] != empty {
					next[i]++
					c = (offset[i] + next[i]*skip[i]) % mm
				}
				slots[c] = uint32(i)
				next[i]++
				filled++
			}
		}
	}
	addrs := make([]netip.Addr, n)
	for i, b := range bs {
		addrs[i] = b.Addr
	}
	return Table{Backends: addrs, Slots: slots}, nil
}

// permutation derives a backend's (offset, skip) from its address alone, with
// fixed seeds, so it is the same on every node and for every run.
func permutation(a netip.Addr, m uint64) (offset, skip uint64) {
	b := a.As16()
	sum := sha256.Sum256(append([]byte("portico-maglev-v1"), b[:]...))
	offset = binary.LittleEndian.Uint64(sum[0:8]) % m
	skip = binary.LittleEndian.Uint64(sum[8:16])%(m-1) + 1
	return offset, skip
}

// Shares counts the slots each backend holds, in Backends order.
func (t Table) Shares() []int {
	counts := make([]int, len(t.Backends))
	for _, s := range t.Slots {
		counts[s]++
	}
	return counts
}

// Digest identifies a table's content: SHA-256 over each slot's backend address (16
// bytes, IPv4-mapped), shortened to 16 hex digits. Two nodes with equal digests
// send every flow to the same replica. DigestOf computes the same value from the
// addresses a pinned ring resolves to.
// Fill keeps every slot of t whose backend serves and gives each other slot
// (a draining or dead backend's) to fallback's backend for that slot. With
// fallback built from the serving backends, a flow on a serving backend keeps
// its slot whatever happens to the others: a director that never saw it still
// makes the same choice. Both tables must have the same size.
func (t Table) Fill(serves func(netip.Addr) bool, fallback Table) Table {
	index := map[netip.Addr]uint32{}
	for i, a := range t.Backends {
		index[a] = uint32(i)
	}
	out := Table{Backends: t.Backends, Slots: make([]uint32, len(t.Slots))}
	for i, s := range t.Slots {
		if serves(t.Backends[s]) {
			out.Slots[i] = s
		} else {
			out.Slots[i] = index[fallback.Backends[fallback.Slots[i]]]
		}
	}
	return out
}

func (t Table) Digest() string {
	addrs := make([]netip.Addr, len(t.Slots))
	for i, s := range t.Slots {
		addrs[i] = t.Backends[s]
	}
	return DigestOf(addrs)
}

// DigestOf is Table.Digest for a table given as one address per slot.
func DigestOf(slots []netip.Addr) string {
	h := sha256.New()
	for _, a := range slots {
		b := a.As16()
		h.Write(b[:])
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}
