package dataplane

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/portico-edge/portico/dataplane/pins"
)

// widerFlows pins, in place of the flows pin that d loaded, flows of a
// synthetic older layout holding the same entries: a value 8 bytes larger (a
// created_ns after last_seen_ns, zero), as a version that kept more per pin
// would have left. It returns that layout's entry version.
func widerFlows(t *testing.T, d *Dataplane) string {
	t.Helper()
	spec, err := loadLb()
	if err != nil {
		t.Fatal(err)
	}
	ms := spec.Maps[lbMapFlows].Copy()
	ms.MaxEntries, ms.Pinning = d.objs.Flows.MaxEntries(), ebpf.PinNone
	val, ok := btf.Copy(ms.Value).(*btf.Struct)
	if !ok || val.Size != 16 {
		t.Fatalf("flow_val is %v, the test expects a 16-byte struct", ms.Value)
	}
	val.Members = append(val.Members, btf.Member{Name: "created_ns", Type: &btf.Int{Name: "__u64", Size: 8}, Offset: 128})
	val.Size, ms.Value, ms.ValueSize = 24, val, 24
	old, err := ebpf.NewMap(ms)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	var k lbFlowKey
	var v []byte
	it := d.objs.Flows.Iterate()
	for it.Next(&k, &v) {
		if err := old.Put(&k, append(slices.Clone(v), make([]byte, 8)...)); err != nil {
			t.Fatal(err)
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	version := pins.Version(ms, "")
	if err := old.Pin(filepath.Join(d.opts.PinPath, pins.PinName(lbMapFlows, version))); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(pinOf(t, d, lbMapFlows)); err != nil {
		t.Fatal(err)
	}
	entry, _, _ := strings.Cut(version, "-")
	return entry
}

// TestUpgradeCarriesPinnedFlows: an agent started over pins whose flows map has
// another layout comes up, and a flow pinned across a ring change (its ring
// moved it; the transition is over) still goes to its replica where the
// upgrade can carry the pin: flows of another size (copied as they are), or of
// a larger value that a conversion defines. Without a conversion the agent
// comes up all the same, reports the pins lost, and the flow follows the
// current ring. Either way the first Apply swaps no ring, and only one pin per
// map is left.
func TestUpgradeCarriesPinnedFlows(t *testing.T) {
	a, b := []Backend{r1, r2}, []Backend{r1, r2, r4}
	for _, tc := range []struct {
		name    string
		entries uint32 // the upgraded agent's FlowEntries
		wider   bool   // flows of the synthetic older layout
		convert bool   // ... with a conversion
		want    pins.Outcome
		to      Backend // where the pinned flow goes after the upgrade
	}{
		{"the same layout", 4096, false, false, pins.Kept, r2},
		{"flows of another size", 8192, false, false, pins.Migrated, r2},
		{"a larger flow value, converted", 4096, true, true, pins.Migrated, r2},
		{"a larger flow value, no conversion", 4096, true, false, pins.Lost, r4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dr := newDirector(t, "old")
			dr.apply(t, desired(a...))
			// A UDP flow whose slot the change moves, pinned in flows to the
			// replica that reports holding it (as agents do: PinHeld).
			older := flowWhereOf(t, udp4, 42000, [][]Backend{a, b}, r2, r4)
			dr.apply(t, desired(b...))
			if n, err := dr.d.PinHeld([]Held{{Flow: flowOf(older), Holder: r2.Addr}}); err != nil || n != 1 {
				t.Fatalf("PinHeld wrote %d pins (%v), want 1", n, err)
			}
			if got := dr.send(t, older, b...); got.Addr != r2.Addr {
				t.Fatalf("before the upgrade the older flow went to %s, want %s", got.Addr, r2.Addr)
			}
			dr.endTransitions(t)
			if got := dr.send(t, older, b...); got.Addr != r2.Addr {
				t.Fatalf("after the transition the older flow went to %s, want %s (its pin)", got.Addr, r2.Addr)
			}
			if pinned, _ := dr.state(t); pinned != 1 {
				t.Fatalf("%d pinned flows before the upgrade, want 1", pinned)
			}
			if tc.wider {
				entry := widerFlows(t, dr.d)
				if tc.convert {
					conversions[lbMapFlows] = map[string]pins.Convert{entry: func(k, v []byte) ([]byte, []byte, bool) { return k, v[:16], true }}
					t.Cleanup(func() { delete(conversions, lbMapFlows) })
				}
			}
			dr.d.Close()

			up, err := Load(Options{PinPath: dr.d.opts.PinPath, RingSize: testRing, FlowEntries: tc.entries})
			if err != nil {
				t.Fatalf("the upgraded agent does not start: %v", err)
			}
			defer up.Close()
			if err := up.SetMAC(nicMAC); err != nil {
				t.Fatal(err)
			}
			for _, r := range up.PinnedMaps() {
				want := pins.Kept
				if r.Map == lbMapFlows {
					want = tc.want
				}
				if r.Outcome != want {
					t.Errorf("map %s: %s, want %s (%+v)", r.Map, r.Outcome, want, r)
				}
			}
			ud := director{"upgraded", up}
			if got := ud.send(t, older, b...); got.Addr != tc.to.Addr {
				t.Errorf("after the upgrade the pinned flow went to %s, want %s", got.Addr, tc.to.Addr)
			}
			if stats, err := up.Apply(desired(b...)); err != nil || stats.Rings != 0 {
				t.Errorf("the first Apply after the upgrade: %d rings swapped (%v), want none", stats.Rings, err)
			}
			ents, err := os.ReadDir(up.opts.PinPath)
			if err != nil {
				t.Fatal(err)
			}
			var flows []string
			for _, e := range ents {
				if strings.HasPrefix(e.Name(), lbMapFlows) {
					flows = append(flows, e.Name())
				}
			}
			if len(flows) != 1 || filepath.Join(up.opts.PinPath, flows[0]) != pinOf(t, up, lbMapFlows) {
				t.Errorf("flows pins after the upgrade: %v, want only %s", flows, pinOf(t, up, lbMapFlows))
			}
		})
	}
}

// TestPreviousReleaseLayouts: every pinned map of the previous release's
// object (testdata/previous, the last release's committed bpf2go object) that
// holds state either has this version's entry layout, so an upgrade keeps or
// copies its entries, or a conversion from it; a map listed here loses its
// state on that upgrade, and the list says why. A change to lb_types.h that
// reaches a pinned map fails here until one of the two is written.
func TestPreviousReleaseLayouts(t *testing.T) {
	lost := map[string]string{} // map -> why its state may go
	prev, err := ebpf.LoadCollectionSpec("testdata/previous/lb_bpfel.o")
	if err != nil {
		t.Fatal(err)
	}
	cur, err := loadLb()
	if err != nil {
		t.Fatal(err)
	}
	entry := func(spec *ebpf.CollectionSpec, m pins.Map) string {
		ms := spec.Maps[m.Name].Copy()
		for _, outer := range []string{lbMapRings, lbMapPrevRings, lbMapMidRings} {
			if m.Name == outer {
				ms.InnerMap.MaxEntries = uint32(ringElems(DefaultRingSize))
			}
		}
		e, _, _ := strings.Cut(pins.Version(ms, m.Meaning), "-")
		return e
	}
	for _, m := range pinnedMaps(Options{RingSize: DefaultRingSize}, true) {
		if _, ok := prev.Maps[m.Name]; !ok {
			continue // new in this version
		}
		was, is := entry(prev, m), entry(cur, m)
		switch {
		case !m.State, was == is, conversions[m.Name][was] != nil:
		case lost[m.Name] != "":
			t.Logf("map %s: the previous release's layout %s has no conversion: %s", m.Name, was, lost[m.Name])
		default:
			t.Errorf("map %s: the previous release's entries (layout %s) are neither this version's (%s) nor converted: "+
				"write a conversion in conversions, or say in this test why its state may go", m.Name, was, is)
		}
	}
}
