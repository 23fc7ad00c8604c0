package lab

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/test/testenv"
)

// frrNeighbor is what FRR says of one BGP neighbor.
type frrNeighbor struct {
	State       string `json:"bgpState"`
	Established int    `json:"connectionsEstablished"`
	Dropped     int    `json:"connectionsDropped"`
}

// neighbors is FRR's view of r's BGP neighbors, by address.
func (r *Router) neighbors() (map[string]frrNeighbor, error) {
	var n map[string]frrNeighbor
	err := r.FRR.VtyJSON("show bgp neighbors json", &n)
	return n, err
}

// bfdPeer is what FRR says of one BFD session.
type bfdPeer struct {
	Peer     string `json:"peer"`
	Status   string `json:"status"`
	RemoteTx int    `json:"remote-transmit-interval"` // ms
}

// bfdPeers is FRR's view of r's BFD sessions, by peer address.
func (r *Router) bfdPeers() (map[string]bfdPeer, error) {
	var l []bfdPeer
	if err := r.FRR.VtyJSON("show bfd peers json", &l); err != nil {
		return nil, err
	}
	out := map[string]bfdPeer{}
	for _, p := range l {
		out[p.Peer] = p
	}
	return out, nil
}

// TestBGPPeerObjects: the edges peer with routers named by BGPPeer objects
// alone (their --bgp-config file has none), with the BFD timers of a
// BFDProfile and the TCP MD5 password of a Secret, and follow changes to those
// objects live, each touching only the sessions it concerns, as FRR sees them:
//   - the lab comes up through the router of the BGPPeer "rt" (password from a
//     Secret, so TCP MD5 works between the namespaces);
//   - a second router "rt2", for the nodes labelled rack=a only: its sessions
//     come up on those edges alone, and rt's sessions are not reset;
//   - rt2's BFDProfile changes: no session of rt2 or rt drops, the running BFD
//     sessions keep their interval, and rt2's next session with an edge (after
//     FRR's clear bgp) runs the new one;
//   - rt's own BFDProfile changes: no session drops either;
//   - the BGPPeer "rt" is deleted: rt's sessions end, rt2's stay.
func TestBGPPeerObjects(t *testing.T) {
	o := BGPOptions{BFD: 100 * time.Millisecond, BFDMultiplier: 5, PeerObjects: true, Password: "lab-md5-s3cret"}
	l := startBGPLabWith(t, o)
	ctx := context.Background()
	dyn, err := dynamic.NewForConfig(l.API.Config)
	if err != nil {
		t.Fatal(err)
	}
	edgeAddrs := make([]string, len(l.Edges))
	for i := range l.Edges {
		edgeAddrs[i] = l.EdgeAddr(i).String()
	}
	rt := l.Router
	rtAddr := l.RouterAddr().String()
	metric := func(i int, series string) float64 {
		t.Helper()
		v, err := l.Metric(i, series)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error { return rt.Announced(len(l.Edges)) }); err != nil {
		t.Fatal(err)
	}
	for i := range l.Edges {
		if used, peers := metric(i, `portico_bgp_peer_objects{state="used"}`), metric(i, "portico_bgp_peers"); used != 1 || peers != 1 {
			t.Errorf("edge %s: %v BGPPeers used, %v peers; want 1 and 1 (rt, from its object)", l.Edges[i].Name, used, peers)
		}
	}
	before, err := rt.neighbors()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range edgeAddrs {
		if n := before[a]; n.State != "Established" || n.Established != 1 || n.Dropped != 0 {
			t.Fatalf("rt's session with %s: %+v, want established once, never dropped", a, n)
		}
	}
	// rtStays checks that none of rt's sessions was reset since the start.
	rtStays := func(step string) {
		t.Helper()
		now, err := rt.neighbors()
		if err != nil {
			t.Fatal(err)
		}
		for i, a := range edgeAddrs {
			if n := now[a]; n != before[a] {
				t.Errorf("%s: rt's session with %s is %+v, was %+v: reset", step, a, n, before[a])
			}
			if up := metric(i, fmt.Sprintf(`portico_bgp_session_transitions_total{peer=%q,to="established"}`, rtAddr)); up != 1 {
				t.Errorf("%s: edge %s's session with rt came up %v times, want once", step, l.Edges[i].Name, up)
			}
		}
	}

	// The edges' Nodes: the first two in rack a.
	for i, e := range l.Edges {
		rack := "a"
		if i >= 2 {
			rack = "b"
		}
		if _, err := l.Kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: e.Name, Labels: map[string]string{"rack": rack}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	rackA := edgeAddrs[:2]
	o2 := o
	o2.BFD, o2.BFDMultiplier, o2.Password, o2.T = 300*time.Millisecond, 3, "", t
	const rt2Addr = "10.216.0.3"
	rt2, err := l.StartPeerRouter(&o2, "rt2", 3, 65001)
	if err != nil {
		t.Fatal(err)
	}
	apply := func(step, yaml string) {
		t.Helper()
		if err := l.ServerSideApply(ctx, step, []byte(yaml)); err != nil {
			t.Fatal(err)
		}
	}
	profile := func(name string, ms int) string {
		return fmt.Sprintf("apiVersion: portico.io/v1alpha1\nkind: BFDProfile\nmetadata: {name: %s, namespace: %s}\nspec: {transmitInterval: %d, receiveInterval: %d, detectMultiplier: 3}\n",
			name, AgentNamespace, ms, ms)
	}
	apply("rt2", profile("slow", 300)+"---\n"+fmt.Sprintf(`apiVersion: portico.io/v1alpha1
kind: BGPPeer
metadata: {name: rt2, namespace: %s}
spec:
  address: %s
  asn: 65001
  holdTime: 3s
  keepaliveInterval: 1s
  bfdProfile: slow
  nodeSelectors:
  - matchLabels: {rack: a}
`, AgentNamespace, rt2Addr))
	// rt2BFD waits until rt2's sessions with rack a are established, with BFD
	// up at the interval ms, and returns them.
	rt2Up := func(step string, ms int) map[string]frrNeighbor {
		t.Helper()
		var ns map[string]frrNeighbor
		testenv.Eventually(t, 30*time.Second, func() string {
			var err error
			if ns, err = rt2.neighbors(); err != nil {
				return err.Error()
			}
			bfd, err := rt2.bfdPeers()
			if err != nil {
				return err.Error()
			}
			for _, a := range rackA {
				if ns[a].State != "Established" || bfd[a].Status != "up" || bfd[a].RemoteTx != ms {
					return fmt.Sprintf("%s: rt2's session with %s: %+v, BFD %+v; want established, BFD up at %d ms", step, a, ns[a], bfd[a], ms)
				}
			}
			return ""
		})
		return ns
	}
	rt2Before := rt2Up("rt2 added", 300)
	if n := rt2Before[edgeAddrs[2]]; n.State == "Established" || n.Established != 0 {
		t.Errorf("rt2's session with %s (rack b): %+v, want never established", edgeAddrs[2], n)
	}
	if got := metric(2, `portico_bgp_peer_objects{state="otherNodes"}`); got != 1 {
		t.Errorf("edge %s: %v BGPPeers for other nodes, want 1 (rt2)", l.Edges[2].Name, got)
	}
	rtStays("rt2 added")

	// rt2's profile changes: the running BFD sessions keep their timers (GoBGP
	// would end them to change them, and FRR would reset BGP), no session of
	// rt2 or rt drops; rt2's next session with an edge runs the new ones.
	apply("slow at 200 ms", profile("slow", 200))
	time.Sleep(3 * time.Second) // the agents have it by now, and a reset would show
	rt2After := rt2Up("slow at 200 ms, running sessions", 300)
	for _, a := range rackA {
		if rt2After[a] != rt2Before[a] {
			t.Errorf("rt2's session with %s after its BFDProfile changed: %+v, was %+v", a, rt2After[a], rt2Before[a])
		}
	}
	rtStays("slow at 200 ms")
	if err := rt2.FRR.Vty("clear bgp " + rackA[0]); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() string {
		ns, err := rt2.neighbors()
		if err != nil {
			return err.Error()
		}
		bfd, err := rt2.bfdPeers()
		if err != nil {
			return err.Error()
		}
		a := rackA[0]
		if n := ns[a]; n.State != "Established" || n.Established != rt2After[a].Established+1 || bfd[a].Status != "up" || bfd[a].RemoteTx != 200 {
			return fmt.Sprintf("rt2's session with %s after clear bgp: %+v, BFD %+v; want established anew, BFD up at 200 ms", a, n, bfd[a])
		}
		return ""
	})
	rt2After, err = rt2.neighbors()
	if err != nil {
		t.Fatal(err)
	}
	rtStays("rt2's session with one edge cleared")

	// rt's own profile changes: the same, for the first sessions.
	apply("lab slower", fmt.Sprintf("apiVersion: portico.io/v1alpha1\nkind: BFDProfile\nmetadata: {name: lab, namespace: %s}\nspec: {transmitInterval: %d, receiveInterval: %d, detectMultiplier: %d}\n",
		AgentNamespace, o.BFD.Milliseconds()+50, o.BFD.Milliseconds()+50, o.BFDMultiplier))
	time.Sleep(3 * time.Second)
	bfd, err := rt.bfdPeers()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range edgeAddrs {
		if bfd[a].Status != "up" || bfd[a].RemoteTx != int(o.BFD.Milliseconds()) {
			t.Errorf("rt's BFD session with %s after its profile changed: %+v, want up at %v until the session restarts", a, bfd[a], o.BFD)
		}
	}
	rtStays("rt's profile changed")

	// rt's BGPPeer deleted: every edge ends its session with rt (a Cease),
	// rt2's stay.
	if err := dyn.Resource(v1alpha1.BGPPeerResource).Namespace(AgentNamespace).Delete(ctx, "rt", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 15*time.Second, func() string {
		ns, err := rt.neighbors()
		if err != nil {
			return err.Error()
		}
		for _, a := range edgeAddrs {
			if ns[a].State == "Established" {
				return fmt.Sprintf("rt's session with %s is still established", a)
			}
		}
		if hops, err := rt.Nexthops(); err != nil || len(hops) != 0 {
			return fmt.Sprintf("rt's route to the VIP: %v (%v), want none", hops, err)
		}
		return ""
	})
	ns, err := rt2.neighbors()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range rackA {
		if ns[a] != rt2After[a] {
			t.Errorf("rt2's session with %s after rt's BGPPeer was deleted: %+v, was %+v", a, ns[a], rt2After[a])
		}
	}
	for i := range l.Edges {
		want := 0.0
		if slices.Contains(rackA, edgeAddrs[i]) {
			want = 1
		}
		if got := metric(i, "portico_bgp_peers"); got != want {
			t.Errorf("edge %s: %v peers after rt's deletion, want %v", l.Edges[i].Name, got, want)
		}
	}
}
