package agent

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf/rlimit"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.uber.org/zap"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/test/netlab"
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

	none := func(netip.Addr) bool { return false }
	got, missing, out, overruled := desiredFor(snap, "edge/web", 42, local, none, nil, mac)
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
	if len(out) != 0 || overruled {
		t.Errorf("nothing dead, yet out %v, overruled %v", out, overruled)
	}
	// The group's L4 Services ride the same replicas, each VIP with its ports;
	// another group's Service, and one without a VIP yet, are not steered here.
	svcVIP := netip.MustParseAddr("192.0.2.53")
	withSvc := snap
	withSvc.Services = []model.Service{
		{Name: "shop/dns", Group: "edge/web", VIPs: []netip.Addr{svcVIP}, Ports: []model.ServicePort{
			{Protocol: model.TCP, Port: 53, Upstream: "shop-dns-53-tcp"}, {Protocol: model.UDP, Port: 53, Upstream: "shop-dns-53-udp"}}},
		{Name: "shop/novip", Group: "edge/web", Ports: []model.ServicePort{{Protocol: model.TCP, Port: 1, Upstream: "x"}}},
		{Name: "shop/other", Group: "edge/other", VIPs: []netip.Addr{netip.MustParseAddr("192.0.2.54")}, Ports: []model.ServicePort{{Protocol: model.TCP, Port: 1, Upstream: "y"}}},
	}
	got, _, _, _ = desiredFor(withSvc, "edge/web", 42, local, none, nil, mac)
	want.Groups = append(want.Groups, dataplane.Group{Name: "service shop/dns", VIPs: []netip.Addr{svcVIP},
		Ports:    []model.Port{{Protocol: model.TCP, Port: 53}, {Protocol: model.UDP, Port: 53}},
		Backends: want.Groups[0].Backends})
	if diff := cmp.Diff(want, got, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
		t.Errorf("desired with L4 Services (-want +got):\n%s", diff)
	}
	if g := announcedGroup(withSvc, "edge/web"); !slices.Equal(g.VIPs, []netip.Addr{vip, svcVIP}) {
		t.Errorf("announced VIPs %v, want the group's and its Service's", g.VIPs)
	}
	// So do its Views (Gateways with addresses of their own), on their ports;
	// another group's View is not steered here.
	gwVIP := netip.MustParseAddr("192.0.2.80")
	withSvc.Views = []model.View{
		{Name: "infra/gw", Group: "edge/web", VIPs: []netip.Addr{gwVIP}, Ports: []model.Port{{Protocol: model.TCP, Port: 80}, {Protocol: model.TCP, Port: 443}}},
		{Name: "infra/other", Group: "edge/other", VIPs: []netip.Addr{netip.MustParseAddr("192.0.2.81")}, Ports: []model.Port{{Protocol: model.TCP, Port: 80}}},
	}
	got, _, _, _ = desiredFor(withSvc, "edge/web", 42, local, none, nil, mac)
	want.Groups = append(want.Groups, dataplane.Group{Name: "gateway infra/gw", VIPs: []netip.Addr{gwVIP},
		Ports: withSvc.Views[0].Ports, Backends: want.Groups[0].Backends})
	if diff := cmp.Diff(want, got, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
		t.Errorf("desired with Views (-want +got):\n%s", diff)
	}
	if g := announcedGroup(withSvc, "edge/web"); !slices.Equal(g.VIPs, []netip.Addr{vip, svcVIP, gwVIP}) {
		t.Errorf("announced VIPs %v, want the group's, its Service's and its View's", g.VIPs)
	}
	if got, _, _, _ := desiredFor(snap, "edge/novip", 42, local, none, nil, mac); len(got.Groups) != 0 {
		t.Errorf("a group without VIPs gave %+v", got.Groups)
	}
	if got, _, _, _ := desiredFor(snap, "edge/gone", 42, local, none, nil, mac); len(got.Groups) != 0 || got.Seed != 42 {
		t.Errorf("a missing group gave %+v", got)
	}
}

