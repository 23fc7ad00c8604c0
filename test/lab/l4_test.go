package lab

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/test/netlab"
	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

const (
	l4TCPPort = 9000 // where the pods' line echo listens
	l4UDPPort = 9053 // where the pods' datagram echo listens
)

// serveL4 starts, in every pod namespace, a TCP line echo on l4TCPPort and a UDP
// echo on l4UDPPort. Each answer is "pod=<name> peer=<address the pod sees>
// client=<address a PROXY protocol header gave, or ->" (the UDP echo's also
// "session=<address:port the pod sees>"). The TCP echo closes a
// connection idle for podLifetime.
func (l *Lab) serveL4(t *testing.T) {
	t.Helper()
	for _, p := range l.Pods {
		var ln net.Listener
		var pc net.PacketConn
		if err := netlab.Do(p.NS, func() (err error) {
			if ln, err = net.Listen("tcp4", fmt.Sprintf(":%d", l4TCPPort)); err != nil {
				return err
			}
			pc, err = net.ListenPacket("udp4", fmt.Sprintf(":%d", l4UDPPort))
			return err
		}); err != nil {
			t.Fatalf("listen in %s: %v", p.NS, err)
		}
		t.Cleanup(func() { ln.Close(); pc.Close() })
		name := p.Name
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					peer, _, _ := net.SplitHostPort(c.RemoteAddr().String())
					client := "-"
					r := bufio.NewReader(c)
					for i := 0; i < 1000; i++ {
						c.SetReadDeadline(time.Now().Add(podLifetime))
						line, err := r.ReadString('\n')
						if err != nil {
							return
						}
						if f := strings.Fields(line); i == 0 && len(f) == 6 && f[0] == "PROXY" {
							client = f[2]
							continue
						}
						fmt.Fprintf(c, "pod=%s peer=%s client=%s\n", name, peer, client)
					}
				}()
			}
		}()
		go func() {
			buf := make([]byte, 512)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				peer, _, _ := net.SplitHostPort(from.String())
				client := "-"
				// A PROXY v2 header (IPv4, DGRAM) names the client.
				if d := buf[:n]; n >= 28 && bytes.Equal(d[:12], []byte("\r\n\r\n\x00\r\nQUIT\n")) && d[13] == 0x12 {
					client = netip.AddrFrom4([4]byte(d[16:20])).String()
				}
				// session: nginx's upstream socket, one per UDP session.
				pc.WriteTo([]byte(fmt.Sprintf("pod=%s peer=%s client=%s session=%s\n", name, peer, client, from)), from)
			}
		}()
	}
}

// l4Service creates a LoadBalancer Service of class portico.io/vip served by
// the lab's group, with one port to the pods' port target, and its EndpointSlice.
func (l *Lab) l4Service(ctx context.Context, name string, vip netip.Addr, proto corev1.Protocol, port, target int32, kv ...string) error {
	class := "portico.io/vip"
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: AppNamespace, Name: name, Annotations: map[string]string{
			"portico.io/group": GroupNamespace + "/" + GroupName, "portico.io/vip": vip.String()}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: &class,
			Ports: []corev1.ServicePort{{Name: "l4", Port: port, Protocol: proto}}},
	}
	for i := 0; i+1 < len(kv); i += 2 {
		svc.Annotations[kv[i]] = kv[i+1]
	}
	if name == "udp-echo" {
		svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	}
	if _, err := l.Kube.CoreV1().Services(AppNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return err
	}
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: AppNamespace, Name: name + "-lab", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("l4"), Port: ptr(target), Protocol: ptr(proto)}},
	}
	for _, p := range l.Pods {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{p.Addr.Addr().String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}})
	}
	if _, err := l.Kube.DiscoveryV1().EndpointSlices(AppNamespace).Create(ctx, es, metav1.CreateOptions{}); err != nil {
		return err
	}
	return netlab.IP("-n", l.Client.NS, "route", "replace", vip.String()+"/32", "dev", "eth0")
}

