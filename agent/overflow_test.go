package agent

import (
	"testing"
	"time"

	"github.com/portico-edge/portico/api/sites"
	"github.com/portico-edge/portico/dataplane"
)

// TestSpillFor: nothing at or below capacity; above it, what brings the rest to
// capacity, rounded up to a step, at most the limit.
func TestSpillFor(t *testing.T) {
	o := sites.Overflow{CapacityPerEdge: 100, To: "a"}
	for _, tc := range []struct{ rate, want float64 }{
		{0, 0}, {100, 0}, {101, 0.05}, {125, 0.2}, {150, 0.35}, {200, 0.5}, {1000, 0.5},
	} {
		if got := spillFor(o, tc.rate); got != tc.want {
			t.Errorf("rate %v: spill %v, want %v", tc.rate, got, tc.want)
		}
	}
	o.Limit = 2
	if got := spillFor(o, 1e6); got != 0.9 {
		t.Errorf("limit above the most: spill %v, want 0.9", got)
	}
}

// TestSpiller: the ratio follows the rate measured over a second: up at once,
// down only after it has been lower for spillDown.
func TestSpiller(t *testing.T) {
	o := &sites.Overflow{CapacityPerEdge: 50, To: "a"}
	var s spiller
	now := time.Unix(0, 0)
	flows := uint64(0)
	step := func(rate float64) (float64, bool) {
		now = now.Add(spillEvery)
		flows += uint64(rate * spillEvery.Seconds())
		return s.observe(now, flows, o)
	}
	for range 10 {
		if r, _ := step(40); r != 0 {
			t.Fatalf("below capacity: ratio %v", r)
		}
	}
	var changes int
	var r float64
	for range 10 {
		var ch bool
		if r, ch = step(100); ch {
			changes++
		}
	}
	if r != 0.5 {
		t.Fatalf("twice the capacity for 2 s: ratio %v, want 0.5", r)
	}
	t.Logf("ratio up to 0.5 in %d changes", changes)
	// Lower load: the ratio holds for spillDown, then goes down.
	var down time.Duration
	for i := range 30 {
		if r, ch := step(40); ch {
			down = time.Duration(i+1) * spillEvery
			if r != 0 {
				t.Fatalf("below capacity again: ratio went to %v", r)
			}
			break
		}
	}
	if down < spillDown || down > spillDown+spillWindow+spillEvery {
		t.Errorf("the ratio went down %v after the load did, want after %v (and the window)", down, spillDown)
	}
	if r, _ := step(40); r != 0 {
		t.Errorf("ratio %v", r)
	}
	if r, _ := s.observe(now.Add(spillEvery), flows, nil); r != 0 {
		t.Errorf("no overflow: ratio %v", r)
	}
}

// TestMaxSpill: an overflow's limit is capped where the data plane caps a
// group's spill ratio.
func TestMaxSpill(t *testing.T) {
	if sites.MaxSpill != dataplane.MaxSpill {
		t.Errorf("sites.MaxSpill %v, dataplane.MaxSpill %v: want the same", sites.MaxSpill, dataplane.MaxSpill)
	}
}
