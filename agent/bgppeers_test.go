package agent

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/record"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/bgp"
)

const peerNS = "portico-system"

func ptr[T any](v T) *T { return &v }

// bgpPeer is a BGPPeer created at minute age (older objects first).
func bgpPeer(name string, minute int, spec v1alpha1.BGPPeerSpec) *v1alpha1.BGPPeer {
	return &v1alpha1.BGPPeer{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "BGPPeer"},
		ObjectMeta: metav1.ObjectMeta{Namespace: peerNS, Name: name, Generation: 1,
			CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 1, 0, minute, 0, 0, time.UTC))},
		Spec: spec,
	}
}

// speakerCheck is the check of a speaker in AS 64512 that does not listen.
func speakerCheck() func(bgp.Peer) error {
	c := bgp.Config{ASN: 64512, RouterID: netip.MustParseAddr("10.0.0.11")}
	c.SetDefaults()
	return c.CheckPeer
}

func peerInputsFor(objs ...*v1alpha1.BGPPeer) peerInputs {
	return peerInputs{
		namespace: peerNS,
		file:      []bgp.Peer{{Addr: netip.MustParseAddr("10.0.0.1"), ASN: 65000}},
		objects:   objs,
		profiles: map[string]v1alpha1.BFDProfileSpec{
			"fast":     {TransmitInterval: ptr[uint32](50), ReceiveInterval: ptr[uint32](60), DetectMultiplier: ptr[uint32](4)},
			"defaults": {},
		},
		node: labels.Set{"rack": "r1", "kubernetes.io/hostname": "edge-1"},
		secret: func(name string) (*corev1.Secret, bool) {
			switch name {
			case "bgp-auth":
				return &corev1.Secret{Data: map[string][]byte{"password": []byte("s3cret")}}, true
			case "no-key":
				return &corev1.Secret{Data: map[string][]byte{"username": []byte("x")}}, true
			}
			return nil, false
		},
		check: speakerCheck(),
	}
}

