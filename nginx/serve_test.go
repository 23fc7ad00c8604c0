package nginx

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/testcert"
	"github.com/portico-edge/portico/test/testenv"
)

func TestServeRoutesByHostAndPath(t *testing.T) {
	_, epA := backend(t, "A")
	_, epB := backend(t, "B")
	secure, other := selfSigned(t, "secure.test"), selfSigned(t, "other.test")
	snap := model.Snapshot{
		Servers: []model.Server{
			{Host: "*.wild.test", Locations: []model.Location{{Path: "/", Type: model.PathPrefix, Upstream: "t-b-80"}}},
			{Host: "a.test", Locations: []model.Location{
				{Path: "/", Type: model.PathPrefix, Upstream: "t-a-80"},
				{Path: "/api/", Type: model.PathPrefix, Upstream: "t-b-80"},
				{Path: "/api/v1", Type: model.PathExact, Upstream: "t-a-80"},
				{Path: "/exact", Type: model.PathExact, Upstream: "t-b-80"},
				{Path: "/empty", Type: model.PathPrefix, Upstream: "t-empty-80"},
			}},
			{Host: "b.test", DefaultUpstream: "t-b-80"},
			{Host: "other.test", TLSCertificate: other.Name, Locations: []model.Location{{Path: "/", Type: model.PathPrefix, Upstream: "t-a-80"}}},
			{Host: "secure.test", TLSCertificate: secure.Name, SSLRedirect: true, Locations: []model.Location{{Path: "/", Type: model.PathPrefix, Upstream: "t-b-80"}}},
		},
		Upstreams:    []model.Upstream{{Name: "t-a-80", Endpoints: []netip.AddrPort{epA}}, {Name: "t-b-80", Endpoints: []netip.AddrPort{epB}}, {Name: "t-empty-80"}},
		Certificates: []model.Certificate{other, secure},
	}
	n := startNginx(t, snap)
	c := n.client(false)

	for _, tc := range []struct {
		url, want string
		status    int
	}{
		{"http://a.test/", "A /", 200},
		{"http://a.test/x/y", "A /x/y", 200},
		{"http://a.test/api", "B /api", 200},
		{"http://a.test/api/", "B /api/", 200},
		{"http://a.test/api/users", "B /api/users", 200},
		{"http://a.test/apix", "A /apix", 200},     // Prefix matches path elements only
		{"http://a.test/api/v1", "A /api/v1", 200}, // the longer Exact path wins
		{"http://a.test/api/v1/x", "B /api/v1/x", 200},
		{"http://a.test/exact", "B /exact", 200},
		{"http://a.test/exact/", "A /exact/", 200}, // Exact does not match below itself
		{"http://a.test/empty/x", "", 503},         // no endpoints
		{"http://b.test/whatever", "B /whatever", 200},
		{"http://x.wild.test/w", "B /w", 200},
		{"http://other.test/o", "A /o", 200},
	} {
		resp, body := get(t, c, tc.url)
		if resp.StatusCode != tc.status || (tc.want != "" && body != tc.want) {
			t.Errorf("GET %s = %d %q, want %d %q", tc.url, resp.StatusCode, body, tc.status, tc.want)
		}
	}

	t.Run("proxy headers", func(t *testing.T) {
		resp, _ := get(t, c, "http://a.test/h", "X-Forwarded-For", "192.0.2.9", "X-Real-IP", "192.0.2.9")
		for h, want := range map[string]string{
			"Echo-X-Forwarded-For": "127.0.0.1", "Echo-X-Real-Ip": "127.0.0.1",
			"Echo-X-Forwarded-Host": "a.test", "Echo-X-Forwarded-Proto": "http", "Echo-Host": "a.test",
		} {
			if got := resp.Header.Get(h); got != want {
				t.Errorf("%s = %q, want %q", h, got, want)
			}
		}
	})

	t.Run("wildcard matches one label", func(t *testing.T) {
		expectClosed(t, n, "a.b.wild.test")
		expectClosed(t, n, "wild.test")
	})

	t.Run("unknown host is closed", func(t *testing.T) {
		expectClosed(t, n, "unknown.test")
	})

	t.Run("redirect to https", func(t *testing.T) {
		resp, _ := get(t, c, "http://secure.test/p?q=1")
		want := fmt.Sprintf("https://secure.test:%d/p?q=1", n.opt.HTTPSPort)
		if resp.StatusCode != http.StatusPermanentRedirect || resp.Header.Get("Location") != want {
			t.Errorf("GET http://secure.test/p?q=1 = %d Location %q, want 308 %q", resp.StatusCode, resp.Header.Get("Location"), want)
		}
	})

	t.Run("tls sni", func(t *testing.T) {
		for _, host := range []string{"secure.test", "other.test"} {
			conn, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", n.opt.HTTPSPort), &tls.Config{ServerName: host, InsecureSkipVerify: true})
			if err != nil {
				t.Fatalf("tls dial %s: %v", host, err)
			}
			cn := conn.ConnectionState().PeerCertificates[0].Subject.CommonName
			fmt.Fprintf(conn, "GET /t HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("https %s: %v", host, err)
			}
			resp.Body.Close()
			conn.Close()
			if cn != host || resp.StatusCode != 200 {
				t.Errorf("https %s: certificate %q, status %d; want %q, 200", host, cn, resp.StatusCode, host)
			}
		}
		for _, host := range []string{"unknown.test", "a.test"} {
			conn, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", n.opt.HTTPSPort), &tls.Config{ServerName: host, InsecureSkipVerify: true})
			if err == nil {
				conn.Close()
				t.Errorf("tls handshake for %s (no certificate) succeeded", host)
			}
		}
	})

	t.Run("websocket upgrade", func(t *testing.T) {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", n.opt.HTTPPort), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprint(conn, "GET /ws HTTP/1.1\r\nHost: a.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("upgrade status %d, want 101", resp.StatusCode)
		}
		fmt.Fprint(conn, "hello\n")
		line, err := br.ReadString('\n')
		if err != nil || line != "echo hello\n" {
			t.Errorf("through the upgraded connection: %q, %v", line, err)
		}
	})

	t.Run("large bodies", func(t *testing.T) {
		// 1 MiB is nginx's default body limit; a smaller body must go through and
		// be buffered to the temporary directory.
		req, _ := http.NewRequest(http.MethodPost, "http://a.test/big", strings.NewReader(strings.Repeat("x", 900<<10)))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || n != 2<<20 || resp.Header.Get("X-Request-Bytes") != fmt.Sprint(900<<10) {
			t.Errorf("POST /big: status %d, %d bytes back, backend saw %s, %v", resp.StatusCode, n, resp.Header.Get("X-Request-Bytes"), err)
		}
	})

	t.Run("stub_status", func(t *testing.T) {
		hc := &http.Client{Timeout: 5 * time.Second}
		resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/nginx_status", n.opt.StatusPort))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.HasPrefix(string(body), "Active connections:") {
			t.Errorf("stub_status answered %q", body)
		}
	})

	t.Run("master restarted after it dies", func(t *testing.T) {
		pid := n.r.MasterPID()
		if pid == 0 {
			t.Fatal("no master")
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 20*time.Second, func() string {
			if p := n.r.MasterPID(); p == 0 || p == pid {
				return "no new master"
			}
			return ""
		})
		n.waitChecksum(t, n.r.Checksum())
		if resp, body := get(t, c, "http://a.test/after"); resp.StatusCode != 200 || body != "A /after" {
			t.Errorf("after restart: %d %q", resp.StatusCode, body)
		}
	})

	t.Run("stop", func(t *testing.T) {
		pid := n.r.MasterPID()
		n.stop(t)
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("nginx master %d still exists after stop: %v", pid, err)
		}
		if conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", n.opt.HTTPPort), time.Second); err == nil {
			conn.Close()
			t.Error("nginx still accepts connections after stop")
		}
	})
}

