package nginx

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/portico-edge/portico/test/testenv"

	"github.com/google/go-cmp/cmp"

	"github.com/portico-edge/portico/controlplane/model"
)

// TestServeViews checks, in a real nginx, that a View (a Gateway with VIPs of
// its own) answers from its own hosts alone: the same host is three different
// routes on the group's address and on two views' VIPs, each view has its own
// catch-all and certificates, a host with "/" cannot reach another view's
// keys, and a change to one view's hosts is a table change (no reload).
func TestServeViews(t *testing.T) {
	a, b, c := echoBackend(t, "a"), echoBackend(t, "b"), echoBackend(t, "c")
	own, v1, v2 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3")
	listen := []netip.Addr{own, v1, v2}
	if ipv6Available() {
		listen = append(listen, netip.IPv6Loopback())
	}
	ports := testenv.Ports(t, 2)
	httpPort, httpsPort := ports[0], ports[1]
	certOwn, cert2 := selfSigned(t, "shop.test"), selfSigned(t, "shop.test")
	cert2.Name = "test/view-2"
	loc := func(path, up string) []model.Location {
		return []model.Location{{Path: path, Type: model.PathPrefix, Upstream: up}}
	}
	snap := model.Snapshot{
		Views: []model.View{
			{Name: "infra/one", VIPs: []netip.Addr{v1}, Ports: []model.Port{{Protocol: model.TCP, Port: httpPort}, {Protocol: model.TCP, Port: httpsPort}}, TLSPorts: []uint16{httpsPort}},
			{Name: "infra/two", VIPs: listen[2:], Ports: []model.Port{{Protocol: model.TCP, Port: httpPort}, {Protocol: model.TCP, Port: httpsPort}}, TLSPorts: []uint16{httpsPort}},
		},
		Servers: []model.Server{
			{Host: "shop.test", TLSCertificate: certOwn.Name, Locations: loc("/", "t-a-80")},
			{View: "infra/one", Port: httpPort, Host: "", Locations: loc("/", "t-c-80")},
			{View: "infra/one", Port: httpPort, Host: "shop.test", Locations: loc("/", "t-b-80")},
			{View: "infra/two", Port: httpPort, Host: "**.test", Locations: loc("/deep", "t-a-80")},
			{View: "infra/two", Port: httpPort, Host: "shop.test", Locations: loc("/", "t-c-80")},
			// On view two's HTTPS port: another route, and a certificate; and
			// a catch-all, another listener's.
			{View: "infra/two", Port: httpsPort, Host: "", TLSCertificate: cert2.Name, Listener: "any", Locations: loc("/", "t-a-80")},
			{View: "infra/two", Port: httpsPort, Host: "shop.test", TLSCertificate: cert2.Name, Listener: "shop", Locations: loc("/", "t-b-80")},
		},
		Upstreams:    []model.Upstream{{Name: "t-a-80", Endpoints: []netip.AddrPort{a}}, {Name: "t-b-80", Endpoints: []netip.AddrPort{b}}, {Name: "t-c-80", Endpoints: []netip.AddrPort{c}}},
		Certificates: []model.Certificate{certOwn, cert2},
	}
	// On the wildcard addresses, as on an edge: nginx learns the address a
	// connection came to from the socket (getsockname), in the TLS handshake
	// too.
	n := startNginx(t, snap, func(o *Options) {
		o.ListenAddrs, o.HTTPPort, o.HTTPSPort, o.ListenIPv6 = nil, httpPort, httpsPort, len(listen) == 4
	})
	at := func(addr netip.Addr) *http.Client {
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, netip.AddrPortFrom(addr, n.opt.HTTPPort).String())
			}}}
	}
	check := func(t *testing.T, addr netip.Addr, host, path string, wantStatus int, want string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://x"+path, nil)
		req.Host = host
		resp, err := at(addr).Do(req)
		if wantStatus == 0 { // 444: closed without an answer
			if err == nil {
				resp.Body.Close()
				t.Errorf("%s %s%s = %d, want the connection closed", addr, host, path, resp.StatusCode)
			}
			return
		}
		if err != nil {
			t.Errorf("%s %s%s: %v", addr, host, path, err)
			return
		}
		resp.Body.Close()
		if got := resp.Header.Get("X-Backend"); resp.StatusCode != wantStatus || got != want {
			t.Errorf("%s %s%s = %d from %q, want %d from %q", addr, host, path, resp.StatusCode, got, wantStatus, want)
		}
	}
	t.Run("hosts", func(t *testing.T) {
		check(t, own, "shop.test", "/", 200, "a")
		check(t, v1, "shop.test", "/", 200, "b")
		check(t, v2, "shop.test", "/", 200, "c")
		check(t, v1, "other.test", "/", 200, "c")     // view one's catch-all
		check(t, v2, "other.test", "/", 404, "")      // view two has none: 404
		check(t, v2, "x.y.test", "/deep/1", 200, "a") // its deep wildcard
		check(t, own, "x.y.test", "/deep/1", 0, "")   // not the group's: closed (444)
		check(t, v1, "x.y.test", "/deep/1", 200, "c") // nor view one's: its catch-all
		if len(listen) == 4 {
			check(t, netip.IPv6Loopback(), "shop.test", "/", 200, "c")
		}
	})
	t.Run("a view's ports", func(t *testing.T) {
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true, ServerName: "shop.test"},
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, netip.AddrPortFrom(v2, httpsPort).String())
			}}}
		resp, err := c.Get("https://shop.test/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.Header.Get("X-Backend"); got != "b" {
			t.Errorf("view two's HTTPS port: shop.test from %q, want b (its HTTP port's route is c's)", got)
		}
	})
	t.Run("misdirected requests", func(t *testing.T) {
		for _, tc := range []struct {
			sni, host string
			status    int
			backend   string
		}{
			{"shop.test", "shop.test", 200, "b"},
			{"shop.test", "other.test", 421, ""},   // the catch-all listener's host on shop's connection
			{"other.test", "other.test", 200, "a"}, // the catch-all's
			{"unknown.test", "other.test", 200, "a"},
			{"unknown.test", "shop.test", 421, ""},
		} {
			c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
				TLSClientConfig: &tls.Config{InsecureSkipVerify: true, ServerName: tc.sni},
				DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
					return (&net.Dialer{}).DialContext(ctx, network, netip.AddrPortFrom(v2, httpsPort).String())
				}}}
			req, _ := http.NewRequest("GET", "https://x/", nil)
			req.Host = tc.host
			resp, err := c.Do(req)
			if err != nil {
				t.Errorf("SNI %s, Host %s: %v", tc.sni, tc.host, err)
				continue
			}
			resp.Body.Close()
			if got := resp.Header.Get("X-Backend"); resp.StatusCode != tc.status || got != tc.backend {
				t.Errorf("SNI %s, Host %s: %d from %q, want %d from %q", tc.sni, tc.host, resp.StatusCode, got, tc.status, tc.backend)
			}
		}
	})
	t.Run("host naming another view", func(t *testing.T) {
		conn, err := net.Dial("tcp", netip.AddrPortFrom(own, n.opt.HTTPPort).String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: 1/shop.test\r\nConnection: close\r\n\r\n")
		buf := make([]byte, 64)
		k, _ := conn.Read(buf)
		if got := string(buf[:k]); len(got) < 12 || got[:12] != "HTTP/1.1 400" {
			t.Errorf("Host 1/shop.test = %q, want nginx's 400", got)
		}
	})
	t.Run("certificates", func(t *testing.T) {
		for _, tc := range []struct {
			addr netip.Addr
			sni  string
			want string // the certificate's name, "" for a refused handshake
		}{
			{own, "shop.test", certOwn.Name},
			{v2, "shop.test", cert2.Name},
			{v1, "shop.test", ""},    // view one has no certificate
			{own, "2/shop.test", ""}, // "/" names no host
		} {
			conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", netip.AddrPortFrom(tc.addr, n.opt.HTTPSPort).String(),
				&tls.Config{ServerName: tc.sni, InsecureSkipVerify: true})
			got := ""
			if err == nil {
				got = certName(snap.Certificates, conn.ConnectionState().PeerCertificates[0].Raw)
				conn.Close()
			}
			if got != tc.want {
				t.Errorf("%s SNI %q: certificate %q (%v), want %q", tc.addr, tc.sni, got, err, tc.want)
			}
		}
	})
	t.Run("change one view without a reload", func(t *testing.T) {
		snap.Servers[2].Locations = loc("/", "t-a-80")
		snap.Servers = append(snap.Servers, model.Server{View: "infra/two", Port: httpPort, Host: "new.test", Locations: loc("/", "t-b-80")})
		if res, err := n.r.ApplyNow(context.Background(), snap); err != nil || res.Result != ResultTable {
			t.Fatalf("change: %s, %v; want %s (no reload)", res.Result, err, ResultTable)
		}
		check(t, v1, "shop.test", "/", 200, "a")
		check(t, v2, "new.test", "/", 200, "b")
		check(t, v1, "new.test", "/", 200, "c") // view one's catch-all still
		check(t, own, "new.test", "/", 0, "")
	})
}

