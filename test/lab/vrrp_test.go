package lab

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"golang.org/x/net/ipv4"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/test/netlab"
	"github.com/portico-edge/portico/test/traffic"
	"github.com/portico-edge/portico/vrrp"
)

// TestForgedVRRPAdvert: a host on the edges' segment that is no edge sends adverts for the
// group's virtual router with priority 255 (an address owner's) and the longest
// interval VRRP v3 allows, 40.95 s, to the VRRP group and to every edge. With
// multicast VRRP the owner steps down for it and every edge waits 3 × 40.95 s
// for the stranger's next advert: the VIP has no owner for two minutes. The
// edges send adverts to each other alone and accept none from elsewhere: the
// owner keeps the VIP throughout, the adverts are counted as rejected
// (reason "peer"), and held and new connections are all served.
func TestForgedVRRPAdvert(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	owner := vipOwner(t, l)
	svc, err := l.Kube.CoreV1().Services(GroupNamespace).Get(ctx, GroupName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vrid, err := strconv.ParseUint(svc.Annotations["portico.io/vrid"], 10, 8)
	if err != nil {
		t.Fatalf("the group's VRID: %v", err)
	}
	held, err := l.OpenKeepConns(ctx, "echo.lab", 30)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	rejectedBefore := l.peerRejections(t)
	stream := l.StartStream(ctx, "echo.lab", traffic.StreamOptions{Every: 20 * time.Millisecond, Max: 300, For: 10 * time.Second})
	defer stream.Stop()

	// The forged adverts: ten in one second, then the owner is watched for two
	// more (a Backup that heard priority 255 stays silent, and the owner that
	// heard it gives the VIP up within an advert interval).
	attack := time.Now()
	var edges []netip.Addr
	for _, e := range l.Edges {
		edges = append(edges, e.Addr.Addr())
	}
	sent := make(chan error, 1)
	go func() {
		sent <- forgeAdverts(l.Client.NS, l.Client.Addr.Addr(), uint8(vrid), edges, 10, 100*time.Millisecond)
	}()
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if o, err := l.Owner(); err != nil || o != owner {
			t.Fatalf("%v after the first forged advert: %v (owner %v, was %s)", time.Since(attack).Round(time.Millisecond), err, nameOf(o), owner.Name)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := <-sent; err != nil {
		t.Fatalf("send forged adverts: %v", err)
	}
	// Each edge got ten by unicast and ten by multicast; those it read count.
	if got := l.peerRejections(t) - rejectedBefore; got < 10*float64(len(l.Edges)) {
		t.Errorf("%v adverts rejected for their source across the edges, want at least %d", got, 10*len(l.Edges))
	}
	f := traffic.FailuresAround(stream.Stop(), attack)
	t.Logf("owner %s kept the VIP through 10 forged adverts; new connections: %v", owner.Name, f)
	if f.Failed > 0 || f.Total < 50 {
		t.Errorf("new connections during the attack: %v", f)
	}
	kept := 0
	for _, k := range held {
		if _, err := k.Do("echo.lab", "/after", 2*time.Second); err == nil {
			kept++
		} else {
			t.Logf("held connection to %s from port %d: %v", k.Edge, k.LocalPort(), err)
		}
	}
	if kept != len(held) {
		t.Errorf("%d of %d held connections answered after the attack", kept, len(held))
	}
}

// peerRejections sums every edge's adverts rejected for their source.
func (l *Lab) peerRejections(t *testing.T) float64 {
	t.Helper()
	var sum float64
	for i := range l.Edges {
		v, err := l.MetricSum(i, "portico_vrrp_adverts_rejected_total", `reason="peer"`)
		if err != nil {
			t.Fatal(err)
		}
		sum += v
	}
	return sum
}

func nameOf(n *Node) string {
	if n == nil {
		return "none"
	}
	return n.Name
}

// forgeAdverts sends n VRRP v3 adverts for vrid from src in namespace ns, every
// gap, each to the VRRP group and to every one of to: priority 255 for the
// lab's VIP, interval 40.95 s, with a valid checksum and TTL 255, as a stranger
// on the segment would.
func forgeAdverts(ns string, src netip.Addr, vrid uint8, to []netip.Addr, n int, gap time.Duration) error {
	return netlab.Do(ns, func() error {
		c, err := net.ListenPacket("ip4:112", src.String())
		if err != nil {
			return err
		}
		defer c.Close()
		p := ipv4.NewPacketConn(c)
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		if err := p.SetMulticastInterface(ifi); err != nil {
			return err
		}
		if err := p.SetMulticastTTL(255); err != nil {
			return err
		}
		if err := p.SetTTL(255); err != nil {
			return err
		}
		adv := vrrp.Advert{Version: 3, VRID: vrid, Priority: 255, Interval: 4095 * 10 * time.Millisecond, Addrs: []netip.Addr{VIP}}
		for i := 0; i < n; i++ {
			for _, dst := range append([]netip.Addr{vrrp.GroupIPv4}, to...) {
				b, err := vrrp.Encode(adv, src, dst)
				if err != nil {
					return err
				}
				if _, err := c.WriteTo(b, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
					return fmt.Errorf("to %v: %w", dst, err)
				}
			}
			time.Sleep(gap)
		}
		return nil
	})
}