// selfSignedRSA returns an RSA certificate and key of the given size for host.
func selfSignedRSA(t testing.TB, host string, bits int) model.Certificate {
	t.Helper()
	certPEM, keyPEM, err := testcert.RSA(host, bits)
	if err != nil {
		t.Fatal(err)
	}
	return model.Certificate{Name: "test/" + strings.ReplaceAll(host, ".", "-"), CertPEM: certPEM, KeyPEM: keyPEM}
}

// A certificate Go parses but OpenSSL refuses (a 1024-bit RSA key is below the
// security level Debian's OpenSSL enforces) takes down only its host's TLS server.
func TestCertificateNginxRefusesSkipsOnlyItsHost(t *testing.T) {
	_, epA := backend(t, "A")
	good, weak := selfSigned(t, "good.test"), selfSignedRSA(t, "weak.test", 1024)
	snap := func(weakCert model.Certificate) model.Snapshot {
		return model.Snapshot{
			Servers: []model.Server{
				{Host: "good.test", TLSCertificate: good.Name, DefaultUpstream: "t-a-80"},
				{Host: "weak.test", TLSCertificate: weakCert.Name, DefaultUpstream: "t-a-80"},
			},
			Upstreams:    []model.Upstream{{Name: "t-a-80", Endpoints: []netip.AddrPort{epA}}},
			Certificates: []model.Certificate{good, weakCert},
		}
	}
	n := startNginx(t, hostSnapshot("placeholder.test"))
	res, err := n.r.ApplyNow(context.Background(), snap(weak))
	if err != nil || res.Result != ResultTable {
		t.Fatalf("apply with a refused certificate: %s, %v", res.Result, err)
	}
	var found bool
	for _, p := range res.Problems {
		if p.Object == "Secret "+weak.Name && p.Reason == model.ReasonInvalidCertificate && strings.Contains(p.Detail, "nginx refused") {
			found = true
		}
	}
	if !found {
		t.Errorf("problems %v do not report the refused certificate", res.Problems)
	}
	handshake := func(host string) error {
		conn, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", n.opt.HTTPSPort), &tls.Config{ServerName: host, InsecureSkipVerify: true})
		if err == nil {
			conn.Close()
		}
		return err
	}
	if err := handshake("good.test"); err != nil {
		t.Errorf("good.test: %v", err)
	}
	if err := handshake("weak.test"); err == nil {
		t.Error("weak.test: handshake succeeded with a certificate nginx refused")
	}
	if resp, body := get(t, n.client(false), "http://weak.test/x"); resp.StatusCode != 200 || body != "A /x" {
		t.Errorf("http://weak.test/x = %d %q, want plain HTTP still served", resp.StatusCode, body)
	}
	// The same snapshot again is unchanged: the refusal is remembered, not retested.
	if res, _ := n.r.ApplyNow(context.Background(), snap(weak)); res.Result != ResultUnchanged {
		t.Errorf("same snapshot again: %s, want unchanged", res.Result)
	}
	// A fixed Secret is used again.
	fixed := selfSigned(t, "weak.test")
	fixed.Name = weak.Name
	if res, err := n.r.ApplyNow(context.Background(), snap(fixed)); err != nil || res.Result != ResultTable {
		t.Fatalf("apply with the fixed certificate: %s, %v", res.Result, err)
	}
	if err := handshake("weak.test"); err != nil {
		t.Errorf("weak.test after the fix: %v", err)
	}
}

