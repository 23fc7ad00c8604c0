package dataplane

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/dataplane/bpftest"
)

// TestBenchXDPCases runs the benchmark harness briefly so it cannot rot, and
// checks each case does what its name says. It asserts verdicts, never timings.
func TestBenchXDPCases(t *testing.T) {
	bpftest.Require(t)
	res, err := BenchXDP(BenchOptions{Repeat: 1000, Packets: 200})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"floor: bare XDP_TX":    "XDP_TX",
		"established TCP v4":    "XDP_TX",
		"new TCP v4 flow (SYN)": "XDP_TX",
		"established TCP v6":    "XDP_TX",
		"non-VIP pass":          "XDP_PASS",
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
	w, err := newBenchWorld()
	if err != nil {
		b.Fatal(err)
	}
	defer w.cleanup()
	for _, c := range w.cases() {
		if c.distinct {
			continue // one repetition per tuple: see BenchXDP / portico bench xdp
		}
		b.Run(c.name, func(b *testing.B) {
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

// BenchmarkApplyOneBackend measures Apply when one replica of ten joins or
// leaves a group with a v4 and a v6 VIP: two 65537-slot rings rebuilt and
// swapped, two backend entries written.
func BenchmarkApplyOneBackend(b *testing.B) {
	bpftest.Require(b)
	pin := fmt.Sprintf("%s-bench-apply", DefaultPinPath)
	d, err := Load(Options{PinPath: pin})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { d.Close(); Uninstall(pin) }()
	var bs []Backend
	for i := range 11 {
		bs = append(bs, Backend{Addr: netip.AddrFrom4([4]byte{10, 0, 0, byte(11 + i)}), MAC: net.HardwareAddr{2, 0, 0, 0, 1, byte(i)}})
	}
	state := func(n int) Desired {
		return Desired{Seed: 1, Groups: []Group{{Name: "bench", VIPs: []netip.Addr{vip4, vip6},
			Ports: []model.Port{{Protocol: model.TCP, Port: 443}}, Backends: bs[:n]}}}
	}
	if _, err := d.Apply(state(10)); err != nil {
		b.Fatal(err)
	}
	i := 0
	for b.Loop() {
		n := 10 + i%2 // 11 backends, then 10 again
		i++
		if _, err := d.Apply(state(n)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/1e6/float64(b.N), "ms/apply")
}
