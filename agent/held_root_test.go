package agent

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf/rlimit"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/liveness"
	"github.com/portico-edge/portico/test/netlab"
	"github.com/portico-edge/portico/test/testenv"
)

// heldNode is one node of TestHeldReports: its maps, its sink, its reports
// and the server of its /held.
type heldNode struct {
	node *netlab.Node
	dp   *dataplane.Dataplane
	sink *l4Sink
	held *heldReports
	srv  *http.Server
}

// TestHeldReports: a connection node a's stack holds, in a slot the ring
// gives to b, is listed by a (sock_diag, a real socket), served on a's /held,
// fetched by b over the link and pinned to a on both nodes' maps. While a does
// not answer, b keeps the pin; once the connection ends, a stops listing it
// and b removes the pin.
func TestHeldReports(t *testing.T) {
	a, b := twoNodes(t, "ph")
	if err := rlimit.RemoveMemlock(); err != nil {
		t.Fatal(err)
	}
	vip := netip.MustParseAddr("192.0.2.10")
	snap := model.Snapshot{Groups: []model.Group{{Name: "edge/web", VIPs: []netip.Addr{vip},
		Ports:    []model.Port{{Protocol: model.TCP, Port: 80}},
		Replicas: []model.Replica{{Addr: a.Addr.Addr()}, {Addr: b.Addr.Addr()}}}}}
	const port = 19101
	nodes := map[string]*heldNode{}
	for _, n := range []*netlab.Node{a, b} {
		hn := &heldNode{node: n}
		pin := fmt.Sprintf("/sys/fs/bpf/portico-held-test-%d-%s", os.Getpid(), n.Name)
		err := netlab.Do(n.NS, func() error {
			ifc, err := net.InterfaceByName("eth0")
			if err != nil {
				return err
			}
			if hn.dp, err = dataplane.Load(dataplane.Options{PinPath: pin, RingSize: 13}); err != nil {
				return err
			}
			t.Cleanup(func() { hn.dp.Close(); dataplane.Uninstall(pin) })
			hn.sink = &l4Sink{dp: hn.dp, group: "edge/web", seed: 1, log: zap.NewNop(),
				neigh: &neighbors{ifc: ifc, log: zap.NewNop(), resolved: map[netip.Addr]net.HardwareAddr{}}}
			return hn.sink.Apply(context.Background(), snap)
		})
		if err != nil {
			t.Fatalf("%s: %v", n.Name, err)
		}
		ns := n.NS
		h := &heldReports{sink: hn.sink, port: port, interval: time.Second, budget: 1000, log: zap.NewNop(), met: newHeldMetrics(), list: ownConnections}
		h.client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
			DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
				err = netlab.Do(ns, func() error {
					c, err = h.dial(ctx, network, addr)
					return err
				})
				return c, err
			}}}
		hn.held = h
		nodes[n.Name] = hn
		hn.serve(t)
	}
	ha, hb := nodes[a.Name], nodes[b.Name]
	round := func(hn *heldNode) {
		t.Helper()
		if err := netlab.Do(hn.node.NS, func() error { hn.held.round(context.Background()); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	pinned := func(hn *heldNode, f dataplane.Flow) netip.Addr {
		t.Helper()
		tr, err := hn.dp.Trace(f)
		if err != nil {
			t.Fatal(err)
		}
		if tr.Pinned == nil || tr.Pinned.Hop != 0 {
			return netip.Addr{}
		}
		return tr.Pinned.Backend.Addr
	}

	// A client port whose slot the ring gives to b, connected to a's stack.
	var flow dataplane.Flow
	for p := uint16(40000); p < 40100 && !flow.Src.IsValid(); p++ {
		f := dataplane.Flow{Src: a.Addr.Addr(), Dst: vip, SPort: p, DPort: 80, Protocol: 6}
		if off := ha.dp.OffRing(a.Addr.Addr(), []dataplane.Flow{f}, false); len(off) == 1 {
			flow = f
		}
	}
	if !flow.Src.IsValid() {
		t.Fatal("no client port in 100 whose slot is b's")
	}
	err := netlab.Do(a.NS, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(lo, &netlink.Addr{IPNet: netlink.NewIPNet(vip.AsSlice())})
	})
	if err != nil {
		t.Fatal(err)
	}
	connect := func(f dataplane.Flow) (client, server net.Conn) {
		t.Helper()
		err := netlab.Do(a.NS, func() error {
			ln, err := net.Listen("tcp", netip.AddrPortFrom(vip, 80).String())
			if err != nil {
				return err
			}
			defer ln.Close()
			d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(f.Src, f.SPort))}
			if client, err = d.Dial("tcp", ln.Addr().String()); err != nil {
				return err
			}
			server, err = ln.Accept()
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return client, server
	}
	client, server := connect(flow)
	defer client.Close()

	round(ha)
	if got := pinned(ha, flow); got != a.Addr.Addr() {
		t.Errorf("a's own held connection pinned to %v on a, want a", got)
	}
	round(hb)
	if got := pinned(hb, flow); got != a.Addr.Addr() {
		t.Fatalf("a's held connection pinned to %v on b after b fetched a's list, want a", got)
	}
	if got := testutil.ToFloat64(hb.held.met.conns.WithLabelValues("peers")); got != 1 {
		t.Errorf("b's portico_held_connections{holder=peers} = %v, want 1", got)
	}

	// A connection on a's own ring is not listed, until a hears an edge
	// whose verdicts differ from its own: then every one is, and b pins it.
	var onRing dataplane.Flow
	for p := uint16(41000); p < 41100 && !onRing.Src.IsValid(); p++ {
		f := dataplane.Flow{Src: a.Addr.Addr(), Dst: vip, SPort: p, DPort: 80, Protocol: 6}
		if off := ha.dp.OffRing(a.Addr.Addr(), []dataplane.Flow{f}, false); len(off) == 0 {
			onRing = f
		}
	}
	c2, s2 := connect(onRing)
	defer c2.Close()
	defer s2.Close()
	round(ha)
	if n := ha.held.listed(); n != 1 {
		t.Errorf("a lists %d connections, want the 1 off its ring", n)
	}
	differ := &differChecker{}
	ha.sink.live = differ
	differ.on.Store(true)
	round(ha)
	round(hb)
	if n := ha.held.listed(); n != 2 {
		t.Errorf("while verdicts differ a lists %d connections, want both", n)
	}
	if got := pinned(hb, onRing); got != a.Addr.Addr() {
		t.Errorf("while verdicts differ, a's connection on its own ring is pinned to %v on b, want a", got)
	}
	if got := testutil.ToFloat64(ha.held.met.all); got < 1 {
		t.Errorf("portico_held_all_listed_total = %v while verdicts differ", got)
	}
	differ.on.Store(false)
	round(ha)
	round(hb)
	if got := pinned(hb, onRing); got.IsValid() {
		t.Errorf("verdicts agree again, but b still pins a's connection on a's ring to %v", got)
	}

	// a does not answer: b keeps what a listed last.
	ha.srv.Close()
	round(hb)
	if got := pinned(hb, flow); got != a.Addr.Addr() {
		t.Errorf("while a did not answer, b's pin became %v, want a's", got)
	}
	if got := testutil.ToFloat64(hb.held.met.errors.WithLabelValues("fetch")); got < 1 {
		t.Errorf("portico_held_errors_total{reason=fetch} = %v while a did not answer", got)
	}
	ha.serve(t)

	// The connection ends: a stops listing it, b unpins it.
	client.Close()
	server.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		round(ha)
		if ha.held.listed() == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := ha.held.listed(); n != 0 {
		t.Fatalf("a still lists %d connections after the connection ended", n)
	}
	round(hb)
	if got := pinned(hb, flow); got.IsValid() {
		t.Errorf("after a stopped listing it, b still pins the connection to %v", got)
	}
	if got := pinned(ha, flow); got.IsValid() {
		t.Errorf("after the connection ended, a still pins it to %v", got)
	}
}

// differChecker is a liveness checker that calls nobody down, and says the
// edges' verdicts differ while on is set.
type differChecker struct{ on atomic.Bool }

func (*differChecker) SetTargets([]netip.Addr, func(netip.Addr) bool) {}
func (*differChecker) Dead() []netip.Addr                             { return nil }
func (*differChecker) Changed() <-chan struct{}                       { return nil }
func (*differChecker) View() []liveness.Replica                       { return nil }
func (d *differChecker) Differ() bool                                 { return d.on.Load() }

// serve starts hn's /held server on its address, in its namespace.
func (hn *heldNode) serve(t *testing.T) {
	t.Helper()
	var ln net.Listener
	err := netlab.Do(hn.node.NS, func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(hn.node.Addr.Addr(), hn.held.port).String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc(heldPath, hn.held.serveHTTP)
	hn.srv = &http.Server{Handler: mux, ReadHeaderTimeout: time.Second}
	go hn.srv.Serve(ln)
	t.Cleanup(func() { hn.srv.Close() })
}

// BenchmarkOwnConnections: what an agent's list of its stack's connections
// (sock_diag, every heldEvery) costs with n connections on the node (2n sockets:
// both ends are in the benchmark's namespace).
func BenchmarkOwnConnections(b *testing.B) {
	testenv.RequireRoot(b, "network namespaces")
	lab, err := netlab.New("pb")
	if err != nil {
		b.Fatal(err)
	}
	defer lab.Close()
	mac, _ := net.ParseMAC("02:00:0a:d9:00:01")
	node, err := lab.AddNode("a", netip.MustParsePrefix("10.217.0.1/24"), mac)
	if err != nil {
		b.Fatal(err)
	}
	var ln net.Listener
	if err := netlab.Do(node.NS, func() (err error) { ln, err = net.Listen("tcp", "10.217.0.1:80"); return err }); err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for _, n := range []int{1000, 4000} {
		err := netlab.Do(node.NS, func() error {
			for len(conns) < 2*n {
				c, err := net.Dial("tcp", "10.217.0.1:80")
				if err != nil {
					return err
				}
				s, err := ln.Accept()
				if err != nil {
					return err
				}
				conns = append(conns, c, s)
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("connections=%d", n), func(b *testing.B) {
			for b.Loop() {
				var got []dataplane.Flow
				if err := netlab.Do(node.NS, func() (err error) { got, err = ownConnections(); return err }); err != nil {
					b.Fatal(err)
				}
				if len(got) < 2*n {
					b.Fatalf("listed %d connections, want >= %d", len(got), 2*n)
				}
			}
		})
	}
}
