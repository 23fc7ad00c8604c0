package dataplane

import (
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/dataplane/xdptest"
)

// TestInspectorSeesWhatApplyWrote opens the pins the way `portico` does and
// checks the operator's view against what Apply was given.
func TestInspectorSeesWhatApplyWrote(t *testing.T) {
	d := loadForTest(t)
	if err := d.SetMAC(nicMAC); err != nil {
		t.Fatal(err)
	}
	// A new connection leaves no state; when r2 starts draining, a packet of an
	// older flow of r2's is pinned to it.
	if _, err := d.Apply(desired(r1, r2, r3)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := xdptest.Run(d.Program(), tcp4(40099, xdptest.SYN).Bytes()); err != nil {
		t.Fatal(err)
	}
	if n := entries(t, d.objs.Flows) + entries(t, d.objs.NewPins); n != 0 {
		t.Fatalf("a new connection left %d entries", n)
	}
	if _, err := d.Apply(desired(r1, draining(r2), r3)); err != nil {
		t.Fatal(err)
	}
	// r2's before, r3's now: the walk's first (by address) is r2, pinned
	// as the director's guess.
	p := flowWhere(t, 40100, [][]Backend{{r1, r2, r3}, {r1, r3}}, r2, r3)
	if _, _, err := xdptest.Run(d.Program(), p.Bytes()); err != nil {
		t.Fatal(err)
	}
	in, err := OpenPinned(d.opts.PinPath)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	vips, err := in.VIPs()
	if err != nil {
		t.Fatal(err)
	}
	if len(vips) != 2 || vips[0].Addr != vip4 || vips[1].Addr != vip6 {
		t.Fatalf("VIPs = %+v, want %s and %s", vips, vip4, vip6)
	}
	wantPorts := []model.Port{{Protocol: model.TCP, Port: 80}, {Protocol: model.UDP, Port: 53}}
	digests := d.Digests()
	for _, v := range vips {
		if diff := cmp.Diff(wantPorts, v.Ports); diff != "" {
			t.Errorf("%s ports (-want +got):\n%s", v.Addr, diff)
		}
		if v.RingSize != testRing || v.Digest != digests[v.Addr] || v.Digest == "" {
			t.Errorf("%s: ring %d digest %q, want %d and %q", v.Addr, v.RingSize, v.Digest, testRing, digests[v.Addr])
		}
		slots := 0
		for _, b := range v.Backends {
			slots += b.Slots
			if b.Draining && b.Slots != 0 {
				t.Errorf("%s: draining backend %s holds %d slots", v.Addr, b.Addr, b.Slots)
			}
		}
		if slots != testRing || len(v.Backends) != 3 {
			t.Errorf("%s: %d backends holding %d slots, want 3 holding %d", v.Addr, len(v.Backends), slots, testRing)
		}
	}
	flows, err := in.Flows(0)
	if err != nil {
		t.Fatal(err)
	}
	if len(flows) != 1 || flows[0].Flow.Src != client4 || flows[0].Flow.SPort != p.SPort || flows[0].Flow.DPort != 80 || flows[0].Backend != r2.Addr {
		t.Fatalf("flows = %+v, want the one pinned client flow, to %s", flows, r2.Addr)
	}
	if vips[0].Counters.NewFlows != 1 || vips[0].Counters.Packets != 2 {
		t.Errorf("v4 VIP counters = %+v, want 2 packets, 1 new flow", vips[0].Counters)
	}
}

// TestApplyIsIdempotentAndKeepsIDs: a second Apply of the same state writes
// nothing, and changing one backend keeps every other id.
func TestApplyIsIdempotentAndKeepsIDs(t *testing.T) {
	d := loadForTest(t)
	if _, err := d.Apply(desired(r1, r2)); err != nil {
		t.Fatal(err)
	}
	ids := func() map[backendKey]uint32 {
		out := map[backendKey]uint32{}
		for k, v := range d.st.backendIDs {
			out[k] = v
		}
		return out
	}
	before := ids()
	st, err := d.Apply(desired(r1, r2))
	if err != nil {
		t.Fatal(err)
	}
	if st != (ApplyStats{}) {
		t.Fatalf("second Apply changed %+v, want nothing", st)
	}
	if _, err := d.Apply(desired(r1, r2, r3)); err != nil {
		t.Fatal(err)
	}
	after := ids()
	for k, id := range before {
		if after[k] != id {
			t.Errorf("backend %v changed id %d -> %d", k, id, after[k])
		}
	}
	// A restarted loader recovers the same ids from the pins.
	d2, err := Load(d.opts)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	st, err = d2.Apply(desired(r1, r2, r3))
	if err != nil {
		t.Fatal(err)
	}
	if st.Backends != 0 || st.VIPKeys != 0 {
		t.Errorf("Apply after restart rewrote %+v, want only rings", st)
	}
	if diff := cmp.Diff(after, d2.st.backendIDs, cmp.AllowUnexported(backendKey{})); diff != "" {
		t.Errorf("ids after restart (-want +got):\n%s", diff)
	}
}

func TestApplyRejectsBadInputAndWritesNothing(t *testing.T) {
	d := loadForTest(t)
	noMAC := r1
	noMAC.MAC = nil
	for _, tc := range []struct {
		name string
		in   Desired
	}{
		{"remote backend without MAC", desired(noMAC)},
		{"backend twice", desired(r1, r1)},
		{"VIP in two groups", Desired{Groups: append(desired(r1).Groups, Group{Name: "other", VIPs: desired(r1).Groups[0].VIPs})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := d.Apply(tc.in); err == nil {
				t.Fatal("Apply succeeded, want an error")
			}
			vips, err := d.VIPs()
			if err != nil {
				t.Fatal(err)
			}
			if len(vips) != 0 {
				t.Fatalf("a rejected Apply wrote %d VIPs", len(vips))
			}
		})
	}
}

// TestCollectorExportsCounters scrapes the Prometheus collector after one
// steered and one passed packet.
func TestCollectorExportsCounters(t *testing.T) {
	d := loadForTest(t)
	if err := d.SetMAC(nicMAC); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Apply(desired(r1)); err != nil {
		t.Fatal(err)
	}
	other := tcp4(40200, xdptest.SYN)
	other.Dst = other4
	for _, f := range [][]byte{tcp4(40200, xdptest.SYN).Bytes(), other.Bytes()} {
		if _, _, err := xdptest.Run(d.Program(), f); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(NewCollector(d)); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP portico_xdp_backend_packets_total Packets sent to a backend.
# TYPE portico_xdp_backend_packets_total counter
portico_xdp_backend_packets_total{backend="10.0.0.11",vip="192.0.2.10"} 1
portico_xdp_backend_packets_total{backend="10.0.0.11",vip="2001:db8::10"} 0
# HELP portico_xdp_vip_new_flows_total Flows created in the flow table for a VIP.
# TYPE portico_xdp_vip_new_flows_total counter
portico_xdp_vip_new_flows_total{vip="192.0.2.10"} 1
portico_xdp_vip_new_flows_total{vip="2001:db8::10"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "portico_xdp_backend_packets_total", "portico_xdp_vip_new_flows_total"); err != nil {
		t.Error(err)
	}
	n, err := testutil.GatherAndCount(reg, "portico_xdp_packets_total")
	if err != nil {
		t.Fatal(err)
	}
	if n != ReasonCount {
		t.Errorf("%d reason series, want %d", n, ReasonCount)
	}
	for reason, want := range map[string]float64{"tx": 1, "not_vip": 1, "malformed": 0} {
		m := &dto.Metric{}
		found := false
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() != "portico_xdp_packets_total" {
				continue
			}
			for _, x := range mf.GetMetric() {
				if x.GetLabel()[0].GetValue() == reason {
					m, found = x, true
				}
			}
		}
		if !found || m.GetCounter().GetValue() != want {
			t.Errorf("portico_xdp_packets_total{reason=%q} = %v (found %v), want %v", reason, m.GetCounter().GetValue(), found, want)
		}
	}
}

// TestCollectorScrapeErrorsByMap: a failed read is reported under the name of the
// map that failed (a bounded label), not under the error's text.
func TestCollectorScrapeErrorsByMap(t *testing.T) {
	d := loadForTest(t)
	if _, err := d.Apply(desired(r1)); err != nil {
		t.Fatal(err)
	}
	m := d.maps()
	m.vipStats = m.flows // other key and value types: every lookup fails
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(newCollector(m)); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP portico_xdp_scrape_errors 1 if reading a BPF map failed on this scrape, by map.
# TYPE portico_xdp_scrape_errors gauge
portico_xdp_scrape_errors{map="vip_stats"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "portico_xdp_scrape_errors"); err != nil {
		t.Error(err)
	}
}

// entries counts the entries of a hash map.
func entries(t testing.TB, m *ebpf.Map) int {
	t.Helper()
	var k lbFlowKey
	var v lbFlowVal
	n := 0
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}
