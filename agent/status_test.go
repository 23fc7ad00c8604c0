package agent

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/portico-edge/portico/api/agentstatus"
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
		mode   dataplane.AttachMode
		want   agentstatus.State
	}{
		{name: "healthy", vips: views, mode: dataplane.AttachNative, want: agentstatus.State{Healthy: true, XDPAttachMode: "native", VIPs: []agentstatus.VIPState{{
			VIP: "192.0.2.10", Digest: "d1", Replicas: []agentstatus.ReplicaState{
				{Addr: "10.0.0.1", State: "ready", Local: true, Share: 4.0 / 7, Packets: 9, MACKnown: true},
				{Addr: "10.0.0.2", State: "ready", Share: 3.0 / 7, MACKnown: true},
				{Addr: "10.0.0.3", State: "draining"},
			}}, {VIP: "2001:db8::10"}}}},
		{name: "unhealthy", health: "nginx has no configuration yet", mode: dataplane.AttachGeneric,
			want: agentstatus.State{Reason: "nginx has no configuration yet", XDPAttachMode: "generic"}},
		{name: "maps unreadable", err: errors.New("read map vips: bad file descriptor"),
			want: agentstatus.State{Reason: "read map vips: bad file descriptor"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := nodeView{node: "n1", group: "edge/web", iface: "lo",
				health:     func() string { return tc.health },
				vrrp:       func() map[string]vrrp.State { return vrrpStates },
				vips:       func() ([]dataplane.VIPView, error) { return tc.vips, tc.err },
				attachMode: func() dataplane.AttachMode { return tc.mode },
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
			if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(agentstatus.State{}, "Addrs", "Updated"), cmpopts.EquateApprox(0, 1e-9)); diff != "" {
				t.Errorf("state (-want +got):\n%s", diff)
			}
		})
	}
}

// TestVRRPMasterName: the state a node publishes for a VRRP master is the one
// readers of the status Lease look for (agentstatus.Owners).
func TestVRRPMasterName(t *testing.T) {
	if got := vrrp.StateMaster.String(); got != agentstatus.VRRPMaster {
		t.Errorf("vrrp.StateMaster is published as %q, readers look for %q", got, agentstatus.VRRPMaster)
	}
}