// Dead replicas leave the ring (Down), keeping their flows while their MAC is
// known; a draining one stays (its connections finish while a graceful stop has
// closed its listeners), and takes new flows when no ready replica lives;
// liveness never empties a group.
func TestDesiredForLiveness(t *testing.T) {
	vip := netip.MustParseAddr("192.0.2.10")
	a, b, c := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")
	macB, _ := net.ParseMAC("02:00:00:00:00:02")
	snap := model.Snapshot{Groups: []model.Group{{Name: "edge/web", VIPs: []netip.Addr{vip}, Replicas: []model.Replica{
		{Addr: a, State: model.Ready}, {Addr: b, State: model.Ready}, {Addr: c, State: model.Draining},
	}}}}
	local := func(x netip.Addr) bool { return x == a }
	asked := map[netip.Addr]bool{}
	mac := func(x netip.Addr) (net.HardwareAddr, bool) {
		asked[x] = true
		if x == b {
			return macB, true
		}
		return nil, false
	}
	deadSet := func(d ...netip.Addr) func(netip.Addr) bool {
		return func(x netip.Addr) bool { return slices.Contains(d, x) }
	}
	eq := cmpopts.EquateComparable(netip.Addr{})

	// b (ready) is dead: out of the ring, with its MAC (its flows stay).
	got, missing, out, overruled := desiredFor(snap, "edge/web", 1, local, deadSet(b), nil, mac)
	if diff := cmp.Diff([]dataplane.Backend{{Addr: a, Local: true}, {Addr: b, Down: true, MAC: macB}}, got.Groups[0].Backends, eq); diff != "" {
		t.Errorf("backends (-want +got):\n%s", diff)
	}
	if !slices.Equal(missing, []netip.Addr{c}) || overruled || !slices.Equal(out, []netip.Addr{b}) {
		t.Errorf("missing %v, overruled %v, out %v", missing, overruled, out)
	}

	// c is draining and dead: Down and draining (asked last, its connections
	// kept); the dead local replica a goes.
	macs := map[netip.Addr]net.HardwareAddr{b: macB, c: macB}
	withC := func(x netip.Addr) (net.HardwareAddr, bool) { m, ok := macs[x]; return m, ok }
	got, _, out, _ = desiredFor(snap, "edge/web", 1, local, deadSet(a, c), nil, withC)
	want := []dataplane.Backend{{Addr: a, Down: true, Local: true}, {Addr: b, MAC: macB}, {Addr: c, MAC: macB, Draining: true, Down: true}}
	if diff := cmp.Diff(want, got.Groups[0].Backends, eq); diff != "" || !slices.Equal(out, []netip.Addr{a, c}) {
		t.Errorf("backends (-want +got):\n%s; out %v", diff, out)
	}

	// Every ready replica dead: the draining one takes new flows (the data
	// plane's rings fall back to it, as kube-proxy does to terminating
	// endpoints), so the verdicts hold.
	got, _, out, overruled = desiredFor(snap, "edge/web", 1, local, deadSet(a, b), nil, withC)
	want = []dataplane.Backend{{Addr: a, Down: true, Local: true}, {Addr: b, Down: true, MAC: macB}, {Addr: c, MAC: macB, Draining: true}}
	if diff := cmp.Diff(want, got.Groups[0].Backends, eq); diff != "" || overruled || !slices.Equal(out, []netip.Addr{a, b}) {
		t.Errorf("ready replicas dead, one draining: backends (-want +got):\n%s; overruled %v, out %v", diff, overruled, out)
	}

	// Every replica that could take new flows dead: Kubernetes' view holds.
	got, _, out, overruled = desiredFor(snap, "edge/web", 1, local, deadSet(a, b, c), nil, withC)
	if !overruled || len(out) != 0 || len(got.Groups[0].Backends) != 3 {
		t.Errorf("all replicas dead: overruled %v, out %v, backends %+v; want Kubernetes' view", overruled, out, got.Groups[0].Backends)
	}

	// b died 13 s ago; a loaded checker now calls a and c dead within 9 ms:
	// their verdicts are taken back, b's stands (Kubernetes has not caught up
	// with its death yet, and must not bring it back).
	t0 := time.Unix(1000, 0)
	since := map[netip.Addr]time.Time{b: t0, a: t0.Add(13 * time.Second), c: t0.Add(13*time.Second + 9*time.Millisecond)}
	got, _, out, overruled = desiredFor(snap, "edge/web", 1, local, deadSet(a, b, c), func(x netip.Addr) time.Time { return since[x] }, withC)
	want = []dataplane.Backend{{Addr: a, Local: true}, {Addr: b, Down: true, MAC: macB}, {Addr: c, MAC: macB, Draining: true}}
	if diff := cmp.Diff(want, got.Groups[0].Backends, eq); diff != "" || !overruled || !slices.Equal(out, []netip.Addr{b}) {
		t.Errorf("a burst of verdicts after an older one: backends (-want +got):\n%s; overruled %v, out %v", diff, overruled, out)
	}
}