// tcpLine opens a connection from the client namespace to addr and exchanges one
// line; the connection is returned open.
func (l *Lab) tcpLine(ctx context.Context, addr string) (net.Conn, *bufio.Reader, traffic.Reply, error) {
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := l.Dial(dctx, "tcp", addr)
	if err != nil {
		return nil, nil, traffic.Reply{}, err
	}
	r := bufio.NewReader(c)
	rep, err := lineOn(c, r)
	if err != nil {
		c.Close()
		return nil, nil, rep, err
	}
	return c, r, rep, nil
}

func lineOn(c net.Conn, r *bufio.Reader) (traffic.Reply, error) {
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := fmt.Fprintln(c, "hello"); err != nil {
		return traffic.Reply{}, err
	}
	s, err := r.ReadString('\n')
	if err != nil {
		return traffic.Reply{}, err
	}
	return traffic.ParseL4Reply(s)
}

// udpQuery sends one datagram from a new socket in the client namespace.
func (l *Lab) udpQuery(addr string) (traffic.Reply, error) {
	var c net.Conn
	if err := netlab.Do(l.Client.NS, func() (err error) {
		c, err = net.Dial("udp4", addr)
		return err
	}); err != nil {
		return traffic.Reply{}, err
	}
	defer c.Close()
	buf := make([]byte, 512)
	for try := 0; try < 3; try++ {
		c.SetDeadline(time.Now().Add(time.Second))
		if _, err := c.Write([]byte("query\n")); err != nil {
			return traffic.Reply{}, err
		}
		n, err := c.Read(buf)
		if err == nil {
			return traffic.ParseL4Reply(string(buf[:n]))
		}
	}
	return traffic.Reply{}, fmt.Errorf("no answer from %s", addr)
}

