package lab

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/test/netlab"
	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

// VIP6 is the lab group's IPv6 VIP in TestIPv6EndToEnd.
var VIP6 = netip.MustParseAddr("2001:db8::80")

// addIPv6 gives the client and the edges an address on fd00:216::/64 (no DAD:
// the lab knows them unique), the client an on-link route to VIP6, and the group
// VIP6 beside its IPv4 VIP.
func (l *Lab) addIPv6(ctx context.Context) error {
	nodes := append([]*Node{l.Client}, l.Edges...)
	for _, n := range nodes {
		host := n.Addr.Addr().As4()[3]
		a := netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, 0x02, 0x16, 15: host}), 64)
		if err := netlab.IP("-n", n.NS, "addr", "add", a.String(), "dev", "eth0", "nodad"); err != nil {
			return err
		}
	}
	if err := netlab.IP("-n", l.Client.NS, "-6", "route", "add", VIP6.String()+"/128", "dev", "eth0"); err != nil {
		return err
	}
	svc, err := l.Kube.CoreV1().Services(GroupNamespace).Get(ctx, GroupName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	svc.Annotations["portico.io/vip"] = VIP.String() + "," + VIP6.String()
	_, err = l.Kube.CoreV1().Services(GroupNamespace).Update(ctx, svc, metav1.UpdateOptions{})
	return err
}

// TestIPv6EndToEnd: the group gets an IPv6 VIP beside its IPv4 one. An IPv6
// client's requests, each on a new connection, reach every replica through
// the VIP (the owner answers neighbour solicitations for it, every edge's XDP
// steers it, every replica's nginx serves it), with the client's address
// intact, and the Ingress's status lists both addresses. Then the owner dies
// with IPv6 connections held and a stream of new ones running: the backup takes
// over, and the connections on the surviving replicas keep working.
func TestIPv6EndToEnd(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	if err := l.addIPv6(ctx); err != nil {
		t.Fatal(err)
	}
	v6 := traffic.Target{NS: l.Client.NS, VIP: VIP6}
	client := netip.AddrFrom16([16]byte{0xfd, 0, 0x02, 0x16, 15: 2}).String()
	c := v6.HTTPClient(false, 2*time.Second)
	if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error {
		for range 30 {
			if _, err := v6.Get(ctx, c, "echo.lab", "/wait"); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("HTTP through %s: %v", VIP6, err)
	}
	replicas := map[string]int{}
	for range 150 {
		r, err := v6.Get(ctx, c, "echo.lab", "/v6")
		if err != nil {
			t.Fatal(err)
		}
		if r.Client != client {
			t.Fatalf("the backend saw client %q, want %s", r.Client, client)
		}
		replicas[r.Edge]++
	}
	t.Logf("150 IPv6 requests through %s: per replica %v, client %s at the backend", VIP6, replicas, client)
	if len(replicas) != len(l.Edges) {
		t.Errorf("IPv6 requests reached replicas %v, want all %d", replicas, len(l.Edges))
	}
	if err := l.waitIngressAddrs(ctx, 10*time.Second, "echo", VIP, VIP6); err != nil {
		t.Fatal(err)
	}

	// The IPv6 virtual router elects its master on its own (by link-local
	// address on a tie), so its owner may not be the IPv4 VIP's.
	owner6 := func(not *Node) (*Node, error) {
		var owners []*Node
		for _, e := range l.Edges {
			if e == not {
				continue
			}
			if ok, err := e.holds(VIP6); err != nil {
				return nil, err
			} else if ok {
				owners = append(owners, e)
			}
		}
		if len(owners) != 1 {
			return nil, fmt.Errorf("%d edges hold %s", len(owners), VIP6)
		}
		return owners[0], nil
	}
	owner, err := owner6(nil)
	if err != nil {
		t.Fatal(err)
	}
	held, err := v6.OpenKeepConns(ctx, "echo.lab", 60)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(held.Close)
	stream := v6.StartStream(ctx, "echo.lab", traffic.StreamOptions{Every: 20 * time.Millisecond, Timeout: 2 * time.Second, For: 30 * time.Second})
	start := time.Now()
	l.killAndCut(t, owner)
	var newOwner *Node
	if _, err := testenv.Poll(ctx, 5*time.Second, 100*time.Millisecond, func() (err error) {
		newOwner, err = owner6(owner)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	takeover := time.Since(start)
	time.Sleep(2 * time.Second)
	attempts := stream.Stop()
	kept, OnSurvivors := 0, 0
	for _, k := range held {
		if k.Edge == owner.Addr.Addr().String() {
			continue
		}
		OnSurvivors++
		if _, err := k.Do("echo.lab", "/after", 3*time.Second); err == nil {
			kept++
		} else {
			t.Logf("held connection via %s: %v", k.Edge, err)
		}
	}
	failed := 0
	for _, a := range attempts {
		if a.Err != nil {
			failed++
		}
	}
	t.Logf("owner %s died; %s took over the IPv6 VIP in %v; %d of %d held connections on surviving replicas kept working; new connections through the failover: %d of %d failed",
		owner.Name, newOwner.Name, takeover.Round(time.Millisecond), kept, OnSurvivors, failed, len(attempts))
	if OnSurvivors == 0 || kept != OnSurvivors {
		t.Errorf("%d of %d held IPv6 connections on surviving replicas kept working, want all", kept, OnSurvivors)
	}
	for i := range 30 {
		if _, err := v6.Get(ctx, c, "echo.lab", "/after-takeover"); err != nil {
			t.Errorf("request %d after the takeover: %v", i, err)
		}
	}
}
