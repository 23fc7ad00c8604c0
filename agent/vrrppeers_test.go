package agent

import (
	"context"
	"encoding/json"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/api/agentstatus"
	"github.com/portico-edge/portico/controlplane/model"
)

// statusLease is an agent's status Lease publishing st, renewed at renewed.
func statusLease(t *testing.T, st agentstatus.State, renewed time.Time) *coordinationv1.Lease {
	t.Helper()
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	secs := int32(7)
	rt := metav1.NewMicroTime(renewed)
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: agentstatus.LeaseName(st.Node), Annotations: map[string]string{agentstatus.AnnotationState: string(b)}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &st.Node, LeaseDurationSeconds: &secs, RenewTime: &rt}}
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func TestGroupPeers(t *testing.T) {
	now := time.Now()
	old := now.Add(-time.Minute) // past the Lease's 7 s
	agentOf := func(node, group string, srcs ...string) agentstatus.State {
		return agentstatus.State{Node: node, Group: group, VRRPSources: srcs}
	}
	for _, tc := range []struct {
		name   string
		leases []*coordinationv1.Lease
		want   []netip.Addr
		mode   peerMode
	}{
		{name: "every agent publishes: the union of the group's, sorted", leases: []*coordinationv1.Lease{
			statusLease(t, agentOf("n2", "edge/web", "10.0.0.2", "fe80::2"), now),
			statusLease(t, agentOf("n1", "edge/web", "10.0.0.1", "fe80::1"), now),
			statusLease(t, agentOf("n9", "edge/other", "10.0.0.9"), now),
		}, want: addrs("10.0.0.1", "10.0.0.2", "fe80::1", "fe80::2"), mode: peersUnicast},
		{name: "this node's own Lease not there yet: wait", leases: []*coordinationv1.Lease{
			statusLease(t, agentOf("n2", "edge/web", "10.0.0.2"), now),
		}, mode: peersUnknown},
		{name: "this node's Lease from before its sources (an older agent): wait", leases: []*coordinationv1.Lease{
			statusLease(t, agentOf("n1", "edge/web"), now),
			statusLease(t, agentOf("n2", "edge/web", "10.0.0.2"), now),
		}, mode: peersUnknown},
		{name: "this node's Lease names another group: wait", leases: []*coordinationv1.Lease{
			statusLease(t, agentOf("n1", "edge/other", "10.0.0.1"), now),
		}, mode: peersUnknown},
		{name: "a live agent of the group publishes none (an upgrade): multicast", leases: []*coordinationv1.Lease{
			statusLease(t, agentOf("n1", "edge/web", "10.0.0.1"), now),
			statusLease(t, agentOf("n2", "edge/web"), now),
		}, mode: peersMulticast},
		{name: "a dead agent without sources does not hold the group on multicast", leases: []*coordinationv1.Lease{
			statusLease(t, agentOf("n1", "edge/web", "10.0.0.1"), now),
			statusLease(t, agentOf("n2", "edge/web"), old),
		}, want: addrs("10.0.0.1"), mode: peersUnicast},
		{name: "a Lease not renewed keeps its sources (the API server out of reach changes nothing)", leases: []*coordinationv1.Lease{
			statusLease(t, agentOf("n1", "edge/web", "10.0.0.1"), old),
			statusLease(t, agentOf("n2", "edge/web", "10.0.0.2"), old),
		}, want: addrs("10.0.0.1", "10.0.0.2"), mode: peersUnicast},
		{name: "unreadable states and addresses are skipped", leases: []*coordinationv1.Lease{
			statusLease(t, agentOf("n1", "edge/web", "10.0.0.1", "not-an-address"), now),
			{ObjectMeta: metav1.ObjectMeta{Name: "x", Annotations: map[string]string{agentstatus.AnnotationState: "{"}}},
		}, want: addrs("10.0.0.1"), mode: peersUnicast},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, mode := groupPeers(tc.leases, "edge/web", "n1", now)
			if mode != tc.mode {
				t.Errorf("mode %d, want %d", mode, tc.mode)
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
				t.Errorf("peers (-want +got):\n%s", diff)
			}
		})
	}
}

