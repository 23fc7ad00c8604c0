package pins

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/portico-edge/portico/dataplane/bpftest"
)

// pinDir is a fresh bpffs directory, removed when the test ends.
func pinDir(t *testing.T) string {
	t.Helper()
	bpftest.Require(t)
	dir := fmt.Sprintf("/sys/fs/bpf/portico-pins-test-%08x", rand.Uint32())
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Skipf("no bpffs at /sys/fs/bpf: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// olderPin pins a map of spec as an older version would have: under its
// versioned name, or without a version (legacy), filled with n entries
// (key i, value: backend i, then zeros).
func olderPin(t *testing.T, dir string, spec *ebpf.MapSpec, legacy bool, n int) *ebpf.Map {
	t.Helper()
	m, err := ebpf.NewMap(spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	name := PinName("flows", Version(spec, ""))
	if legacy {
		name = "flows"
	}
	if err := m.Pin(filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		put(t, m, i)
	}
	return m
}

func put(t *testing.T, m *ebpf.Map, i int) {
	t.Helper()
	v := make([]byte, m.ValueSize())
	binary.NativeEndian.PutUint32(v, uint32(i+100))
	if err := m.Put(uint64(i), v); err != nil {
		t.Fatal(err)
	}
}

// backends reads the map's entries: key -> the value's first u32.
func backends(t *testing.T, m *ebpf.Map) map[uint64]uint32 {
	t.Helper()
	out := map[uint64]uint32{}
	var k uint64
	var v []byte
	it := m.Iterate()
	for it.Next(&k, &v) {
		out[k] = binary.NativeEndian.Uint32(v)
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func pinsIn(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// TestOpenCarriesState: Open over a pin of an older layout of a map keeps what
// can be kept and says what it did: the same layout is kept; a pin without a
// version of the same sizes is taken over as it is; another size copies the
// entries as they are; another value layout copies them through the
// conversion defined for it, or starts empty without one (lost, counted).
// Entries the old program adds after Open are copied by Finish, which then
// removes the older pins: only this layout's is left.
func TestOpenCarriesState(t *testing.T) {
	cur := flowSpec(4096, flowVal())
	wider := flowSpec(4096, flowVal(btf.Member{Name: "created_ns", Type: u64}))
	narrow := func(k, v []byte) ([]byte, []byte, bool) { return k, v[:16], true }
	for _, tc := range []struct {
		name    string
		old     *ebpf.MapSpec
		legacy  bool
		convert Conversions
		want    Outcome
		keep    bool // the entries are there after Open
	}{
		{"same layout", cur, false, nil, Kept, true},
		{"no version, same sizes", cur, true, nil, Adopted, true},
		{"no version, another size", flowSpec(2048, flowVal()), true, nil, Migrated, true},
		{"another size", flowSpec(2048, flowVal()), false, nil, Migrated, true},
		{"another value, converted", wider, false, Conversions{"flows": {entryOf(Version(wider, "")): narrow}}, Migrated, true},
		{"another value, no conversion", wider, false, nil, Lost, false},
		{"no version, another value", wider, true, Conversions{"flows": {entryOf(Version(wider, "")): narrow}}, Lost, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := pinDir(t)
			old := olderPin(t, dir, tc.old, tc.legacy, 50)
			set, err := Open(&ebpf.CollectionSpec{Maps: map[string]*ebpf.MapSpec{"flows": cur}},
				Options{Dir: dir, Maps: []Map{{Name: "flows", State: true, Legacy: true}}, Convert: tc.convert})
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			defer set.Close()
			r := set.Results[0]
			if r.Outcome != tc.want {
				t.Fatalf("outcome %s, want %s (%+v)", r.Outcome, tc.want, r)
			}
			m := set.Maps["flows"]
			if err := cur.Compatible(m); err != nil {
				t.Fatalf("the map Open gives does not fit the spec: %v", err)
			}
			got := backends(t, m)
			if tc.keep {
				if len(got) != 50 || got[7] != 107 {
					t.Fatalf("%d entries after Open (entry 7: backend %d), want the 50 of the older pin", len(got), got[7])
				}
			} else {
				if len(got) != 0 {
					t.Fatalf("%d entries after Open, want none", len(got))
				}
				if r.Entries != 50 {
					t.Errorf("%d entries reported lost, want 50", r.Entries)
				}
			}
			put(t, old, 60) // the old program goes on until the swap
			if err := set.Finish(); err != nil {
				t.Fatalf("finish: %v", err)
			}
			if got := backends(t, m); tc.keep && got[60] != 160 {
				t.Errorf("an entry the old program made after Open is not in the new map (backend %d)", got[60])
			}
			want := []string{PinName("flows", Version(cur, ""))}
			if got := pinsIn(t, dir); !slices.Equal(got, want) {
				t.Errorf("pins after Finish: %v, want %v", got, want)
			}
		})
	}
}

// TestOpenTwiceBeforeFinish: without a pinned link, a pin of this layout wins
// over older ones (an upgrade whose program never ran, restarted); older pins
// stay until Finish. Remove takes every layout away.
func TestOpenTwiceBeforeFinish(t *testing.T) {
	dir := pinDir(t)
	cur := flowSpec(4096, flowVal())
	olderPin(t, dir, flowSpec(2048, flowVal()), false, 10)
	spec := &ebpf.CollectionSpec{Maps: map[string]*ebpf.MapSpec{"flows": cur}}
	opts := Options{Dir: dir, Maps: []Map{{Name: "flows", State: true}}}
	first, err := Open(spec, opts)
	if err != nil {
		t.Fatal(err)
	}
	put(t, first.Maps["flows"], 30) // written by the new program
	first.Close()
	second, err := Open(spec, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if r := second.Results[0]; r.Outcome != Kept {
		t.Fatalf("the second Open: %s, want kept", r.Outcome)
	}
	if got := backends(t, second.Maps["flows"]); len(got) != 11 || got[30] != 130 {
		t.Fatalf("the second Open's map: %v, want the 10 carried over and the new one", got)
	}
	if n := len(pinsIn(t, dir)); n != 2 {
		t.Errorf("%d pins before Finish, want the older one and this layout's", n)
	}
	if err := Remove(dir, "flows"); err != nil {
		t.Fatal(err)
	}
	if got := pinsIn(t, dir); len(got) != 0 {
		t.Errorf("pins after Remove: %v", got)
	}
}
