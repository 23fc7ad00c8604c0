package nginx

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/testenv"
)

var proxyV2Signature = []byte{0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d, 0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a}

// udpProxyV2Backend is a UDP server that answers each datagram with the
// source address and port its PROXY v2 header names and the payload after it
// ("-" when the datagram has no valid header).
func udpProxyV2Backend(t *testing.T, network, addr string) netip.AddrPort {
	t.Helper()
	pc, err := net.ListenPacket(network, addr)
	if err != nil {
		t.Skipf("listen %s %s: %v", network, addr, err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			d, answer := buf[:n], "-"
			if len(d) >= 16 && bytes.Equal(d[:12], proxyV2Signature) && d[12] == 0x21 {
				l := int(binary.BigEndian.Uint16(d[14:16]))
				body := d[16:]
				if len(body) >= l {
					var src netip.AddrPort
					switch {
					case d[13] == 0x12 && l >= 12:
						a, _ := netip.AddrFromSlice(body[0:4])
						src = netip.AddrPortFrom(a, binary.BigEndian.Uint16(body[8:10]))
					case d[13] == 0x22 && l >= 36:
						a, _ := netip.AddrFromSlice(body[0:16])
						src = netip.AddrPortFrom(a, binary.BigEndian.Uint16(body[32:34]))
					}
					if src.IsValid() {
						answer = src.String() + " " + string(body[l:])
					}
				}
			}
			pc.WriteTo([]byte(answer), from)
		}
	}()
	return netip.MustParseAddrPort(pc.LocalAddr().String())
}

// TestServeUDPProxyProtocol: an L4 Service's UDP port with the PROXY protocol
// puts a PROXY v2 header with the client's address and port in front of every
// datagram, for IPv4 and IPv6 clients, through real nginx and its njs module.
func TestServeUDPProxyProtocol(t *testing.T) {
	ep4 := udpProxyV2Backend(t, "udp4", "127.0.0.1:0")
	ep6 := udpProxyV2Backend(t, "udp6", "[::1]:0")
	port := testenv.Ports(t, 1)[0]
	snap := model.Snapshot{
		Services: []model.Service{
			{Name: "t/dns4", VIPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, ProxyProtocol: true, UDPIdleTimeout: 1,
				Ports: []model.ServicePort{{Protocol: model.UDP, Port: port, Upstream: "t-dns4-udp"}}},
			{Name: "t/dns6", VIPs: []netip.Addr{netip.MustParseAddr("::1")}, ProxyProtocol: true, UDPIdleTimeout: 1,
				Ports: []model.ServicePort{{Protocol: model.UDP, Port: port, Upstream: "t-dns6-udp"}}},
		},
		Upstreams: []model.Upstream{
			{Name: "t-dns4-udp", Endpoints: []netip.AddrPort{ep4}},
			{Name: "t-dns6-udp", Endpoints: []netip.AddrPort{ep6}},
		},
	}
	startNginx(t, snap) // sessions idle 1 s: the stop at the end need not wait
	for _, tc := range []struct{ network, vip string }{{"udp4", "127.0.0.1"}, {"udp6", "::1"}} {
		c, err := net.ListenPacket(tc.network, net.JoinHostPort(tc.vip, "0"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		me := c.LocalAddr().String()
		to := net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(tc.vip), port))
		for _, q := range []string{"first", "second"} {
			var got string
			for try := 0; try < 20 && got == ""; try++ { // nginx may still be binding
				c.WriteTo([]byte(q), to)
				c.SetReadDeadline(time.Now().Add(250 * time.Millisecond))
				buf := make([]byte, 512)
				if n, _, err := c.ReadFrom(buf); err == nil {
					got = string(buf[:n])
				}
			}
			if want := netip.MustParseAddrPort(me).String() + " " + q; got != want {
				t.Errorf("%s datagram %q: the endpoint read %q, want %q", tc.network, q, got, want)
			}
		}
	}
}