// TestDesiredPeers: which BGPPeers a node peers with, with what, and why it
// refuses the others.
func TestDesiredPeers(t *testing.T) {
	rack := func(r string) []metav1.LabelSelector {
		return []metav1.LabelSelector{{MatchLabels: map[string]string{"rack": r}}}
	}
	type verdict struct{ Name, State, Err string }
	tests := []struct {
		name      string
		objs      []*v1alpha1.BGPPeer
		wantPeers []bgp.Peer // after the file's
		want      []verdict
	}{
		{name: "no objects: the file's peers", want: nil},
		{
			name: "every node, all fields",
			objs: []*v1alpha1.BGPPeer{bgpPeer("tor", 0, v1alpha1.BGPPeerSpec{Address: "10.0.0.2", ASN: 65001, Port: ptr[int32](1179),
				HoldTime: &metav1.Duration{Duration: 6 * time.Second}, KeepaliveInterval: &metav1.Duration{Duration: 2 * time.Second},
				BFDProfile: "fast", PasswordSecret: &corev1.SecretReference{Name: "bgp-auth"}})},
			wantPeers: []bgp.Peer{{Addr: netip.MustParseAddr("10.0.0.2"), ASN: 65001, Port: 1179, Password: "s3cret",
				HoldTime: 6 * time.Second, KeepaliveInterval: 2 * time.Second,
				BFD: &bgp.BFD{MinTx: 50 * time.Millisecond, MinRx: 60 * time.Millisecond, Multiplier: 4}}},
			want: []verdict{{"tor", peerObjectUsed, ""}},
		},
		{
			name: "selectors: any of them matches",
			objs: []*v1alpha1.BGPPeer{
				bgpPeer("r1", 0, v1alpha1.BGPPeerSpec{Address: "10.0.0.2", ASN: 65001, NodeSelectors: rack("r1")}),
				bgpPeer("r2", 1, v1alpha1.BGPPeerSpec{Address: "10.0.0.3", ASN: 65001, NodeSelectors: rack("r2")}),
				bgpPeer("r2-or-edge-1", 2, v1alpha1.BGPPeerSpec{Address: "10.0.0.4", ASN: 65001, EBGPMultiHop: true, NodeSelectors: append(rack("r2"),
					metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: metav1.LabelSelectorOpIn, Values: []string{"edge-1"}}}})}),
			},
			wantPeers: []bgp.Peer{{Addr: netip.MustParseAddr("10.0.0.2"), ASN: 65001}, {Addr: netip.MustParseAddr("10.0.0.4"), ASN: 65001, EBGPMultiHop: true}},
			want:      []verdict{{"r1", peerObjectUsed, ""}, {"r2", peerObjectOtherNodes, ""}, {"r2-or-edge-1", peerObjectUsed, ""}},
		},
		{
			name:      "profile without timers: the speaker's defaults",
			objs:      []*v1alpha1.BGPPeer{bgpPeer("tor", 0, v1alpha1.BGPPeerSpec{Address: "2001:db8::1", ASN: 65001, BFDProfile: "defaults"})},
			wantPeers: []bgp.Peer{{Addr: netip.MustParseAddr("2001:db8::1"), ASN: 65001, BFD: &bgp.BFD{}}},
			want:      []verdict{{"tor", peerObjectUsed, ""}},
		},
		{
			name: "refusals, each alone",
			objs: []*v1alpha1.BGPPeer{
				bgpPeer("unknown-profile", 0, v1alpha1.BGPPeerSpec{Address: "10.0.0.2", ASN: 65001, BFDProfile: "slow"}),
				bgpPeer("no-secret", 1, v1alpha1.BGPPeerSpec{Address: "10.0.0.3", ASN: 65001, PasswordSecret: &corev1.SecretReference{Name: "gone"}}),
				bgpPeer("no-key", 2, v1alpha1.BGPPeerSpec{Address: "10.0.0.4", ASN: 65001, PasswordSecret: &corev1.SecretReference{Name: "no-key"}}),
				bgpPeer("other-namespace", 3, v1alpha1.BGPPeerSpec{Address: "10.0.0.5", ASN: 65001, PasswordSecret: &corev1.SecretReference{Name: "bgp-auth", Namespace: "tenant"}}),
				bgpPeer("bad-address", 4, v1alpha1.BGPPeerSpec{Address: "10.0.0.300", ASN: 65001}),
				bgpPeer("asn-0", 5, v1alpha1.BGPPeerSpec{Address: "10.0.0.6", ASN: 0}),
				bgpPeer("file-address", 6, v1alpha1.BGPPeerSpec{Address: "10.0.0.1", ASN: 65001}),
				bgpPeer("bad-selector", 7, v1alpha1.BGPPeerSpec{Address: "10.0.0.7", ASN: 65001, NodeSelectors: []metav1.LabelSelector{
					{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "rack", Operator: "Near"}}}}}),
				bgpPeer("hold-time", 8, v1alpha1.BGPPeerSpec{Address: "10.0.0.8", ASN: 65001, HoldTime: &metav1.Duration{Duration: time.Second}}),
				bgpPeer("good", 9, v1alpha1.BGPPeerSpec{Address: "10.0.0.9", ASN: 65001}),
			},
			wantPeers: []bgp.Peer{{Addr: netip.MustParseAddr("10.0.0.9"), ASN: 65001}},
			want: []verdict{
				{"unknown-profile", peerObjectRefused, `no BFDProfile "slow" in namespace portico-system`},
				{"no-secret", peerObjectRefused, "no Secret gone in namespace portico-system"},
				{"no-key", peerObjectRefused, `Secret no-key has no key "password"`},
				{"other-namespace", peerObjectRefused, "must be in the BGPPeer's namespace portico-system"},
				{"bad-address", peerObjectRefused, `address "10.0.0.300"`},
				{"asn-0", peerObjectRefused, "asn 0 is not a usable AS number"},
				{"file-address", peerObjectRefused, "address 10.0.0.1 is already the --bgp-config file's peer"},
				{"bad-selector", peerObjectRefused, "nodeSelectors[0]"},
				{"hold-time", peerObjectRefused, "hold time 1s is not 3s to 65535s"},
				{"good", peerObjectUsed, ""},
			},
		},
		{
			name: "two objects, one address: the older keeps it",
			objs: []*v1alpha1.BGPPeer{
				bgpPeer("newer", 5, v1alpha1.BGPPeerSpec{Address: "10.0.0.2", ASN: 65002}),
				bgpPeer("older", 1, v1alpha1.BGPPeerSpec{Address: "10.0.0.2", ASN: 65001}),
			},
			wantPeers: []bgp.Peer{{Addr: netip.MustParseAddr("10.0.0.2"), ASN: 65001}},
			want:      []verdict{{"older", peerObjectUsed, ""}, {"newer", peerObjectRefused, "address 10.0.0.2 is already BGPPeer older's (older)"}},
		},
		{
			name:      "a node's other node selector: not this node's, not refused",
			objs:      []*v1alpha1.BGPPeer{bgpPeer("r2", 0, v1alpha1.BGPPeerSpec{Address: "10.0.0.1", ASN: 65001, NodeSelectors: rack("r2")})},
			wantPeers: nil,
			want:      []verdict{{"r2", peerObjectOtherNodes, ""}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := peerInputsFor(tt.objs...)
			peers, verdicts := desiredPeers(in)
			want := append(append([]bgp.Peer(nil), in.file...), tt.wantPeers...)
			if d := cmp.Diff(want, peers, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); d != "" {
				t.Errorf("peers (-want +got):\n%s", d)
			}
			var got []verdict
			for i, v := range verdicts {
				g := verdict{v.obj.Name, v.state, ""}
				if v.err != nil {
					g.Err = v.err.Error()
					if i < len(tt.want) && tt.want[i].Err != "" && strings.Contains(g.Err, tt.want[i].Err) {
						g.Err = tt.want[i].Err
					}
				}
				got = append(got, g)
			}
			if d := cmp.Diff(tt.want, got); d != "" { // Err: the case's substring when the error has it
				t.Errorf("verdicts (-want +got):\n%s", d)
			}
		})
	}
}

