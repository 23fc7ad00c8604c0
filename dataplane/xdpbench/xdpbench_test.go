package xdpbench

import (
	"testing"

	"github.com/portico-edge/portico/dataplane/bpftest"
)

// TestRun runs the benchmark harness briefly so it cannot rot, and
// checks each case does what its name says. It asserts verdicts, never timings.
func TestRun(t *testing.T) {
	bpftest.Require(t)
	res, err := Run(Options{Repeat: 1000, Packets: 200})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"floor: bare XDP_TX":                                 "XDP_TX",
		"established TCP v4":                                 "XDP_TX",
		"new TCP v4 flow (SYN)":                              "XDP_TX",
		"new TCP v4 flow (SYN) in a ring transition":         "XDP_TX",
		"new TCP v4 flow (SYN), held connections pinned":     "XDP_TX",
		"established TCP v4, held connections pinned":        "XDP_TX",
		"established TCP v6":                                 "XDP_TX",
		"non-VIP pass":                                       "XDP_PASS",
		"non-SYN packet of a flow across a ring change":      "XDP_TX",
		"packet of a connection pinned in a ring transition": "XDP_TX",
	}
	if len(res) != len(want) {
		t.Fatalf("%d cases, want %d", len(res), len(want))
	}
	for _, r := range res {
		if want[r.Name] != r.Verdict {
			t.Errorf("%s: verdict %s, want %s", r.Name, r.Verdict, want[r.Name])
		}
		if r.Repeat <= 0 || r.PerRun <= 0 {
			t.Errorf("%s: no measurement (repeat %v, per run %v)", r.Name, r.Repeat, r.PerRun)
		}
	}
}

// BenchmarkXDP reports each case's per-packet cost in Repeat mode.
func BenchmarkXDP(b *testing.B) {
	bpftest.Require(b)
	w, err := newWorld()
	if err != nil {
		b.Fatal(err)
	}
	defer w.cleanup()
	for _, c := range w.cases() {
		if c.distinct {
			continue // one repetition per tuple: see Run / portico bench xdp
		}
		b.Run(c.name, func(b *testing.B) {
			if c.setup != nil {
				if err := c.setup(); err != nil {
					b.Fatal(err)
				}
			}
			if c.prep != nil {
				if _, _, err := c.prog.Test(c.prep); err != nil {
					b.Fatal(err)
				}
			}
			frame := c.frame(0)
			if _, _, err := c.prog.Test(frame); err != nil {
				b.Fatal(err)
			}
			_, d, err := c.prog.Benchmark(frame, b.N, b.ResetTimer)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(d.Nanoseconds()), "ns/pkt")
		})
	}
}
