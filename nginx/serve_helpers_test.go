package nginx

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/testcert"
)

// backend is a loopback HTTP server that names itself and echoes what nginx sent.
func backend(t testing.TB, name string) (*httptest.Server, netip.AddrPort) {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "websocket" {
			echoUpgrade(w)
			return
		}
		if r.URL.Path == "/big" {
			n, _ := io.Copy(io.Discard, r.Body)
			w.Header().Set("X-Request-Bytes", fmt.Sprint(n))
			w.Write(make([]byte, 2<<20))
			return
		}
		for _, h := range []string{"X-Forwarded-For", "X-Real-Ip", "X-Forwarded-Host", "X-Forwarded-Proto"} {
			w.Header().Set("Echo-"+h, r.Header.Get(h))
		}
		w.Header().Set("Echo-Host", r.Host)
		fmt.Fprintf(w, "%s %s", name, r.URL.Path)
	}))
	t.Cleanup(s.Close)
	return s, netip.MustParseAddrPort(s.Listener.Addr().String())
}

// echoUpgrade answers an upgrade with 101 and then echoes one line.
func echoUpgrade(w http.ResponseWriter) {
	conn, rw, err := w.(http.Hijacker).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	rw.Flush()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := rw.ReadString('\n')
	if err != nil {
		return
	}
	rw.WriteString("echo " + line)
	rw.Flush()
}

// selfSigned returns a certificate and key for host.
func selfSigned(t testing.TB, host string) model.Certificate {
	t.Helper()
	certPEM, keyPEM, err := testcert.ECDSA(host)
	if err != nil {
		t.Fatal(err)
	}
	return model.Certificate{Name: "test/" + strings.ReplaceAll(host, ".", "-"), CertPEM: certPEM, KeyPEM: keyPEM}
}

func get(t *testing.T, c *http.Client, url string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read body: %v", url, err)
	}
	return resp, string(body)
}

// expectClosed checks that nginx closes the connection without an answer (444).
func expectClosed(t *testing.T, n *liveNginx, host string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", n.opt.HTTPPort), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host)
	got, err := io.ReadAll(conn)
	if len(got) != 0 {
		t.Errorf("host %s: got an answer %q, want the connection closed", host, got)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("host %s: connection left open", host)
	}
}