// An Ingress default backend (or a rule without a host) is the catch-all server:
// hosts no rule names reach it instead of having their connection closed.
func TestServeCatchAll(t *testing.T) {
	_, epA := backend(t, "A")
	_, epB := backend(t, "B")
	n := startNginx(t, model.Snapshot{
		Servers: []model.Server{
			{Host: "", DefaultUpstream: "t-a-80", Locations: []model.Location{{Path: "/b", Type: model.PathPrefix, Upstream: "t-b-80"}}},
			{Host: "b.test", DefaultUpstream: "t-b-80"},
		},
		Upstreams: []model.Upstream{{Name: "t-a-80", Endpoints: []netip.AddrPort{epA}}, {Name: "t-b-80", Endpoints: []netip.AddrPort{epB}}},
	})
	c := n.client(false)
	for _, tc := range []struct{ url, want string }{
		{"http://unknown.test/x", "A /x"},
		{"http://unknown.test/b/x", "B /b/x"},
		{"http://b.test/x", "B /x"},
	} {
		if resp, body := get(t, c, tc.url); resp.StatusCode != 200 || body != tc.want {
			t.Errorf("GET %s = %d %q, want 200 %q", tc.url, resp.StatusCode, body, tc.want)
		}
	}
}

// An upstream with IPv4 and IPv6 endpoints reaches both.
func TestServeIPv6Endpoint(t *testing.T) {
	l, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	v6 := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "V6") }))
	v6.Listener.Close()
	v6.Listener = l
	v6.Start()
	t.Cleanup(v6.Close)
	_, epA := backend(t, "A")
	n := startNginx(t, model.Snapshot{
		Servers: []model.Server{
			{Host: "v6.test", DefaultUpstream: "t-v6-80"},
			{Host: "both.test", DefaultUpstream: "t-both-80"},
		},
		Upstreams: []model.Upstream{
			{Name: "t-both-80", Endpoints: []netip.AddrPort{epA, netip.MustParseAddrPort(l.Addr().String())}},
			{Name: "t-v6-80", Endpoints: []netip.AddrPort{netip.MustParseAddrPort(l.Addr().String())}},
		},
	})
	c := n.client(false)
	if resp, body := get(t, c, "http://v6.test/"); resp.StatusCode != 200 || body != "V6" {
		t.Errorf("v6.test: %d %q, want the IPv6 backend", resp.StatusCode, body)
	}
	seen := map[string]bool{}
	for range 10 { // round robin over two endpoints
		_, body := get(t, c, "http://both.test/")
		seen[strings.Fields(body)[0]] = true
	}
	if !seen["A"] || !seen["V6"] {
		t.Errorf("both.test reached %v, want A and V6", seen)
	}
}