// certName is the name of the certificate in certs whose chain starts with der.
func certName(certs []model.Certificate, der []byte) string {
	for _, c := range certs {
		b, _ := pem.Decode(c.CertPEM)
		if b != nil && bytes.Equal(b.Bytes, der) {
			return c.Name
		}
	}
	return "unknown"
}

// TestViewRoutes checks the routes that give a View's ports other than
// nginx's own to its HTTP and HTTPS listeners (through the agent's sk_lookup
// program): one per VIP and port, by the port's protocol, none for the ports
// nginx listens on; without steering, a problem each.
func TestViewRoutes(t *testing.T) {
	vip4, vip6 := netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8::10")
	snap := model.Snapshot{
		Groups: []model.Group{{Name: "edge/a"}, {Name: "edge/b"}},
		Views: []model.View{
			{Name: "infra/gw", Group: "edge/a", VIPs: []netip.Addr{vip4, vip6},
				Ports:    []model.Port{{Protocol: model.TCP, Port: 80}, {Protocol: model.TCP, Port: 443}, {Protocol: model.TCP, Port: 8080}, {Protocol: model.TCP, Port: 8443}},
				TLSPorts: []uint16{443, 8443}},
			{Name: "infra/other", Group: "edge/b", VIPs: []netip.Addr{netip.MustParseAddr("192.0.2.11")}, Ports: []model.Port{{Protocol: model.TCP, Port: 8080}}},
		},
	}
	opt := DefaultOptions("")
	opt.Group = "edge/a"
	opt.L4Steered = [2]uint16{10242, 10243}
	cfg, err := Render(snap, opt)
	if err != nil {
		t.Fatal(err)
	}
	want := []L4Route{
		{VIP: netip.AddrPortFrom(vip4, 8080), Class: HTTPRoute, Listen: 80}, {VIP: netip.AddrPortFrom(vip6, 8080), Class: HTTPRoute, Listen: 80},
		{VIP: netip.AddrPortFrom(vip4, 8443), Class: HTTPSRoute, Listen: 443}, {VIP: netip.AddrPortFrom(vip6, 8443), Class: HTTPSRoute, Listen: 443},
	}
	if d := cmp.Diff(want, cfg.L4Routes, cmp.Comparer(func(x, y netip.AddrPort) bool { return x == y })); d != "" {
		t.Errorf("routes (-want +got):\n%s", d)
	}
	opt.L4Steered = [2]uint16{}
	if cfg, err = Render(snap, opt); err != nil {
		t.Fatal(err)
	}
	if len(cfg.L4Routes) != 0 || len(cfg.Problems) != 2 {
		t.Errorf("without steering: routes %v, problems %v; want none and two", cfg.L4Routes, cfg.Problems)
	}
}

func TestNginxIPv4Tail(t *testing.T) {
	for a, want := range map[string]bool{
		"::1": false, "::": false, "2001:db8::1": false, "fd00::10": false, "::1:0:0:1": false,
		"::ffff:192.0.2.1": true, "::192.0.2.1": true, "::0.0.1.2": true, "::0.0.1.1": false,
	} {
		if got := nginxIPv4Tail(netip.MustParseAddr(a)); got != want {
			t.Errorf("nginxIPv4Tail(%s) = %v, want %v", a, got, want)
		}
	}
}
