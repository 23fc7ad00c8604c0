package dataplane

import (
	"encoding/binary"
	"testing"
)

// TestMapSizesMatchGoTypes needs no privileges: it parses the embedded object and
// checks that every map's key and value sizes match the Go types that read and
// write it, so C and Go cannot drift apart unnoticed.
func TestMapSizesMatchGoTypes(t *testing.T) {
	spec, err := loadLb()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name       string
		key, value any
	}{
		{lbMapVips, lbVipKey{}, lbVipVal{}},
		{lbMapRings, uint32(0), uint32(0)},     // value: an inner map fd
		{lbMapPrevRings, uint32(0), uint32(0)}, // value: an inner map fd
		{lbMapMidRings, uint32(0), uint32(0)},  // value: an inner map fd
		{lbMapRingsMeta, uint32(0), lbRingMeta{}},
		{lbMapRingChanged, uint32(0), uint64(0)},
		{lbMapNewPins, lbFlowKey{}, lbFlowVal{}},
		{lbMapPinClock, uint32(0), uint64(0)},
		{lbMapRelayClock, uint32(0), uint64(0)},
		{lbMapBackends, uint32(0), lbBackend{}},
		{lbMapFlows, lbFlowKey{}, lbFlowVal{}},
		{lbMapFlowCache, uint32(0), lbFlowCacheEntry{}},
		{lbMapLbCfg, uint32(0), lbLbConfig{}},
		{lbMapVipStats, uint32(0), lbVipCounters{}},
		{lbMapBackendStats, uint32(0), lbBackendCounters{}},
		{lbMapReasonStats, lbReason(0), uint64(0)},
		{lbMapPeers, lbPeerKey{}, uint32(0)},
		{lbMapSitePeers, lbSitePeerKey{}, uint32(0)},
		{lbMapTunnel, uint32(0), lbTunnelCfg{}},
		{lbMapSrcMacs, uint32(0), [12]byte{}},  // struct mac_verdict: BPF-only
		{lbMapVipMemos, uint32(0), [36]byte{}}, // struct vip_memo: BPF-only
		{lbMapSockModel, lbFlowKey{}, uint32(0)},
		{lbMapChains, uint32(0), [216]byte{}}, // struct chain: BPF-only
		{lbMapSelfAddr, uint32(0), lbSelfAddr{}},
		{lbMapTagMacs, uint32(0), lbTagMac{}},
		{lbMapMacTags, lbPeerKey{}, uint32(0)},
		{lbMapHeldClock, uint32(0), uint64(0)},
		{lbMapUdpSeen, lbFlowKey{}, lbUdpSeenVal{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, ok := spec.Maps[tc.name]
			if !ok {
				t.Fatalf("map %s not in the object", tc.name)
			}
			if got, want := int(m.KeySize), binary.Size(tc.key); got != want {
				t.Errorf("key size %d, Go type %T has %d", got, tc.key, want)
			}
			if got, want := int(m.ValueSize), binary.Size(tc.value); got != want {
				t.Errorf("value size %d, Go type %T has %d", got, tc.value, want)
			}
			if len(m.Name) > 15 {
				t.Errorf("name %q longer than 15 characters: bpftool would truncate it", m.Name)
			}
		})
	}
	for _, outer := range []string{lbMapRings, lbMapPrevRings, lbMapMidRings} {
		inner := spec.Maps[outer].InnerMap
		if inner == nil || inner.KeySize != 4 || int(inner.ValueSize) != ringElemSize {
			t.Errorf("%s inner map: %+v, want u32 -> %d slots of 16 bits", outer, inner, ringChunk)
		}
	}
	// Every map the object defines is covered above (.bss holds only the
	// BTF anchors for enums, .rodata the load-time constants).
	if n := len(spec.Maps); n != len(cases)+2 {
		t.Errorf("object has %d maps, the test covers %d plus .bss and .rodata", n, len(cases))
	}
}

func TestReasonNamesFromBTF(t *testing.T) {
	if got := ReasonName(lbReasonREASON_ICMP_STEERED); got != "icmp_steered" {
		t.Errorf("ReasonName(ICMP_STEERED) = %q", got)
	}
	seen := map[string]bool{}
	for r := range ReasonCount {
		n := ReasonName(Reason(r))
		if seen[n] {
			t.Errorf("reason name %q twice", n)
		}
		seen[n] = true
	}
}
