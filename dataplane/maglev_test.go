package dataplane

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

func backendsN(n int) []MaglevBackend {
	bs := make([]MaglevBackend, n)
	for i := range bs {
		bs[i] = MaglevBackend{Addr: netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 7}), Weight: 1}
	}
	return bs
}

func TestBuildTableRejectsBadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []MaglevBackend
		m    uint32
	}{
		{"not prime", backendsN(3), 65536},
		{"no backends", nil, 65537},
		{"more backends than slots", backendsN(8), 7},
		{"duplicate", append(backendsN(2), backendsN(1)...), 65537},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := BuildTable(tc.in, tc.m); err == nil {
				t.Fatal("BuildTable succeeded, want an error")
			}
		})
	}
}

func TestTableIndependentOfInputOrder(t *testing.T) {
	in := backendsN(37)
	in[5].Weight = 3
	want, err := BuildTable(in, DefaultRingSize)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 5 {
		shuffled := slices.Clone(in)
		r.Shuffle(len(shuffled), func(a, b int) { shuffled[a], shuffled[b] = shuffled[b], shuffled[a] })
		got, err := BuildTable(shuffled, DefaultRingSize)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.Slots, want.Slots) || got.Digest() != want.Digest() {
			t.Fatalf("shuffle %d: table differs from the sorted input's", i)
		}
	}
}

func TestTableBalance(t *testing.T) {
	for _, n := range []int{1, 2, 3, 10, 50, 100} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			tab, err := BuildTable(backendsN(n), DefaultRingSize)
			if err != nil {
				t.Fatal(err)
			}
			// Maglev's guarantee for equal weights: every backend gets
			// ⌊m/n⌋ or ⌈m/n⌉ slots.
			shares := tab.Shares()
			lo, hi := slices.Min(shares), slices.Max(shares)
			m := int(DefaultRingSize)
			if lo < m/n || hi > (m+n-1)/n {
				t.Fatalf("slots per backend %d..%d, want %d..%d", lo, hi, m/n, (m+n-1)/n)
			}
		})
	}
}

// Removing one of ten backends must move little more than its own tenth of the
// slots. Maglev moves a few more the smaller the table is for its backends: this
// is the price of the small default ring (the transition keeps those flows where
// they are, see bpf/README.md).
func TestTableDisruptionOnRemoval(t *testing.T) {
	for _, tc := range []struct {
		m     uint32
		bound float64
	}{{DefaultRingSize, 0.12}, {16381, 0.11}, {65537, 0.105}} {
		in := backendsN(10)
		before, err := BuildTable(in, tc.m)
		if err != nil {
			t.Fatal(err)
		}
		for removed := range in {
			rest := slices.Delete(slices.Clone(in), removed, removed+1)
			after, err := BuildTable(rest, tc.m)
			if err != nil {
				t.Fatal(err)
			}
			moved := 0
			for i := range before.Slots {
				if before.Backends[before.Slots[i]] != after.Backends[after.Slots[i]] {
					moved++
				}
			}
			frac := float64(moved) / float64(tc.m)
			if frac > tc.bound {
				t.Errorf("m=%d: removing %s moved %.2f%% of slots, want <= %.1f%%", tc.m, in[removed].Addr, 100*frac, 100*tc.bound)
			}
		}
	}
}

func TestTableWeights(t *testing.T) {
	in := backendsN(4)
	weights := []uint32{1, 2, 3, 10}
	var total uint32
	for i, w := range weights {
		in[i].Weight = w
		total += w
	}
	tab, err := BuildTable(in, DefaultRingSize)
	if err != nil {
		t.Fatal(err)
	}
	for i, got := range tab.Shares() {
		want := float64(DefaultRingSize) * float64(weights[i]) / float64(total)
		if d := (float64(got) - want) / want; d > 0.01 || d < -0.01 {
			t.Errorf("backend %d (weight %d): %d slots, want %.0f ±1%%", i, weights[i], got, want)
		}
	}
}

func TestDigestChangesWithContent(t *testing.T) {
	a, _ := BuildTable(backendsN(3), 251)
	b, _ := BuildTable(backendsN(4), 251)
	if a.Digest() == b.Digest() {
		t.Fatal("tables of different backend sets have the same digest")
	}
}

func BenchmarkBuildTable(b *testing.B) {
	for _, n := range []int{10, 100} {
		in := backendsN(n)
		b.Run(fmt.Sprintf("backends=%d/m=%d", n, DefaultRingSize), func(b *testing.B) {
			for b.Loop() {
				if _, err := BuildTable(in, DefaultRingSize); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/1e6/float64(b.N), "ms/table")
		})
	}
}

// Fill keeps every serving replica's slots exactly, and gives the others' slots
// to the serving replicas' own table: a replica going draining or down moves no
// other replica's flows, which a table rebuilt without it would.
func TestFillMovesOnlyTheDownReplicasSlots(t *testing.T) {
	var all, serving []MaglevBackend
	for i := range 10 {
		b := MaglevBackend{Addr: netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)})}
		all = append(all, b)
		if i != 3 {
			serving = append(serving, b)
		}
	}
	const m = 65537
	full, err := BuildTable(all, m)
	if err != nil {
		t.Fatal(err)
	}
	rest, err := BuildTable(serving, m)
	if err != nil {
		t.Fatal(err)
	}
	downAddr := all[3].Addr
	got := full.Fill(func(a netip.Addr) bool { return a != downAddr }, rest)
	movedByRebuild, movedByFill := 0, 0
	for i := range full.Slots {
		before, after := full.Backends[full.Slots[i]], got.Backends[got.Slots[i]]
		if after == downAddr {
			t.Fatalf("slot %d still on the down replica", i)
		}
		if before != downAddr {
			if after != before {
				movedByFill++
			}
			if rest.Backends[rest.Slots[i]] != before {
				movedByRebuild++
			}
		}
		if before == downAddr && after != rest.Backends[rest.Slots[i]] {
			t.Fatalf("slot %d of the down replica went to %s, not the serving table's %s", i, after, rest.Backends[rest.Slots[i]])
		}
	}
	t.Logf("other replicas' slots moved: %d by a rebuilt table, %d by Fill", movedByRebuild, movedByFill)
	if movedByFill != 0 {
		t.Errorf("Fill moved %d slots of serving replicas, want 0", movedByFill)
	}
}
