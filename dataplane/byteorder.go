package dataplane

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
)

// This file is the only place that knows how the maps lay out addresses and ports:
// addresses are 16 bytes (IPv4 as IPv4-mapped IPv6), ports are in network byte order
// in memory, and the generated Go structs hold those bytes read as host-order
// (little-endian) integers.

// addr16 returns a as the 16 bytes the maps use.
func addr16(a netip.Addr) [16]byte {
	return a.As16()
}

// addrFrom16 turns map bytes back into an address, unmapping IPv4.
func addrFrom16(b [16]byte) netip.Addr {
	return netip.AddrFrom16(b).Unmap()
}

// portToMap converts a port to the value a generated struct field must hold so
// that its bytes in memory are the port in network byte order.
func portToMap(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.LittleEndian.Uint16(b[:])
}

// portFromMap is the inverse of portToMap.
func portFromMap(v uint16) uint16 {
	var b [2]byte
	binary.LittleEndian.PutUint16(b[:], v)
	return binary.BigEndian.Uint16(b[:])
}

func mac6(m net.HardwareAddr) [6]byte {
	var out [6]byte
	copy(out[:], m)
	return out
}

// flowKeyWords returns the flow key as the little-endian words the BPF hash reads:
// the key's bytes in memory, laid out as the generated struct (and so struct
// flow_key) lays them out.
func flowKeyWords(k lbFlowKey) []uint32 {
	b, err := binary.Append(nil, binary.LittleEndian, k)
	if err != nil {
		panic(fmt.Sprintf("encode flow key: %v", err)) // a fixed-size struct always encodes
	}
	w := make([]uint32, len(b)/4)
	for i := range w {
		w[i] = binary.LittleEndian.Uint32(b[i*4:])
	}
	return w
}
