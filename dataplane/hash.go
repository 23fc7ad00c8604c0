package dataplane

import (
	"math/bits"
	"net/netip"
)

// Flow identifies a connection as the client sent it.
type Flow struct {
	Src, Dst     netip.Addr
	SPort, DPort uint16
	Protocol     uint8 // IPPROTO_TCP (6) or IPPROTO_UDP (17)
}

func (f Flow) key() lbFlowKey {
	return lbFlowKey{
		Src:   addr16(f.Src),
		Dst:   addr16(f.Dst),
		Sport: portToMap(f.SPort),
		Dport: portToMap(f.DPort),
		Proto: f.Protocol,
	}
}

func flowFromKey(k lbFlowKey) Flow {
	return Flow{
		Src:      addrFrom16(k.Src),
		Dst:      addrFrom16(k.Dst),
		SPort:    portFromMap(k.Sport),
		DPort:    portFromMap(k.Dport),
		Protocol: k.Proto,
	}
}

// FlowHash is the hash xdp_lb computes for a new flow (bpf/hash.h): murmur3's
// 32-bit mixing over the flow key, seeded with the cluster-wide seed. The ring slot
// of a flow is FlowHash(f, seed) % ring size.
func FlowHash(f Flow, seed uint32) uint32 {
	words := flowKeyWords(f.key())
	h := seed
	for _, k := range words {
		k *= 0xcc9e2d51
		k = bits.RotateLeft32(k, 15)
		k *= 0x1b873593
		h ^= k
		h = bits.RotateLeft32(h, 13)
		h = h*5 + 0xe6546b64
	}
	h ^= uint32(4 * len(words)) // the key's size in bytes
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}
