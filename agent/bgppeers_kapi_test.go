package agent

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/bgp"
	"github.com/portico-edge/portico/test/kapi"
	"github.com/portico-edge/portico/test/testenv"
)

// installPeerCRDs creates the BGPPeer and BFDProfile CRDs of the chart and
// waits until they are served.
func installPeerCRDs(t *testing.T, ctx context.Context, dyn dynamic.Interface) {
	t.Helper()
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	for _, f := range []string{"bgppeers.portico.io.yaml", "bfdprofiles.portico.io.yaml"} {
		data, err := os.ReadFile("../deploy/helm/portico/crds/" + f)
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(data, &u.Object); err != nil {
			t.Fatalf("decode %s: %v", f, err)
		}
		if _, err := crds.Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create CRD %s: %v", f, err)
		}
	}
	testenv.Eventually(t, 30*time.Second, func() string {
		for _, r := range []schema.GroupVersionResource{v1alpha1.BGPPeerResource, v1alpha1.BFDProfileResource} {
			if _, err := dyn.Resource(r).Namespace("default").List(ctx, metav1.ListOptions{}); err != nil {
				return fmt.Sprintf("%s not served: %v", r.Resource, err)
			}
		}
		return ""
	})
}

// objClient writes portico.io objects of one namespace through the dynamic client.
type objClient struct {
	t   *testing.T
	ctx context.Context
	dyn dynamic.Interface
	ns  string
}

func (c objClient) put(kind string, res schema.GroupVersionResource, obj runtime.Object) error {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		c.t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion(v1alpha1.GroupVersion.String())
	u.SetKind(kind)
	ri := c.dyn.Resource(res).Namespace(c.ns)
	cur, err := ri.Get(c.ctx, u.GetName(), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = ri.Create(c.ctx, u, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	u.SetResourceVersion(cur.GetResourceVersion())
	_, err = ri.Update(c.ctx, u, metav1.UpdateOptions{})
	return err
}

func (c objClient) peer(name string, spec v1alpha1.BGPPeerSpec) error {
	return c.put("BGPPeer", v1alpha1.BGPPeerResource, &v1alpha1.BGPPeer{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns}, Spec: spec})
}

func (c objClient) profile(name string, spec v1alpha1.BFDProfileSpec) error {
	return c.put("BFDProfile", v1alpha1.BFDProfileResource, &v1alpha1.BFDProfile{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns}, Spec: spec})
}

