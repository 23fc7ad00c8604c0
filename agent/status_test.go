package agent

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/vrrp"
)

func TestCollectState(t *testing.T) {
	mac, _ := net.ParseMAC("02:00:00:00:00:02")
	views := []dataplane.VIPView{{
		Addr: netip.MustParseAddr("192.0.2.10"), RingSize: 7, Digest: "d1",
		Backends: []dataplane.BackendView{
			{Addr: netip.MustParseAddr("10.0.0.1"), Local: true, Slots: 4, Counters: dataplane.BackendCounters{Packets: 9}},
			{Addr: netip.MustParseAddr("10.0.0.2"), MAC: mac, Slots: 3},
			{Addr: netip.MustParseAddr("10.0.0.3"), Draining: true},
		},
	}, {Addr: netip.MustParseAddr("2001:db8::10")}}
	vrrpStates := map[string]vrrp.State{"edge/web/v4": vrrp.StateMaster, "edge/web/v6": vrrp.StateBackup}
	for _, tc := range []struct {
		name   string
		health string
		vips   []dataplane.VIPView
		err    error
		want   State
	}{
		{name: "healthy", vips: views, want: State{Healthy: true, VIPs: []VIPState{{
			VIP: "192.0.2.10", Digest: "d1", Replicas: []ReplicaState{
				{Addr: "10.0.0.1", State: "ready", Local: true, Share: 4.0 / 7, Packets: 9, MACKnown: true},
				{Addr: "10.0.0.2", State: "ready", Share: 3.0 / 7, MACKnown: true},
				{Addr: "10.0.0.3", State: "draining"},
			}}, {VIP: "2001:db8::10"}}}},
		{name: "unhealthy", health: "nginx has no configuration yet",
			want: State{Reason: "nginx has no configuration yet"}},
		{name: "maps unreadable", err: errors.New("read map vips: bad file descriptor"),
			want: State{Reason: "read map vips: bad file descriptor"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := nodeView{node: "n1", group: "edge/web", iface: "lo",
				health: func() string { return tc.health },
				vrrp:   func() map[string]vrrp.State { return vrrpStates },
				vips:   func() ([]dataplane.VIPView, error) { return tc.vips, tc.err },
			}
			got := n.collect()
			if !slices.Contains(got.Addrs, "127.0.0.1") {
				t.Errorf("addresses %v, want lo's 127.0.0.1 among them", got.Addrs)
			}
			if time.Since(got.Updated) > time.Minute {
				t.Errorf("updated %v, want now", got.Updated)
			}
			want := tc.want
			want.Node, want.Group = "n1", "edge/web"
			want.VRRP = map[string]string{"edge/web/v4": "master", "edge/web/v6": "backup"}
			if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(State{}, "Addrs", "Updated"), cmpopts.EquateApprox(0, 1e-9)); diff != "" {
				t.Errorf("state (-want +got):\n%s", diff)
			}
		})
	}
}

func TestOwners(t *testing.T) {
	states := []State{
		{Node: "a", Group: "edge/web", VRRP: map[string]string{"edge/web/v4": "master", "edge/web/v6": "backup"}},
		{Node: "b", Group: "edge/web", VRRP: map[string]string{"edge/web/v4": "backup", "edge/web/v6": "master"}},
		{Node: "c", Group: "edge/api", VRRP: map[string]string{"edge/api/v4": "master"}},
		{Node: "d", Group: "edge/web", VRRP: map[string]string{"edge/web/v4": "master"}},
	}
	for _, tc := range []struct {
		group, vip string
		want       []string
	}{
		{"edge/web", "192.0.2.10", []string{"a", "d"}},
		{"edge/web", "2001:db8::10", []string{"b"}},
		{"edge/api", "192.0.2.20", []string{"c"}},
		{"edge/api", "2001:db8::20", nil},
	} {
		if got := Owners(states, tc.group, netip.MustParseAddr(tc.vip)); !slices.Equal(got, tc.want) {
			t.Errorf("owners of %s in %s = %v, want %v", tc.vip, tc.group, got, tc.want)
		}
	}
}

// TestStatusLeases: states published in Leases read back as written, renewed in
// place, stale once not renewed in time; an unreadable report is left out.
func TestStatusLeases(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	write := func(st State) {
		t.Helper()
		b, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		if err := WriteLease(ctx, client, "portico-system", st.Node, b, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC().Truncate(time.Second)
	a := State{Node: "a", Group: "edge/web", Healthy: true, VRRP: map[string]string{"edge/web/v4": "master"}, Updated: now}
	b := State{Node: "b", Group: "edge/web", Reason: "starting", VRRP: map[string]string{}, Updated: now}
	write(b)
	write(State{Node: "a", Group: "edge/web", Reason: "starting", VRRP: map[string]string{}, Updated: now})
	write(a) // a renewal
	if err := WriteLease(ctx, client, "portico-system", "c", []byte("not json"), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// b stopped renewing long ago.
	leases := client.CoordinationV1().Leases("portico-system")
	l, err := leases.Get(ctx, leaseName("b"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now().Add(-time.Minute)}
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	states, stale, err := ReadStates(ctx, client, "portico-system")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]State{a, b}, states); diff != "" {
		t.Errorf("states (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]bool{"a": false, "b": true}, stale); diff != "" {
		t.Errorf("stale (-want +got):\n%s", diff)
	}
}
