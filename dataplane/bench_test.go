package dataplane

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/dataplane/bpftest"
)

// benchDataplane loads a data plane of its own for a benchmark (removed after
// it) and eleven replicas for it.
func benchDataplane(b *testing.B, name string) (*Dataplane, []Backend) {
	bpftest.Require(b)
	pin := fmt.Sprintf("%s-bench-%s", DefaultPinPath, name)
	d, err := Load(Options{PinPath: pin})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close(); Uninstall(pin) })
	var bs []Backend
	for i := range 11 {
		bs = append(bs, Backend{Addr: netip.AddrFrom4([4]byte{10, 0, 0, byte(11 + i)}), MAC: net.HardwareAddr{2, 0, 0, 0, 1, byte(i)}})
	}
	return d, bs
}

// BenchmarkApplyOneBackend measures Apply when one replica of ten joins or
// leaves a group with a v4 and a v6 VIP: two rings of DefaultRingSize rebuilt and
// swapped, two backend entries written.
func BenchmarkApplyOneBackend(b *testing.B) {
	d, bs := benchDataplane(b, "apply")
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

// BenchmarkApplyInTransition measures Apply in a long burst of changes, the
// case the liveness budget meets on a loaded node: four VIPs (two groups of a
// v4 and a v6 VIP), every change a ring the transition has not held yet (two
// of eleven replicas draining, a new pair each time), so each VIP's history is
// full and each change adds a mid ring to it.
func BenchmarkApplyInTransition(b *testing.B) {
	d, bs := benchDataplane(b, "apply-mid")
	var pairs [][2]int
	for i := range bs {
		for j := i + 1; j < len(bs); j++ {
			pairs = append(pairs, [2]int{i, j})
		}
	}
	vip4b, vip6b := netip.MustParseAddr("192.0.2.11"), netip.MustParseAddr("2001:db8::11")
	state := func(k int) Desired {
		cur := make([]Backend, len(bs))
		copy(cur, bs)
		p := pairs[k%len(pairs)]
		cur[p[0]].Draining, cur[p[1]].Draining = true, true
		ports := []model.Port{{Protocol: model.TCP, Port: 443}}
		return Desired{Seed: 1, Groups: []Group{
			{Name: "bench-a", VIPs: []netip.Addr{vip4, vip6}, Ports: ports, Backends: cur},
			{Name: "bench-b", VIPs: []netip.Addr{vip4b, vip6b}, Ports: ports, Backends: cur},
		}}
	}
	k := 0
	for ; k < int(lbLbLimitsLB_MID_RINGS)+2; k++ { // fill the histories
		if _, err := d.Apply(state(k)); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		k++
		if _, err := d.Apply(state(k)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/1e6/float64(b.N), "ms/apply")
}