// TestVRRPWaitsForPeers: with unicast on, the announcer starts only once the
// peers are known, each router with its family's; later changes reach the
// running routers in place; an answer that does not know them changes nothing.
func TestVRRPWaitsForPeers(t *testing.T) {
	ctx := context.Background()
	v := newFakeVRRP(t)
	v.unicast = true
	g := model.Group{VRID: 7, VIPs: []netip.Addr{vip4a, vip6a}}
	if err := v.Apply(ctx, snapWith(g)); err != nil {
		t.Fatal(err)
	}
	if len(v.started) != 0 {
		t.Fatalf("%d announcers started before the peers were known", len(v.started))
	}
	if v.setPeers(ctx, nil, peersUnknown, false) || len(v.started) != 0 {
		t.Fatal("peersUnknown started the announcer")
	}
	peers := addrs("10.0.0.1", "10.0.0.2", "fe80::1", "fe80::2")
	if !v.setPeers(ctx, peers, peersUnicast, false) || len(v.started) != 1 {
		t.Fatalf("known peers: %d announcers started, want 1", len(v.started))
	}
	a := v.started[0]
	got := map[string][]netip.Addr{}
	for _, in := range a.cfg.Instances {
		got[in.Name] = in.Peers
	}
	want := map[string][]netip.Addr{"edge/web/v4": addrs("10.0.0.1", "10.0.0.2"), "edge/web/v6": addrs("fe80::1", "fe80::2")}
	if diff := cmp.Diff(want, got, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
		t.Errorf("routers' peers (-want +got):\n%s", diff)
	}

	// A new edge: the running routers get it in place.
	peers = addrs("10.0.0.1", "10.0.0.2", "10.0.0.3", "fe80::1", "fe80::2", "fe80::3")
	v.setPeers(ctx, peers, peersUnicast, false)
	want = map[string][]netip.Addr{"edge/web/v4": addrs("10.0.0.1", "10.0.0.2", "10.0.0.3"), "edge/web/v6": addrs("fe80::1", "fe80::2", "fe80::3")}
	if diff := cmp.Diff(want, a.peers, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
		t.Errorf("peers given in place (-want +got):\n%s", diff)
	}
	if len(v.started) != 1 || a.hasStopped() {
		t.Errorf("a peer change rebuilt the announcer: %d started", len(v.started))
	}
	// This node's Lease gone for a moment, and the wait's end: nothing changes.
	if v.setPeers(ctx, nil, peersUnknown, false) || v.setPeers(ctx, nil, peersMulticast, true) {
		t.Error("an unknown answer or a late fallback changed the peers")
	}
	// An older agent joins: multicast, from any source.
	v.setPeers(ctx, nil, peersMulticast, false)
	if len(a.peers["edge/web/v4"]) != 0 || len(a.peers["edge/web/v6"]) != 0 {
		t.Errorf("multicast left peers %v", a.peers)
	}
}

// TestVRRPPeerWaitFallback: without this node's Lease, the wait's end starts
// the announcer on multicast.
func TestVRRPPeerWaitFallback(t *testing.T) {
	ctx := context.Background()
	v := newFakeVRRP(t)
	v.unicast = true
	if err := v.Apply(ctx, snapWith(model.Group{VRID: 7, VIPs: []netip.Addr{vip4a}})); err != nil {
		t.Fatal(err)
	}
	if !v.setPeers(ctx, nil, peersMulticast, true) || len(v.started) != 1 {
		t.Fatalf("the fallback started %d announcers, want 1", len(v.started))
	}
	if p := v.started[0].cfg.Instances[0].Peers; len(p) != 0 {
		t.Errorf("fallback peers %v, want none (multicast)", p)
	}
}
