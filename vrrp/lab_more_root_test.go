package vrrp

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"

	"github.com/portico-edge/portico/test/testenv"
)

func TestLabIPv6Failover(t *testing.T) {
	l := newLab(t, 2)
	l.vip = netip.MustParseAddr("fd00:99::100")
	master := l.startPortico(l.nodes[0], labInstance(200, 100*time.Millisecond))
	l.startPortico(l.nodes[1], labInstance(100, 100*time.Millisecond))
	l.electAndHold(l.nodes[0], 5*time.Second, 300*time.Millisecond)
	if err := l.ping(); err != nil { // resolves the VIP's neighbour entry
		t.Fatal(err)
	}
	l.clientReachesVia(l.nodes[0], 0)
	master.signal(syscall.SIGKILL)
	if took, err := testenv.Poll(context.Background(), 5*time.Second, 2*time.Millisecond, func() bool { return l.hasVIP(l.nodes[1]) }); err != nil {
		t.Fatalf("n1 did not take over within %v", took)
	}
	// The unsolicited neighbour advertisement overrides the client's entry.
	l.clientReachesVia(l.nodes[1], 3*time.Second)
}

func TestLabUnicastPeersRejectStrays(t *testing.T) {
	l := newLab(t, 3)
	n0, n1, stray := l.nodes[0], l.nodes[1], l.nodes[2]
	ic0 := labInstance(150, 100*time.Millisecond)
	ic0.Peers = []netip.Addr{n1.addr}
	ic1 := labInstance(100, 100*time.Millisecond)
	ic1.Peers = []netip.Addr{n0.addr}
	p0 := l.startPortico(n0, ic0)
	l.startPortico(n1, ic1)
	// If unicast adverts did not arrive, n1 would become Master too.
	l.electAndHold(n0, 5*time.Second, 500*time.Millisecond)

	// A stray host with a higher priority sends unicast adverts to both.
	icS := labInstance(250, 100*time.Millisecond)
	icS.Peers = []netip.Addr{n0.addr, n1.addr}
	l.startPortico(stray, icS)
	if _, err := testenv.Poll(context.Background(), 5*time.Second, 2*time.Millisecond, func() bool { return l.hasVIP(stray) }); err != nil {
		t.Fatal("the stray never came up as Master")
	}
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if o := l.owners(n0, n1); len(o) != 1 || o[0] != "n0" {
			t.Fatalf("owners among the peers = %s with a stray on the segment, want [n0]", fmtOwners(o))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if b, _ := os.ReadFile(p0.log); !bytes.Contains(b, []byte(`"reason":"peer"`)) {
		t.Errorf("n0 logged no advert rejected for reason peer:\n%s", b)
	}
	// Failover between the peers still works.
	p0.signal(syscall.SIGKILL)
	if took, err := testenv.Poll(context.Background(), 5*time.Second, 2*time.Millisecond, func() bool { return l.hasVIP(n1) }); err != nil {
		t.Fatalf("n1 did not take over within %v", took)
	}
}

func TestLabConflictReannounce(t *testing.T) {
	l := newLab(t, 1)
	ic := labInstance(100, 100*time.Millisecond)
	ic.GARPRefresh = Duration{time.Minute} // so any announcement seen below is the answer
	p := l.startPortico(l.nodes[0], ic)
	l.electAndHold(l.nodes[0], 5*time.Second, 500*time.Millisecond) // burst over

	var c *arp.Client
	if err := inNS(l.client.ns, func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		c, err = arp.Dial(ifi)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	foreign := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x99}
	claim, err := arp.NewPacket(arp.OperationReply, foreign, l.vip, ethernet.Broadcast, l.vip)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WriteTo(claim, ethernet.Broadcast); err != nil {
		t.Fatal(err)
	}
	// The Master answers with a fresh announcement of its own MAC, in both
	// forms: a gratuitous request and an unsolicited reply.
	deadline := time.Now().Add(2 * time.Second)
	seen := map[arp.Operation]bool{}
	for len(seen) < 2 && time.Now().Before(deadline) {
		c.SetReadDeadline(deadline)
		pkt, _, err := c.Read()
		if err != nil {
			break
		}
		if pkt.SenderIP == l.vip && pkt.TargetIP == l.vip && bytes.Equal(pkt.SenderHardwareAddr, l.nodes[0].mac) {
			seen[pkt.Operation] = true
		}
	}
	if !seen[arp.OperationRequest] || !seen[arp.OperationReply] {
		t.Errorf("re-announcement after a foreign claim: request seen %v, reply seen %v; want both",
			seen[arp.OperationRequest], seen[arp.OperationReply])
	}
	if _, err := testenv.Poll(context.Background(), 2*time.Second, 2*time.Millisecond, func() bool {
		b, _ := os.ReadFile(p.log)
		return strings.Contains(string(b), "vip claimed by another station")
	}); err != nil {
		t.Error("the conflict was not logged")
	}
	if !l.hasVIP(l.nodes[0]) {
		t.Error("the Master gave up the VIP to a bare ARP claim")
	}
}

func TestLabPriorityTracking(t *testing.T) {
	l := newLab(t, 2)
	p0 := l.startPortico(l.nodes[0], labInstance(200, 100*time.Millisecond))
	l.startPortico(l.nodes[1], labInstance(100, 100*time.Millisecond))
	l.electAndHold(l.nodes[0], 5*time.Second, 200*time.Millisecond)
	p0.signal(syscall.SIGUSR1) // unhealthy: priority 1
	l.electAndHold(l.nodes[1], 5*time.Second, 200*time.Millisecond)
	p0.signal(syscall.SIGUSR2) // healthy again: priority 200 preempts
	l.electAndHold(l.nodes[0], 5*time.Second, 200*time.Millisecond)
}

// TestLabManyInstances runs two VIP groups, each with its own VRID, on the same
// two nodes; each node is Master of one, and the survivor takes both.
func TestLabManyInstances(t *testing.T) {
	l := newLab(t, 2)
	vipA, vipB := netip.MustParseAddr("10.99.0.100"), netip.MustParseAddr("10.99.0.101")
	group := func(name string, vrid, prio uint8, vip netip.Addr) InstanceConfig {
		return InstanceConfig{Name: name, VRID: vrid, Priority: prio, AdvertInterval: Duration{100 * time.Millisecond}, VIPs: []netip.Addr{vip}}
	}
	p0 := l.startPortico(l.nodes[0], group("a", 42, 200, vipA), group("b", 43, 100, vipB))
	l.startPortico(l.nodes[1], group("a", 42, 100, vipA), group("b", 43, 200, vipB))
	want := func(n0a, n0b, n1a, n1b bool) func() bool {
		return func() bool {
			return l.hasAddr(l.nodes[0], vipA) == n0a && l.hasAddr(l.nodes[0], vipB) == n0b &&
				l.hasAddr(l.nodes[1], vipA) == n1a && l.hasAddr(l.nodes[1], vipB) == n1b
		}
	}
	if _, err := testenv.Poll(context.Background(), 5*time.Second, 2*time.Millisecond, want(true, false, false, true)); err != nil {
		t.Fatalf("n0 has a=%v b=%v, n1 has a=%v b=%v; want a on n0 only, b on n1 only",
			l.hasAddr(l.nodes[0], vipA), l.hasAddr(l.nodes[0], vipB), l.hasAddr(l.nodes[1], vipA), l.hasAddr(l.nodes[1], vipB))
	}
	p0.signal(syscall.SIGTERM)
	if _, err := testenv.Poll(context.Background(), 5*time.Second, 2*time.Millisecond, want(false, false, true, true)); err != nil {
		t.Fatalf("after n0 stopped: n0 has a=%v b=%v, n1 has a=%v b=%v; want both on n1 only",
			l.hasAddr(l.nodes[0], vipA), l.hasAddr(l.nodes[0], vipB), l.hasAddr(l.nodes[1], vipA), l.hasAddr(l.nodes[1], vipB))
	}
}

// TestLabStartupAddresses: a stale /32 VIP left by an earlier run is removed at
// start-up, and the node's own address is never taken for a VIP.
func TestLabStartupAddresses(t *testing.T) {
	l := newLab(t, 2)
	l.ip("-n", l.nodes[1].ns, "addr", "add", l.vip.String()+"/32", "dev", "eth0")
	l.startPortico(l.nodes[0], labInstance(200, 100*time.Millisecond))
	l.startPortico(l.nodes[1], labInstance(100, 100*time.Millisecond))
	l.electAndHold(l.nodes[0], 5*time.Second, 300*time.Millisecond)

	client := labInstance(100, 100*time.Millisecond)
	client.VIPs = []netip.Addr{l.client.addr}
	p := l.startPortico(l.client, client)
	if !p.wait(10 * time.Second) {
		t.Fatal("an announcer given the node's own address as VIP kept running")
	}
	if code := p.cmd.ProcessState.ExitCode(); code == 0 {
		t.Errorf("exit code = 0, want a failure")
	}
	if !l.hasAddr(l.client, l.client.addr) {
		t.Error("the node's own address was removed")
	}
	if b, _ := os.ReadFile(p.log); !bytes.Contains(b, []byte("node's own address")) {
		t.Errorf("no clear error in the log:\n%s", b)
	}
}

func TestLabConflictReannounceIPv6(t *testing.T) {
	l := newLab(t, 1)
	l.vip = netip.MustParseAddr("fd00:99::100")
	ic := labInstance(100, 100*time.Millisecond)
	ic.GARPRefresh = Duration{time.Minute} // so any advertisement seen below is the answer
	p := l.startPortico(l.nodes[0], ic)
	l.electAndHold(l.nodes[0], 5*time.Second, 500*time.Millisecond) // burst over

	var c *ndp.Conn
	if err := inNS(l.client.ns, func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		c, _, err = ndp.Listen(ifi, ndp.LinkLocal)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	foreign := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x99}
	claim := &ndp.NeighborAdvertisement{Override: true, TargetAddress: l.vip,
		Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: foreign}}}
	// Inside the namespace: the destination's zone names the client's eth0.
	if err := inNS(l.client.ns, func() error { return c.WriteTo(claim, nil, netip.MustParseAddr("ff02::1")) }); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	seen := false
	for !seen && time.Now().Before(deadline) {
		c.SetReadDeadline(deadline)
		m, _, _, err := c.ReadFrom()
		if err != nil {
			break
		}
		na, ok := m.(*ndp.NeighborAdvertisement)
		if !ok || na.TargetAddress != l.vip || !na.Override {
			continue
		}
		for _, o := range na.Options {
			if ll, ok := o.(*ndp.LinkLayerAddress); ok && ll.Direction == ndp.Target && bytes.Equal(ll.Addr, l.nodes[0].mac) {
				seen = true
			}
		}
	}
	if !seen {
		t.Error("no unsolicited neighbour advertisement from the Master after a foreign claim")
	}
	if _, err := testenv.Poll(context.Background(), 2*time.Second, 2*time.Millisecond, func() bool {
		b, _ := os.ReadFile(p.log)
		return strings.Contains(string(b), "vip claimed by another station")
	}); err != nil {
		t.Error("the conflict was not logged")
	}
}
