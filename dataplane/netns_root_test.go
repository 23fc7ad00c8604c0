package dataplane

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/dataplane/bpftest"
	"github.com/portico-edge/portico/dataplane/xdpaux"
	"github.com/portico-edge/portico/test/netlab"
	"github.com/portico-edge/portico/test/testenv"
)

// nsLab is a client, an edge node running xdp_lb and two replicas on one bridge.
type nsLab struct {
	lab                      *netlab.Lab
	client, edge, rep1, rep2 *netlab.Node
	vip                      netip.Addr
	pin                      string
}

func newNSLab(t *testing.T) *nsLab {
	t.Helper()
	bpftest.Require(t)
	lab, err := netlab.New("pt")
	if err != nil {
		t.Fatalf("create lab: %v", err)
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Errorf("clean up lab: %v", err)
		}
	})
	l := &nsLab{lab: lab, vip: netip.MustParseAddr("10.213.0.100"), pin: "/sys/fs/bpf/" + lab.Prefix}
	add := func(name, addr, mac string) *netlab.Node {
		n, err := lab.AddNode(name, netip.MustParsePrefix(addr), mustMAC(mac))
		if err != nil {
			t.Fatalf("add node %s: %v", name, err)
		}
		return n
	}
	l.client = add("cl", "10.213.0.2/24", "02:00:0a:d5:00:02")
	l.edge = add("ed", "10.213.0.10/24", "02:00:0a:d5:00:0a")
	l.rep1 = add("r1", "10.213.0.11/24", "02:00:0a:d5:00:0b")
	l.rep2 = add("r2", "10.213.0.12/24", "02:00:0a:d5:00:0c")
	// The edge node owns the VIP (it answers ARP for it); replicas hold it on lo
	// and stay quiet about it (direct server return).
	must(t, netlab.IP("-n", l.edge.NS, "addr", "add", l.vip.String()+"/32", "dev", "eth0"))
	for _, r := range []*netlab.Node{l.rep1, l.rep2} {
		must(t, netlab.IP("-n", r.NS, "addr", "add", l.vip.String()+"/32", "dev", "lo"))
		must(t, netlab.Sysctl(r.NS, "net.ipv4.conf.all.arp_ignore", "1"))
		must(t, netlab.Sysctl(r.NS, "net.ipv4.conf.all.arp_announce", "2"))
	}
	// XDP_TX out of the edge's veth is delivered only if the bridge-side peer runs
	// an XDP program.
	must(t, netlab.Do(lab.Switch, func() error {
		c, err := xdpaux.AttachPass(l.edge.Port)
		if err == nil {
			lab.OnClose(c.Close)
		}
		return err
	}))
	t.Cleanup(func() {
		if err := Uninstall(l.pin); err != nil {
			t.Errorf("uninstall: %v", err)
		}
	})
	return l
}

// linkProgram returns the id of the program the XDP link runs.
func linkProgram(t *testing.T, d *Dataplane) ebpf.ProgramID {
	t.Helper()
	info, err := d.link.Info()
	must(t, err)
	return info.Program
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// startEdge loads xdp_lb with the lab's pins, attaches it to the edge's eth0 and
// applies one UDP VIP over both replicas.
func (l *nsLab) startEdge(t *testing.T) *Dataplane {
	t.Helper()
	d, err := Load(Options{PinPath: l.pin, RingSize: testRing, FlowEntries: 4096})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if err := netlab.Do(l.edge.NS, func() error { return d.Attach("eth0") }); err != nil {
		d.Close()
		t.Fatalf("attach: %v", err)
	}
	if _, err := d.Apply(l.udpVIP(l.rep1, l.rep2)); err != nil {
		d.Close()
		t.Fatalf("apply: %v", err)
	}
	return d
}

// udpVIP is the lab's UDP VIP over replicas.
func (l *nsLab) udpVIP(replicas ...*netlab.Node) Desired {
	var bs []Backend
	for _, r := range replicas {
		bs = append(bs, Backend{Addr: r.Addr.Addr(), MAC: r.MAC})
	}
	return Desired{Seed: testSeed, Groups: []Group{{Name: "lab/web", VIPs: []netip.Addr{l.vip},
		Ports: []model.Port{{Protocol: model.UDP, Port: 9000}}, Backends: bs}}}
}

// udpSink counts datagrams per replica and per (sender port, sequence number).
type udpSink struct {
	mu   sync.Mutex
	got  map[string]int
	seqs map[uint64]bool
}

func (l *nsLab) listen(t *testing.T, s *udpSink, r *netlab.Node) {
	t.Helper()
	l.listenUDP(t, r, func(p []byte, from *net.UDPAddr) {
		s.mu.Lock()
		s.got[r.Name]++
		s.seqs[uint64(from.Port)<<32|uint64(binary.BigEndian.Uint32(p[4:8]))] = true
		s.mu.Unlock()
	})
}

// listenUDP gives got every datagram of 8 bytes or more that replica r
// receives on the lab's port.
func (l *nsLab) listenUDP(t *testing.T, r *netlab.Node, got func(p []byte, from *net.UDPAddr)) {
	t.Helper()
	var conn *net.UDPConn
	must(t, netlab.Do(r.NS, func() (err error) {
		conn, err = net.ListenUDP("udp4", &net.UDPAddr{Port: 9000})
		return err
	}))
	// A receiver starved by a loaded machine must not drop what xdp_lb
	// delivered: 16 MiB holds the whole stream.
	raw, err := conn.SyscallConn()
	must(t, err)
	var serr error
	must(t, raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20)
	}))
	must(t, serr)
	t.Cleanup(func() { conn.Close() })
	netlab.ReadPackets(conn, 64, func(p []byte, from net.Addr) {
		if len(p) >= 8 {
			got(p, from.(*net.UDPAddr))
		}
	})
}