// TestPeerObjectsAPIServer runs the agent's BGPPeer follower against a real
// kube-apiserver, with a real (not started) speaker: creating, changing and
// deleting BGPPeers and BFDProfiles, relabelling the agent's Node and adding
// the Secret a BGPPeer names each changes the speaker's peers as they should;
// a refused BGPPeer gets a Warning Event; and the CRDs' validation refuses
// what no agent could use.
func TestPeerObjectsAPIServer(t *testing.T) {
	kapi.Require(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lctx, lcancel := context.WithTimeout(ctx, 2*time.Minute)
	srv, err := kapi.Launch(lctx, kapi.Options{})
	lcancel()
	if err != nil {
		t.Fatalf("start kube-apiserver: %v", err)
	}
	t.Cleanup(func() { srv.Stop() })
	cs := kubernetes.NewForConfigOrDie(srv.Config)
	dyn := dynamic.NewForConfigOrDie(srv.Config)
	installPeerCRDs(t, ctx, dyn)
	const ns, node = "portico-system", "edge-1"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{"rack": "r1"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Another node, relabelled below too: the agent must follow its own only.
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-2", Labels: map[string]string{"rack": "r2"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	cfg := bgp.Config{ASN: 64512, RouterID: netip.MustParseAddr("10.0.0.11"),
		Peers: []bgp.Peer{{Addr: netip.MustParseAddr("10.0.0.1"), ASN: 65000}}}
	met, err := bgp.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	log := zaptest.NewLogger(t)
	speaker, err := bgp.New(cfg, log.Named("bgp"), met)
	if err != nil {
		t.Fatal(err)
	}
	cfg.SetDefaults()
	var mu sync.Mutex
	var applied []bgp.Peer
	po := &peerObjects{namespace: ns, node: node, file: cfg.Peers, check: cfg.CheckPeer,
		apply: func(ctx context.Context, p []bgp.Peer) error {
			if err := speaker.Reconfigure(ctx, p); err != nil {
				return err
			}
			mu.Lock()
			applied = slices.Clone(p)
			mu.Unlock()
			return nil
		},
		log: log.Named("peers"), met: newPeerMetrics(), events: true, retry: time.Second, reported: map[string]string{}}
	done := make(chan error, 1)
	go func() { done <- po.run(ctx, cs, dyn) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})

	// peersAre waits until the speaker's peers are want (address: BFD tx in
	// ms, 0 without BFD; "pw" marks a password).
	peersAre := func(step string, want map[string]string) {
		t.Helper()
		testenv.Eventually(t, 10*time.Second, func() string {
			mu.Lock()
			defer mu.Unlock()
			got := map[string]string{}
			for _, p := range applied {
				v := "0"
				if p.BFD != nil {
					v = fmt.Sprint(p.BFD.MinTx.Milliseconds())
				}
				if p.Password != "" {
					v += " pw"
				}
				got[p.Addr.String()] = v
			}
			var status []string
			for _, p := range speaker.Status().Peers {
				status = append(status, p.Addr.String())
			}
			slices.Sort(status)
			var wantAddrs []string
			for a := range want {
				wantAddrs = append(wantAddrs, a)
			}
			slices.Sort(wantAddrs)
			if fmt.Sprint(got) != fmt.Sprint(want) || !slices.Equal(status, wantAddrs) {
				return fmt.Sprintf("%s: applied %v (speaker status %v), want %v", step, got, status, want)
			}
			return ""
		})
	}
	oc := objClient{t: t, ctx: ctx, dyn: dyn, ns: ns}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	peersAre("start: the file's peer", map[string]string{"10.0.0.1": "0"})
	must(oc.profile("fast", v1alpha1.BFDProfileSpec{TransmitInterval: ptr[uint32](50), ReceiveInterval: ptr[uint32](50)}))
	must(oc.peer("tor", v1alpha1.BGPPeerSpec{Address: "10.0.0.2", ASN: 65000, BFDProfile: "fast"}))
	peersAre("tor added", map[string]string{"10.0.0.1": "0", "10.0.0.2": "50"})

	// A peer for rack r2: not this node's until its Node is relabelled (edge-2's
	// label changes nothing here).
	must(oc.peer("r2", v1alpha1.BGPPeerSpec{Address: "10.0.0.3", ASN: 65000,
		NodeSelectors: []metav1.LabelSelector{{MatchLabels: map[string]string{"rack": "r2"}}}}))
	// The agent took r2 in (its gauge counts it for other nodes) and left
	// its peers alone: sync sets the gauge and applies the peers under po.mu,
	// so a gauge read under it comes after that sync's apply.
	testenv.Eventually(t, 10*time.Second, func() string {
		po.mu.Lock()
		n := testutil.ToFloat64(po.met.objects.WithLabelValues(peerObjectOtherNodes))
		po.mu.Unlock()
		if n != 1 {
			return fmt.Sprintf("portico_bgp_peer_objects{state=%q} = %v, want 1", peerObjectOtherNodes, n)
		}
		return ""
	})
	peersAre("r2 for other nodes", map[string]string{"10.0.0.1": "0", "10.0.0.2": "50"})
	relabel := func(name, rack string) {
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		must(err)
		n.Labels["rack"] = rack
		_, err = cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		must(err)
	}
	relabel(node, "r2")
	peersAre("node moved to r2", map[string]string{"10.0.0.1": "0", "10.0.0.2": "50", "10.0.0.3": "0"})

	// A password Secret that does not exist yet: refused, with an Event.
	must(oc.peer("secure", v1alpha1.BGPPeerSpec{Address: "10.0.0.4", ASN: 65000, PasswordSecret: &corev1.SecretReference{Name: "tor-auth"}}))
	testenv.Eventually(t, 10*time.Second, func() string {
		evs, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Kind == "BGPPeer" && e.InvolvedObject.Name == "secure" && e.Reason == v1alpha1.ReasonPeerRefused &&
				e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, "no Secret tor-auth") && e.Source.Host == node {
				return ""
			}
		}
		return fmt.Sprintf("no Warning PeerRefused Event on BGPPeer secure among %d Events", len(evs.Items))
	})
	peersAre("secure refused", map[string]string{"10.0.0.1": "0", "10.0.0.2": "50", "10.0.0.3": "0"})
	_, err = cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "tor-auth"},
		Type: corev1.SecretTypeBasicAuth, StringData: map[string]string{"password": "s3cret"}}, metav1.CreateOptions{})
	must(err)
	peersAre("secret created", map[string]string{"10.0.0.1": "0", "10.0.0.2": "50", "10.0.0.3": "0", "10.0.0.4": "0 pw"})

	// The profile changes: tor's BFD follows. tor deleted: gone; the others stay.
	must(oc.profile("fast", v1alpha1.BFDProfileSpec{TransmitInterval: ptr[uint32](100), ReceiveInterval: ptr[uint32](100)}))
	peersAre("profile changed", map[string]string{"10.0.0.1": "0", "10.0.0.2": "100", "10.0.0.3": "0", "10.0.0.4": "0 pw"})
	must(dyn.Resource(v1alpha1.BGPPeerResource).Namespace(ns).Delete(ctx, "tor", metav1.DeleteOptions{}))
	relabel(node, "r1")
	peersAre("tor deleted, node back in r1", map[string]string{"10.0.0.1": "0", "10.0.0.4": "0 pw"})
	// A BGPPeer in another namespace is not the agent's.
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tenant"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	must(objClient{t: t, ctx: ctx, dyn: dyn, ns: "tenant"}.peer("intruder", v1alpha1.BGPPeerSpec{Address: "10.0.0.66", ASN: 65000}))
	time.Sleep(time.Second)
	peersAre("a tenant's BGPPeer", map[string]string{"10.0.0.1": "0", "10.0.0.4": "0 pw"})

	// The CRDs refuse what no agent could use.
	for _, tc := range []struct {
		name string
		spec v1alpha1.BGPPeerSpec
		want string
	}{
		{"bad address", v1alpha1.BGPPeerSpec{Address: "10.0.0.300", ASN: 65000}, "address must be an IP address"},
		{"non-canonical address", v1alpha1.BGPPeerSpec{Address: "2001:db8:0::1", ASN: 65000}, "address must be an IP address"},
		{"asn 0", v1alpha1.BGPPeerSpec{Address: "10.0.0.5", ASN: 0}, "spec.asn"},
		{"AS_TRANS", v1alpha1.BGPPeerSpec{Address: "10.0.0.5", ASN: 23456}, "AS_TRANS"},
		{"hold time fraction", v1alpha1.BGPPeerSpec{Address: "10.0.0.5", ASN: 65000, HoldTime: &metav1.Duration{Duration: 3500 * time.Millisecond}}, "spec.holdTime"},
		{"hold time short", v1alpha1.BGPPeerSpec{Address: "10.0.0.5", ASN: 65000, HoldTime: &metav1.Duration{Duration: 2 * time.Second}}, "holdTime must be whole seconds from 3s"},
		{"keepalive without hold time", v1alpha1.BGPPeerSpec{Address: "10.0.0.5", ASN: 65000, KeepaliveInterval: &metav1.Duration{Duration: time.Second}}, "keepaliveInterval needs holdTime"},
		{"multihop with bfd", v1alpha1.BGPPeerSpec{Address: "10.0.0.5", ASN: 65000, EBGPMultiHop: true, BFDProfile: "fast"}, "single hop"},
		{"port 0", v1alpha1.BGPPeerSpec{Address: "10.0.0.5", ASN: 65000, Port: ptr[int32](0)}, "spec.port"},
	} {
		err := oc.peer("invalid", tc.spec)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: create = %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	if err := oc.peer("four-byte-asn", v1alpha1.BGPPeerSpec{Address: "2001:db8::1", ASN: 4200000000,
		HoldTime: &metav1.Duration{Duration: 30 * time.Second}, KeepaliveInterval: &metav1.Duration{Duration: 10 * time.Second}}); err != nil {
		t.Errorf("a valid BGPPeer with a 4-byte AS: %v", err)
	}
	if err := oc.profile("bad", v1alpha1.BFDProfileSpec{TransmitInterval: ptr[uint32](5)}); err == nil || !strings.Contains(err.Error(), "transmitInterval") {
		t.Errorf("BFDProfile with a 5 ms interval: %v, want refused", err)
	}
	peersAre("a 4-byte AS peer", map[string]string{"10.0.0.1": "0", "10.0.0.4": "0 pw", "2001:db8::1": "0"})
}
