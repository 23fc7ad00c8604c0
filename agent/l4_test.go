package agent

import (
	"net"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/dataplane"
)

func TestDesiredFor(t *testing.T) {
	vip := netip.MustParseAddr("192.0.2.10")
	a, b, c, d := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3"), netip.MustParseAddr("10.0.0.4")
	macB, _ := net.ParseMAC("02:00:00:00:00:02")
	macC, _ := net.ParseMAC("02:00:00:00:00:03")
	snap := model.Snapshot{Groups: []model.Group{
		{Name: "edge/web", VIPs: []netip.Addr{vip}, VRID: 7, Ports: []model.Port{{Protocol: model.TCP, Port: 443}}, Replicas: []model.Replica{
			{Addr: a, State: model.Ready}, {Addr: b, State: model.Ready, Weight: 2}, {Addr: c, State: model.Draining}, {Addr: d, State: model.Ready},
		}},
		{Name: "edge/other", VIPs: []netip.Addr{netip.MustParseAddr("192.0.2.11")}, Replicas: []model.Replica{{Addr: b}}},
		{Name: "edge/novip", Replicas: []model.Replica{{Addr: b}}},
	}}
	local := func(x netip.Addr) bool { return x == a }
	macs := map[netip.Addr]net.HardwareAddr{b: macB, c: macC}
	mac := func(x netip.Addr) (net.HardwareAddr, bool) { m, ok := macs[x]; return m, ok }

	got, missing := desiredFor(snap, "edge/web", 42, local, mac)
	want := dataplane.Desired{Seed: 42, Groups: []dataplane.Group{{
		Name: "edge/web", VIPs: []netip.Addr{vip}, Ports: []model.Port{{Protocol: model.TCP, Port: 443}},
		Backends: []dataplane.Backend{
			{Addr: a, Local: true},
			{Addr: b, MAC: macB, Weight: 2},
			{Addr: c, MAC: macC, Draining: true},
		},
	}}}
	if diff := cmp.Diff(want, got, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
		t.Errorf("desired (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]netip.Addr{d}, missing, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
		t.Errorf("unresolved (-want +got):\n%s", diff)
	}
	if got, _ := desiredFor(snap, "edge/novip", 42, local, mac); len(got.Groups) != 0 {
		t.Errorf("a group without VIPs gave %+v", got.Groups)
	}
	if got, _ := desiredFor(snap, "edge/gone", 42, local, mac); len(got.Groups) != 0 || got.Seed != 42 {
		t.Errorf("a missing group gave %+v", got)
	}
}