func (s *udpSink) total() (int, map[string]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	per := map[string]int{}
	for k, v := range s.got {
		per[k] = v
	}
	return len(s.seqs), per
}

// clientConns opens n UDP sockets in the client namespace, connected to the VIP.
func (l *nsLab) clientConns(t *testing.T, n int) []*net.UDPConn {
	t.Helper()
	conns := make([]*net.UDPConn, n)
	must(t, netlab.Do(l.client.NS, func() error {
		for i := range conns {
			c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: l.vip.AsSlice(), Port: 9000})
			if err != nil {
				return err
			}
			conns[i] = c
		}
		return nil
	}))
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	return conns
}

func send(c *net.UDPConn, seq uint32) error {
	var b [8]byte
	copy(b[:4], "ptco")
	binary.BigEndian.PutUint32(b[4:], seq)
	_, err := c.Write(b[:])
	return err
}

// TestNamespaceForwarding: real frames from a client namespace reach the VIP's
// replicas in other namespaces through xdp_lb's MAC rewrite, spread over both,
// each flow on one replica.
func TestNamespaceForwarding(t *testing.T) {
	l := newNSLab(t)
	d := l.startEdge(t)
	defer d.Close()
	sink := &udpSink{got: map[string]int{}, seqs: map[uint64]bool{}}
	l.listen(t, sink, l.rep1)
	l.listen(t, sink, l.rep2)

	const flows, perFlow = 32, 20
	conns := l.clientConns(t, flows)
	for seq := range uint32(perFlow) {
		for _, c := range conns {
			must(t, send(c, seq))
		}
	}
	_, err := testenv.Poll(t.Context(), 5*time.Second, 20*time.Millisecond, func() bool { n, _ := sink.total(); return n == flows*perFlow })
	n, per := sink.total()
	if err != nil {
		c, _ := d.Counters()
		t.Fatalf("replicas received %d of %d datagrams (%v); xdp_lb counters: %s", n, flows*perFlow, per, c.reasonSummary())
	}
	if per["r1"] == 0 || per["r2"] == 0 {
		t.Fatalf("traffic not spread over both replicas: %v", per)
	}
	if per["r1"]%perFlow != 0 || per["r2"]%perFlow != 0 {
		t.Fatalf("a flow was split between replicas: %v", per)
	}
	c, err := d.Counters()
	must(t, err)
	if got := c.Reasons[lbReasonREASON_TX]; got < flows*perFlow {
		t.Fatalf("xdp_lb transmitted %d frames, want >= %d", got, flows*perFlow)
	}
	t.Logf("datagrams per replica: %v", per)
}

// TestNamespaceRestartLosesNothing restarts the loader in the middle of a bounded
// UDP stream: the pinned link and maps keep forwarding, so nothing is lost.
func TestNamespaceRestartLosesNothing(t *testing.T) {
	l := newNSLab(t)
	d := l.startEdge(t)
	sink := &udpSink{got: map[string]int{}, seqs: map[uint64]bool{}}
	l.listen(t, sink, l.rep1)
	l.listen(t, sink, l.rep2)
	conns := l.clientConns(t, 4)

	const total = 3000 // per flow, paced by a short sleep: a few seconds
	oldProg := linkProgram(t, d)
	restarted := make(chan error, 1)
	go func() {
		time.Sleep(200 * time.Millisecond)
		if err := d.Close(); err != nil {
			restarted <- fmt.Errorf("close: %w", err)
			return
		}
		d = l.startEdge(t)
		restarted <- nil
	}()
	start := time.Now()
	for seq := range uint32(total) {
		for _, c := range conns {
			must(t, send(c, seq))
		}
		time.Sleep(250 * time.Microsecond)
		if time.Since(start) > 10*time.Second {
			t.Fatal("stream took more than 10 s")
		}
	}
	must(t, <-restarted)
	if newProg := linkProgram(t, d); newProg == oldProg {
		t.Fatalf("the pinned link still runs program %d: the restart did not replace it", oldProg)
	}
	want := total * len(conns)
	_, err := testenv.Poll(t.Context(), 5*time.Second, 20*time.Millisecond, func() bool { n, _ := sink.total(); return n == want })
	n, per := sink.total()
	if err != nil {
		t.Fatalf("lost %d of %d datagrams across the restart (%v)", want-n, want, per)
	}
	t.Logf("%d datagrams over %v across a loader restart, none lost (%v)", want, time.Since(start).Round(time.Millisecond), per)

	// A clean uninstall leaves nothing: no XDP program on the interface, no pins.
	must(t, d.Close())
	must(t, Uninstall(l.pin))
	out, err := netlab.Exec(l.edge.NS, "ip", "link", "show", "dev", "eth0")
	must(t, err)
	if strings.Contains(out, "xdp") {
		t.Errorf("eth0 still has an XDP program after uninstall:\n%s", out)
	}
	if _, err := os.Stat(l.pin); !os.IsNotExist(err) {
		t.Errorf("pin directory %s left after uninstall: %v", l.pin, err)
	}
}