func TestMACChanged(t *testing.T) {
	a, b, c, other := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3"), netip.MustParseAddr("10.0.0.9")
	d := netip.MustParseAddr("10.0.0.4")
	macB, _ := net.ParseMAC("02:00:00:00:00:02")
	macNew, _ := net.ParseMAC("02:00:00:00:00:99")
	s := &l4Sink{group: "edge/web",
		last: model.Snapshot{Groups: []model.Group{
			{Name: "edge/web", Replicas: []model.Replica{{Addr: a}, {Addr: b}, {Addr: c}, {Addr: d}}},
			{Name: "edge/other", Replicas: []model.Replica{{Addr: other}}},
		}},
		given: dataplane.Desired{Groups: []dataplane.Group{{Name: "edge/web", Backends: []dataplane.Backend{
			{Addr: a, Local: true}, {Addr: b, MAC: macB}, {Addr: d, Down: true}, // c was left out: no MAC
		}}}},
	}
	for _, tc := range []struct {
		name string
		addr netip.Addr
		mac  net.HardwareAddr
		want bool
	}{
		{"same MAC", b, macB, false},
		{"new MAC", b, macNew, true},
		{"a replica that had no MAC", c, macNew, true},
		{"this node", a, macNew, false},
		{"a down replica (its neighbour entry churns while it is probed)", d, macNew, false},
		{"another group's replica", other, macNew, false},
	} {
		if got := s.macChanged(tc.addr, tc.mac); got != tc.want {
			t.Errorf("%s: macChanged(%s, %s) = %v, want %v", tc.name, tc.addr, tc.mac, got, tc.want)
		}
	}
}

// TestL4SinkInNamespace applies snapshots through the sink to a real xdp_lb on a
// node namespace: this node's replica is local, a neighbour's gets its MAC by
// ARP, and a replica nobody answers for is left out until it goes away.
func TestL4SinkInNamespace(t *testing.T) {
	a, b := twoNodes(t, "pl")
	if err := rlimit.RemoveMemlock(); err != nil {
		t.Fatal(err)
	}
	pin := fmt.Sprintf("/sys/fs/bpf/portico-agent-test-%d", os.Getpid())
	err := netlab.Do(a.NS, func() error {
		ifc, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		dp, err := dataplane.Load(dataplane.Options{PinPath: pin, RingSize: 13})
		if err != nil {
			return err
		}
		t.Cleanup(func() { dp.Close(); dataplane.Uninstall(pin) })
		s := &l4Sink{dp: dp, group: "edge/web", seed: 1, log: zap.NewNop(),
			neigh: &neighbors{ifc: ifc, log: zap.NewNop(), resolved: map[netip.Addr]net.HardwareAddr{}}}
		vip, gone := netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("10.215.0.77")
		snap := func(extra ...netip.Addr) model.Snapshot {
			g := model.Group{Name: "edge/web", VIPs: []netip.Addr{vip}, Ports: []model.Port{{Protocol: model.TCP, Port: 80}},
				Replicas: []model.Replica{{Addr: a.Addr.Addr()}, {Addr: b.Addr.Addr()}}}
			for _, x := range extra {
				g.Replicas = append(g.Replicas, model.Replica{Addr: x})
			}
			return model.Snapshot{Groups: []model.Group{g}}
		}
		wantBackends := []string{a.Addr.Addr().String() + " local", b.Addr.Addr().String() + " " + b.MAC.String()}

		if err := s.Apply(context.Background(), snap(gone)); err == nil {
			t.Error("Apply with an unresolvable replica succeeded")
		}
		if s.applied() {
			t.Error("applied() with a replica left out")
		}
		if diff := cmp.Diff(wantBackends, backendsIn(t, dp, vip)); diff != "" {
			t.Errorf("backends with one unresolvable (-want +got):\n%s", diff)
		}
		if err := s.Apply(context.Background(), snap()); err != nil {
			return err
		}
		if !s.applied() {
			t.Error("not applied() after a complete Apply")
		}
		if diff := cmp.Diff(wantBackends, backendsIn(t, dp, vip)); diff != "" {
			t.Errorf("backends (-want +got):\n%s", diff)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// backendsIn lists a VIP's backends in the maps as "addr local" or "addr MAC".
func backendsIn(t *testing.T, dp *dataplane.Dataplane, vip netip.Addr) []string {
	t.Helper()
	views, err := dp.VIPs()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, v := range views {
		if v.Addr != vip {
			continue
		}
		for _, b := range v.Backends {
			if b.Local {
				out = append(out, b.Addr.String()+" local")
			} else {
				out = append(out, b.Addr.String()+" "+b.MAC.String())
			}
		}
	}
	return out
}
