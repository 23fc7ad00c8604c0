package pins

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

var (
	u32 = &btf.Int{Name: "__u32", Size: 4}
	u64 = &btf.Int{Name: "__u64", Size: 8}
)

// flowVal is a value type: backend u32, hop u32, seen u64, and extra members.
func flowVal(extra ...btf.Member) *btf.Struct {
	ms := []btf.Member{{Name: "backend_id", Type: u32}, {Name: "hop", Type: u32, Offset: 32}, {Name: "last_seen_ns", Type: u64, Offset: 64}}
	size := uint32(16)
	for _, m := range extra {
		m.Offset = btf.Bits(size * 8)
		ms = append(ms, m)
		size += 8
	}
	return &btf.Struct{Name: "flow_val", Size: size, Members: ms}
}

func flowSpec(max uint32, val *btf.Struct) *ebpf.MapSpec {
	return &ebpf.MapSpec{Name: "flows", Type: ebpf.LRUHash, KeySize: 8, ValueSize: val.Size, MaxEntries: max,
		Key: u64, Value: val}
}

// TestVersion: a map's version changes with every change of its entries'
// layout (a member added, renamed or moved, a size, an inner map, the meaning
// the code gives it) in its first part, and with its type, size or flags in
// its second; names of types and typedefs, and values appended to an enum,
// change nothing.
func TestVersion(t *testing.T) {
	base := flowSpec(4096, flowVal())
	entry := func(v string) string { return entryOf(v) }
	shape := func(v string) string { return v[len(entryOf(v))+1:] }
	b := Version(base, "")
	if len(b) != 17 {
		t.Fatalf("version %q: want <8 hex>-<8 hex>", b)
	}
	renamed := flowVal()
	renamed.Members[1].Name = "class"
	typedef := flowVal()
	typedef.Name = "flow_value"
	typedef.Members[0].Type = &btf.Typedef{Name: "backend_id_t", Type: u32}
	for _, tc := range []struct {
		name                 string
		spec                 *ebpf.MapSpec
		meaning              string
		sameEntry, sameShape bool
	}{
		{"same spec", flowSpec(4096, flowVal()), "", true, true},
		{"type and typedef names", flowSpec(4096, typedef), "", true, true},
		{"max entries", flowSpec(8192, flowVal()), "", true, false},
		{"a member added", flowSpec(4096, flowVal(btf.Member{Name: "created_ns", Type: u64})), "", false, true},
		{"a member renamed", flowSpec(4096, renamed), "", false, true},
		{"what an entry means", flowSpec(4096, flowVal()), "pins by class", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := Version(tc.spec, tc.meaning)
			if got := entry(v) == entry(b); got != tc.sameEntry {
				t.Errorf("entry version %s against %s: same = %v, want %v", v, b, got, tc.sameEntry)
			}
			if got := shape(v) == shape(b); got != tc.sameShape {
				t.Errorf("shape version %s against %s: same = %v, want %v", v, b, got, tc.sameShape)
			}
		})
	}

	enum := func(values ...string) *ebpf.MapSpec {
		e := &btf.Enum{Name: "reason", Size: 4}
		for i, v := range values {
			e.Values = append(e.Values, btf.EnumValue{Name: v, Value: uint64(i)})
		}
		return &ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: 32, Key: e, Value: u64}
	}
	if a, b := Version(enum("A", "B"), ""), Version(enum("A", "B", "C"), ""); a != b {
		t.Errorf("a value appended to the key's enum changed the version: %s, %s", a, b)
	}

	ring := func(elems uint32) *ebpf.MapSpec {
		return &ebpf.MapSpec{Type: ebpf.ArrayOfMaps, KeySize: 4, ValueSize: 4, MaxEntries: 256, Key: u32,
			InnerMap: &ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 64, MaxEntries: elems, Flags: 1 << 10}}
	}
	if a, b := Version(ring(129), ""), Version(ring(511), ""); entryOf(a) == entryOf(b) {
		t.Errorf("rings of another size have the same entry version %s", entryOf(a))
	}
}