// TestL4Services: a TCP Service and a UDP Service (ClientIP affinity), both with
// the PROXY protocol, LoadBalancer Services of class portico.io/vip, get their
// VIPs in their status and are served through them by every replica's nginx,
// the endpoints learning the client's address (PROXY v1 on TCP, v2 on every
// datagram); then the VIP owner dies with TCP
// connections held: the backup takes over and every connection on a surviving
// replica keeps working, and new TCP connections and UDP queries are answered.
func TestL4Services(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	l.serveL4(t)
	// First a tenant's Service on a port every edge's nginx already listens on
	// (the liveness checks'): it used to fail every edge's reload, and no later
	// change was served. It is refused with an Event, and
	// the two Services below, created after it, are served.
	if err := l.l4Service(ctx, "liveness-thief", netip.MustParseAddr("192.0.2.92"), corev1.ProtocolTCP, 10247, l4TCPPort); err != nil {
		t.Fatal(err)
	}
	// And a tenant's Service that names the client's own address (it used to be
	// put on every edge's lo, and the VRRP owner answered ARP for it): no VIPPool lets its namespace have that address, so it gets none.
	if err := l.l4Service(ctx, "ip-thief", l.Client.Addr.Addr(), corev1.ProtocolTCP, 7001, l4TCPPort); err != nil {
		t.Fatal(err)
	}
	tcpVIP, udpVIP := netip.MustParseAddr("192.0.2.90"), netip.MustParseAddr("192.0.2.91")
	if err := l.l4Service(ctx, "tcp-echo", tcpVIP, corev1.ProtocolTCP, 7000, l4TCPPort, "portico.io/proxy-protocol", "true"); err != nil {
		t.Fatal(err)
	}
	// A short UDP idle timeout: the agents' graceful stop at the end of the test
	// waits for nginx's UDP sessions.
	if err := l.l4Service(ctx, "udp-echo", udpVIP, corev1.ProtocolUDP, 53, l4UDPPort, "portico.io/udp-idle-timeout", "3s", "portico.io/proxy-protocol", "true"); err != nil {
		t.Fatal(err)
	}
	for name, vip := range map[string]netip.Addr{"tcp-echo": tcpVIP, "udp-echo": udpVIP} {
		if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error {
			s, err := l.Kube.CoreV1().Services(AppNamespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if lb := s.Status.LoadBalancer.Ingress; len(lb) != 1 || lb[0].IP != vip.String() {
				return fmt.Errorf("Service %s status %+v, want %s", name, lb, vip)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	for name, reason := range map[string]string{"liveness-thief": "PortReserved", "ip-thief": "VIPNotInPool"} {
		if _, err := testenv.Poll(ctx, 10*time.Second, 100*time.Millisecond, func() error {
			evs, err := l.Kube.CoreV1().Events(AppNamespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
			if err != nil {
				return err
			}
			for _, e := range evs.Items {
				if e.Type == corev1.EventTypeWarning && e.Reason == reason {
					t.Logf("event on Service %s: %s: %s", name, e.Reason, e.Message)
					return nil
				}
			}
			return fmt.Errorf("no %s warning on Service %s (%d events)", reason, name, len(evs.Items))
		}); err != nil {
			t.Error(err)
		}
	}
	if s, err := l.Kube.CoreV1().Services(AppNamespace).Get(ctx, "ip-thief", metav1.GetOptions{}); err != nil {
		t.Error(err)
	} else if lb := s.Status.LoadBalancer.Ingress; len(lb) != 0 {
		t.Errorf("Service ip-thief, on the client's address, has status %+v, want none", lb)
	}
	for _, e := range l.Edges {
		out, err := exec.Command("ip", "-n", e.NS, "-o", "addr", "show", "dev", "lo").CombinedOutput()
		if err != nil {
			t.Errorf("edge %s: ip addr: %v: %s", e.Name, err, out)
		} else if strings.Contains(string(out), " "+l.Client.Addr.Addr().String()+"/") {
			t.Errorf("edge %s put the client's address on lo:\n%s", e.Name, out)
		}
	}
	// Nor does anything of the node answer on a VIP's other ports (the liveness
	// port used to accept connections on the group's VIP): the
	// SYN is dropped at the director (reason vip_closed), so the dial times out.
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	if conn, err := l.Dial(dctx, "tcp", netip.AddrPortFrom(VIP, 10247).String()); err == nil {
		conn.Close()
		t.Error("the group VIP's port 10247 (the liveness checks') accepts connections")
	} else if !errors.Is(err, context.DeadlineExceeded) && !os.IsTimeout(err) {
		t.Errorf("the group VIP's port 10247: %v, want a timeout (the SYN dropped, not a reset from the node)", err)
	}
	cancel()
	tcpAddr := netip.AddrPortFrom(tcpVIP, 7000).String()
	udpAddr := netip.AddrPortFrom(udpVIP, 53).String()
	client := l.Client.Addr.Addr().String()

	// Every replica's nginx loads its stream servers on its own: wait until 30
	// new connections in a row are answered.
	if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error {
		for range 30 {
			c, _, _, err := l.tcpLine(ctx, tcpAddr)
			if err != nil {
				return err
			}
			c.Close()
		}
		return nil
	}); err != nil {
		t.Fatalf("TCP through %s: %v", tcpAddr, err)
	}
	edges, pods := map[string]int{}, map[string]int{}
	type held struct {
		c   net.Conn
		r   *bufio.Reader
		rep traffic.Reply
	}
	var conns []held
	t.Cleanup(func() {
		for _, h := range conns {
			h.c.Close()
		}
	})
	for range 90 {
		c, r, rep, err := l.tcpLine(ctx, tcpAddr)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Client != client {
			t.Fatalf("the TCP endpoint saw client %q (peer %s), want %s from the PROXY protocol header", rep.Client, rep.Peer, client)
		}
		edges[rep.Peer]++
		pods[rep.Pod]++
		conns = append(conns, held{c, r, rep})
	}
	t.Logf("90 TCP connections held through %s: per replica %v, per pod %v, client address %s at every endpoint", tcpAddr, edges, pods, client)
	if len(edges) != len(l.Edges) || len(pods) != len(l.Pods) {
		t.Errorf("TCP connections reached replicas %v and pods %v, want all %d and %d", edges, pods, len(l.Edges), len(l.Pods))
	}
	// They reached nginx through the agents' sk_lookup program, on every
	// replica: no listener of the Service's own.
	var steered []float64
	for i := range l.Edges {
		n, err := l.Metric(i, `portico_l4_steer_connections_total{verdict="steered"}`)
		if err != nil {
			t.Fatal(err)
		}
		steered = append(steered, n)
		if n == 0 {
			t.Errorf("edge %s steered no connection to nginx's listeners", l.Edges[i].Name)
		}
	}
	t.Logf("listener lookups steered to nginx per edge: %v", steered)

	// UDP: each query from a socket of its own (a new flow, so any replica);
	// ClientIP affinity keeps this client on one pod whichever replica's nginx
	// forwards it.
	if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error {
		_, err := l.udpQuery(udpAddr)
		return err
	}); err != nil {
		t.Fatalf("UDP through %s: %v", udpAddr, err)
	}
	uedges, upods := map[string]int{}, map[string]int{}
	for range 60 {
		rep, err := l.udpQuery(udpAddr)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Client != client {
			t.Fatalf("the UDP endpoint saw client %q (peer %s), want %s from the PROXY v2 header", rep.Client, rep.Peer, client)
		}
		uedges[rep.Peer]++
		upods[rep.Pod]++
	}
	t.Logf("60 UDP queries through %s: per replica %v, per pod %v, client address %s at the endpoint", udpAddr, uedges, upods, client)
	if len(uedges) < 2 || len(upods) != 1 {
		t.Errorf("UDP queries reached replicas %v and pods %v, want several replicas and one pod (ClientIP affinity)", uedges, upods)
	}

	// The VIP owner dies with the connections held.
	owner, err := l.Owner()
	if err != nil {
		t.Fatal(err)
	}
	// A bounded stream of new connections runs through the failover (one every
	// 20 ms, at most 10 s): the ones the dead owner's replica would have taken
	// fail until the liveness checks call it down.
	type attempt struct {
		at  time.Duration
		err error
	}
	stream := make(chan []attempt, 1)
	stop := make(chan struct{})
	start := time.Now()
	go func() {
		var as []attempt
		for i := 0; i < 500; i++ {
			select {
			case <-stop:
				stream <- as
				return
			case <-time.After(20 * time.Millisecond):
			}
			c, _, _, err := l.tcpLine(ctx, tcpAddr)
			if err == nil {
				c.Close()
			}
			as = append(as, attempt{time.Since(start), err})
		}
		stream <- as
	}()
	l.checkMetricsDocumented(t) // with L4 steering's series, before the owner dies
	newOwner, takeover := l.killOwner(t, owner)
	kept, OnSurvivors := 0, 0
	for _, h := range conns {
		if h.rep.Peer == owner.Addr.Addr().String() {
			continue
		}
		OnSurvivors++
		rep, err := lineOn(h.c, h.r)
		switch {
		case err != nil:
			t.Logf("held connection via %s to %s: %v", h.rep.Peer, h.rep.Pod, err)
		case rep != h.rep:
			t.Logf("held connection via %s to %s now answers %+v", h.rep.Peer, h.rep.Pod, rep)
		default:
			kept++
		}
	}
	time.Sleep(2 * time.Second)
	close(stop)
	as := <-stream
	failed, last := 0, time.Duration(0)
	for _, a := range as {
		if a.err != nil {
			failed++
			last = a.at
		}
	}
	t.Logf("stream of new TCP connections through the failover: %d of %d failed, the last %v after the kill", failed, len(as), last.Round(time.Millisecond))
	newFailed, udpFailed := 0, 0
	for range 30 {
		c, _, _, err := l.tcpLine(ctx, tcpAddr)
		if err != nil {
			newFailed++
			continue
		}
		c.Close()
	}
	for range 30 {
		if _, err := l.udpQuery(udpAddr); err != nil {
			t.Logf("UDP query %v after the takeover: %v", time.Since(start).Round(time.Millisecond), err)
			udpFailed++
		}
	}
	t.Logf("owner %s died; %s took over in %v; %d of %d held TCP connections on surviving replicas kept working; after takeover %d of 30 new TCP connections and %d of 30 UDP queries failed",
		owner.Name, newOwner.Name, takeover.Round(time.Millisecond), kept, OnSurvivors, newFailed, udpFailed)
	if OnSurvivors == 0 || kept != OnSurvivors {
		t.Errorf("%d of %d held connections on surviving replicas kept working, want all", kept, OnSurvivors)
	}
	if newFailed > 0 || udpFailed > 0 {
		t.Errorf("after the takeover %d new TCP connections and %d UDP queries failed, want none", newFailed, udpFailed)
	}
}