// TestPeerObjectsSync: sync applies a changed set only, records a Warning
// Event on a refused BGPPeer once per reason and a Normal one when it is used
// again, counts the objects by state, and leaves applied alone when apply
// fails (so the next sync retries).
func TestPeerObjectsSync(t *testing.T) {
	rec := record.NewFakeRecorder(10)
	var calls [][]bgp.Peer
	var fail error
	po := &peerObjects{namespace: peerNS, node: "edge-1", file: peerInputsFor().file, check: speakerCheck(),
		apply: func(_ context.Context, p []bgp.Peer) error {
			if fail != nil {
				return fail
			}
			calls = append(calls, p)
			return nil
		},
		log: zaptest.NewLogger(t), met: newPeerMetrics(), recorder: rec, reported: map[string]string{}}
	ctx := context.Background()
	events := func() []string {
		var out []string
		for {
			select {
			case e := <-rec.Events:
				out = append(out, e)
			default:
				return out
			}
		}
	}
	sync := func(objs ...*v1alpha1.BGPPeer) error {
		in := peerInputsFor(objs...)
		in.file = po.file
		return po.sync(ctx, in)
	}

	good := bgpPeer("tor", 0, v1alpha1.BGPPeerSpec{Address: "10.0.0.2", ASN: 65001})
	bad := bgpPeer("tor2", 1, v1alpha1.BGPPeerSpec{Address: "10.0.0.3", ASN: 65001, BFDProfile: "slow"})
	if err := sync(good, bad); err != nil {
		t.Fatal(err)
	}
	if len(calls) != 1 || len(calls[0]) != 2 {
		t.Fatalf("apply calls %v, want one with the file's peer and tor's", calls)
	}
	if ev := events(); len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning PeerRefused node edge-1: no BFDProfile \"slow\"") {
		t.Errorf("events %q, want one Warning PeerRefused naming the profile", ev)
	}
	if got := testutil.ToFloat64(po.met.objects.WithLabelValues(peerObjectRefused)); got != 1 {
		t.Errorf("peer_objects{state=refused} = %v, want 1", got)
	}
	// Nothing changed: no apply, no repeated Event.
	if err := sync(good, bad); err != nil {
		t.Fatal(err)
	}
	if len(calls) != 1 || len(events()) != 0 {
		t.Errorf("a sync without changes applied (%d calls) or recorded Events", len(calls))
	}
	// tor2 fixed: applied with it, and a Normal Event.
	fixed := bad.DeepCopy()
	fixed.Spec.BFDProfile = "fast"
	if err := sync(good, fixed); err != nil {
		t.Fatal(err)
	}
	if len(calls) != 2 || len(calls[1]) != 3 {
		t.Errorf("apply calls %v, want a second with three peers", calls)
	}
	if ev := events(); len(ev) != 1 || !strings.HasPrefix(ev[0], "Normal PeerConfigured node edge-1: peering with 10.0.0.3") {
		t.Errorf("events %q, want one Normal PeerConfigured", ev)
	}
	// A failed apply is returned and retried by the next sync.
	fail = errors.New("gobgp refused")
	if err := sync(good); err == nil {
		t.Fatal("sync with a failing apply = nil, want its error")
	}
	fail = nil
	if err := sync(good); err != nil {
		t.Fatal(err)
	}
	if len(calls) != 3 || len(calls[2]) != 2 {
		t.Errorf("apply calls %v, want a third with two peers (the retry)", calls)
	}
	if got := testutil.ToFloat64(po.met.objects.WithLabelValues(peerObjectUsed)); got != 1 {
		t.Errorf("peer_objects{state=used} = %v, want 1", got)
	}
}
