package steer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf/rlimit"

	"github.com/portico-edge/portico/test/netlab"
)

// TestSteering runs sk_steer in a namespace of its own, against listeners of
// this process on the wildcard addresses: a routed VIP:port reaches its class's
// listener, whose accepted socket names the VIP and port (a Gateway listener's
// port too, to the HTTP listener); an unrouted port and a removed route are
// refused as without the program; the stream listeners' own ports are not
// reachable directly, the HTTP listener's is; and a second Load (an agent restart) keeps steering
// through the pinned link.
func TestSteering(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: BPF and network namespaces")
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		t.Fatal(err)
	}
	lab, err := netlab.New("sk")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lab.Close() })
	node, err := lab.AddNode("n", netip.MustParsePrefix("10.230.0.2/24"), net.HardwareAddr{0x02, 0, 0, 0, 0x5e, 0x02})
	if err != nil {
		t.Fatal(err)
	}
	vip4, vip6 := netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8::10")
	for _, args := range [][]string{
		{"-n", node.NS, "addr", "add", vip4.String() + "/32", "dev", "lo"},
		{"-n", node.NS, "addr", "add", vip6.String() + "/128", "dev", "lo", "nodad"},
	} {
		if err := netlab.IP(args...); err != nil {
			t.Fatal(err)
		}
	}
	const plain, proxy, httpPort = 10242, 10243, 8080
	type listener struct {
		class Class
		ln    net.Listener
	}
	var lns []listener
	err = netlab.Do(node.NS, func() error {
		for _, l := range []struct {
			class Class
			netw  string
			addr  string
		}{
			{Plain, "tcp4", "0.0.0.0"}, {Plain, "tcp6", "[::]"}, {Proxy, "tcp4", "0.0.0.0"}, {Proxy, "tcp6", "[::]"},
			{HTTP, "tcp4", "0.0.0.0"},
		} {
			port := plain
			switch l.class {
			case Proxy:
				port = proxy
			case HTTP:
				port = httpPort
			}
			// Plain TCP, as nginx's: Go listens with MPTCP by default, whose
			// sockets a socket map does not take.
			var lc net.ListenConfig
			lc.SetMultipathTCP(false)
			ln, err := lc.Listen(context.Background(), l.netw, l.addr+":"+strconv.Itoa(port))
			if err != nil {
				return err
			}
			t.Cleanup(func() { ln.Close() })
			lns = append(lns, listener{l.class, ln})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Every listener answers with its class and the local address it accepted on.
	for _, l := range lns {
		go func() {
			for {
				c, err := l.ln.Accept()
				if err != nil {
					return
				}
				fmt.Fprintf(c, "%d %s\n", l.class, c.LocalAddr())
				c.Close()
			}
		}()
	}

	pin := fmt.Sprintf("/sys/fs/bpf/portico-steer-test-%d", os.Getpid())
	t.Cleanup(func() { os.RemoveAll(pin) })
	opts := Options{PinPath: pin, Ports: [fixed]uint16{plain, proxy}, NetNS: "/run/netns/" + node.NS}
	s, err := Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	web4, web6 := netip.AddrPortFrom(vip4, 5432), netip.AddrPortFrom(vip6, 5432)
	pp4 := netip.AddrPortFrom(vip4, 1883)
	if err := s.Sync(os.Getpid(), []Route{{VIP: web4, Class: Plain}, {VIP: web6, Class: Plain}, {VIP: pp4, Class: Proxy}}); err != nil {
		t.Fatal(err)
	}
	if got := s.Listeners(); fmt.Sprint(got) != "[true true true true false false false false]" {
		t.Fatalf("listeners in steer_socks: %v, want the four stream ones", got)
	}
	dial := func(to netip.AddrPort) (string, error) {
		var reply string
		err := netlab.Do(node.NS, func() error {
			c, err := net.DialTimeout("tcp", to.String(), 500*time.Millisecond)
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(2 * time.Second))
			buf := make([]byte, 128)
			n, err := c.Read(buf)
			reply = string(buf[:n])
			return err
		})
		return reply, err
	}
	expect := func(to netip.AddrPort, want string) {
		t.Helper()
		got, err := dial(to)
		if err != nil {
			t.Errorf("dial %s: %v, want %q", to, err, want)
		} else if got != want {
			t.Errorf("dial %s: %q, want %q", to, got, want)
		}
	}
	refused := func(to netip.AddrPort, why string) {
		t.Helper()
		if got, err := dial(to); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("dial %s (%s): %q, %v; want connection refused", to, why, got, err)
		}
	}
	expect(web4, fmt.Sprintf("0 %s\n", web4))
	expect(web6, fmt.Sprintf("0 %s\n", web6))
	expect(pp4, fmt.Sprintf("1 %s\n", pp4))
	refused(netip.AddrPortFrom(vip4, 5433), "no route")
	// A Gateway's listener on port 9000: to nginx's HTTP listener (port 8080),
	// found when its first route comes (in the master registered last),
	// which is still reachable directly.
	gw := netip.AddrPortFrom(vip4, 9000)
	if err := s.Sync(0, []Route{{VIP: web4, Class: Plain}, {VIP: web6, Class: Plain}, {VIP: pp4, Class: Proxy}, {VIP: gw, Class: HTTP, Listen: httpPort}}); err != nil {
		t.Fatal(err)
	}
	if got := s.Listeners(); fmt.Sprint(got) != "[true true true true true false false false]" {
		t.Fatalf("listeners in steer_socks: %v, want the HTTP one too", got)
	}
	expect(gw, fmt.Sprintf("2 %s\n", gw))
	expect(netip.AddrPortFrom(vip4, httpPort), fmt.Sprintf("2 %s\n", netip.AddrPortFrom(vip4, httpPort)))
	refused(netip.AddrPortFrom(vip6, 1883), "no route for IPv6")
	for _, direct := range []netip.AddrPort{
		netip.AddrPortFrom(vip4, plain), netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), proxy),
		netip.AddrPortFrom(node.Addr.Addr(), plain), netip.AddrPortFrom(netip.IPv6Loopback(), plain),
	} {
		if got, err := dial(direct); err == nil {
			t.Errorf("dial %s, a listener's own port: %q, want no connection", direct, got)
		}
	}

	// An agent restart: the pinned link moves to the new program, the routes stay.
	s.Close()
	if s, err = Load(opts); err != nil {
		t.Fatal(err)
	}
	expect(web4, fmt.Sprintf("0 %s\n", web4))
	if err := s.Sync(0, []Route{{VIP: web6, Class: Plain}, {VIP: pp4, Class: Plain}}); err != nil {
		t.Fatal(err)
	}
	refused(web4, "route removed")
	expect(pp4, fmt.Sprintf("0 %s\n", pp4))
	c, err := s.Counts()
	if err != nil {
		t.Fatal(err)
	}
	if c.Steered != 6 || c.Direct != 4 || c.AssignFailed != 0 {
		t.Errorf("counts %+v, want 6 steered, 4 direct, no failed assignment", c)
	}

	// A listener that closes leaves the socket map by itself: its routes are
	// refused, not sent to a dead socket.
	defer func() {
		// An agent without steering removes the program: the listeners'
		// ports are plain ports again.
		s.Close()
		if err := Remove(pin); err != nil {
			t.Fatal(err)
		}
		for _, l := range lns {
			if l.class == Proxy && l.ln.Addr().(*net.TCPAddr).IP.To4() != nil {
				if _, err := dial(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), proxy)); err != nil {
					t.Errorf("a listener's own port after Remove: %v, want a connection", err)
				}
			}
		}
	}()
	for _, l := range lns {
		if l.class != Plain {
			continue
		}
		l.ln.Close()
	}
	refused(pp4, "listener closed")
	if got := s.Listeners(); fmt.Sprint(got) != "[false false true true true false false false]" {
		t.Errorf("listeners after the plain ones closed: %v", got)
	}
}

// TestMapLayout parses the embedded object (no privileges needed): each map's
// key and value sizes match the Go types the package writes into it.
func TestMapLayout(t *testing.T) {
	spec, err := loadSteer()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct {
		name       string
		key, value any
	}{
		{steerMapSteerRoutes, steerSteerKey{}, steerSteerClass(0)},
		{steerMapSteerConfig, uint32(0), steerSteerCfg{}},
		{steerMapSteerSocks, uint32(0), uint64(0)},
		{steerMapSteerStats, uint32(0), uint64(0)},
	} {
		ms := spec.Maps[m.name]
		if ms == nil {
			t.Errorf("map %s missing", m.name)
			continue
		}
		if k, v := binary.Size(m.key), binary.Size(m.value); ms.KeySize != uint32(k) || ms.ValueSize != uint32(v) {
			t.Errorf("map %s: key %d, value %d bytes; Go writes %d and %d", m.name, ms.KeySize, ms.ValueSize, k, v)
		}
	}
}
