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
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/testcert"
	"github.com/portico-edge/portico/test/testenv"
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

// liveNginx is a Reloader running a real nginx on loopback.
type liveNginx struct {
	r      *Reloader
	opt    Options
	cancel context.CancelFunc
	done   chan error
}

// prefixDir returns a temporary nginx prefix that unprivileged workers can enter.
func prefixDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
		if filepath.Dir(d) == os.TempDir() {
			break
		}
	}
	return filepath.Join(dir, "nginx")
}

// startNginx runs a Reloader with a real nginx serving snap on free loopback ports
// and waits until it serves. Ports found free can be taken by another process before
// nginx binds them, so a failed start is retried on new ports. Each of opts can
// change the render options (after the ports are set).
func startNginx(t testing.TB, snap model.Snapshot, opts ...func(*Options)) *liveNginx {
	t.Helper()
	return startNginxWith(t, snap, nil, opts...)
}

// startNginxWith is startNginx with rc, when not nil, changing the
// Reloader's configuration.
func startNginxWith(t testing.TB, snap model.Snapshot, rc func(*ReloaderConfig), opts ...func(*Options)) *liveNginx {
	t.Helper()
	var lastErr error
	for range 3 {
		n, err := tryStartNginx(t, snap, rc, opts...)
		if err == nil {
			return n
		}
		lastErr = err
		t.Logf("nginx did not start, retrying on other ports: %v", err)
	}
	t.Fatalf("start nginx: %v", lastErr)
	return nil
}

func tryStartNginx(t testing.TB, snap model.Snapshot, rc func(*ReloaderConfig), opts ...func(*Options)) (*liveNginx, error) {
	bin := nginxBinary(t)
	ports := testenv.Ports(t, 4)
	opt := DefaultOptions("")
	opt.ListenAddrs = []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	opt.HTTPPort, opt.HTTPSPort, opt.StatusPort, opt.LivenessPort = ports[0], ports[1], ports[2], ports[3]
	opt.WorkerProcesses = 2
	opt.WorkerConnections = 1024
	for _, o := range opts {
		o(&opt)
	}
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	cfg := ReloaderConfig{
		Dir: prefixDir(t), Render: opt, Debounce: 50 * time.Millisecond,
		ConfirmTimeout: 10 * time.Second, RestartBackoff: 100 * time.Millisecond, StopTimeout: 10 * time.Second,
	}
	if rc != nil {
		rc(&cfg)
	}
	r, err := NewReloader(cfg, Exec{Binary: bin, Log: log.Named("nginx")}, log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	want, err := Render(snap, opt)
	if err != nil {
		t.Fatal(err)
	}
	r.Update(snap)
	ctx, cancel := context.WithCancel(context.Background())
	n := &liveNginx{r: r, opt: opt, cancel: cancel, done: make(chan error, 1)}
	go func() { n.done <- r.Run(ctx) }()
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Second}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if got, err := Health(ctx, c, n.healthURL()); err == nil && got == want.Checksum {
			t.Cleanup(func() { n.stop(t) })
			return n, nil
		}
		select {
		case err := <-n.done:
			cancel()
			return nil, fmt.Errorf("reloader run: %w", err)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			n.stop(t)
			return nil, fmt.Errorf("nginx does not serve config %.12s after 20s", want.Checksum)
		}
	}
}

func (n *liveNginx) stop(t testing.TB) {
	if n.cancel == nil {
		return
	}
	n.cancel()
	n.cancel = nil
	select {
	case err := <-n.done:
		if err != nil {
			t.Errorf("reloader run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("reloader did not stop within 30s")
	}
}

func (n *liveNginx) healthURL() string {
	return fmt.Sprintf("http://127.0.0.1:%d/healthz", n.opt.StatusPort)
}

func (n *liveNginx) waitChecksum(t testing.TB, sum string) {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Second}
	testenv.Eventually(t, 15*time.Second, func() string {
		got, err := Health(context.Background(), c, n.healthURL())
		if err == nil && got == sum {
			return ""
		}
		return fmt.Sprintf("nginx does not serve config %.12s: got %.12q, %v", sum, got, err)
	})
}

// waitTable waits until nginx's workers use the table with that digest.
func (n *liveNginx) waitTable(t testing.TB, digest string) {
	t.Helper()
	testenv.Eventually(t, 15*time.Second, func() string {
		got, err := tableDigest(context.Background(), n.r.ctl)
		if err == nil && got == digest {
			return ""
		}
		return fmt.Sprintf("nginx does not use table %s: got %q, %v", digest, got, err)
	})
}

// client sends every request to nginx's HTTP port, whatever the URL's host.
func (n *liveNginx) client(keepAlive bool) *http.Client {
	addr := fmt.Sprintf("127.0.0.1:%d", n.opt.HTTPPort)
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			DisableKeepAlives: !keepAlive,
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, addr)
			},
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
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

// A restarted agent takes over the master an earlier one left running (its listening
// sockets stay open), reloads it with the new configuration and stops it on exit.
func TestRunAdoptsALeftoverMaster(t *testing.T) {
	_, epA := backend(t, "A")
	_, epB := backend(t, "B")
	snap := func(ep netip.AddrPort) model.Snapshot {
		return model.Snapshot{
			Servers:   []model.Server{{Host: "a.test", DefaultUpstream: "t-x-80"}},
			Upstreams: []model.Upstream{{Name: "t-x-80", Endpoints: []netip.AddrPort{ep}}},
		}
	}
	first := startNginx(t, snap(epA))
	dir, opt := first.r.cfg.Dir, first.opt
	pid := first.r.MasterPID()
	// Both workers up (the second may still be starting when nginx first serves).
	var workersBefore []int
	if _, err := testenv.Poll(context.Background(), 10*time.Second, 10*time.Millisecond, func() bool {
		workersBefore = workerPIDs(t, first)
		return len(workersBefore) == first.opt.WorkerProcesses
	}); err != nil {
		t.Fatalf("workers %v, want %d", workersBefore, first.opt.WorkerProcesses)
	}
	// The first agent "crashes": it forgets its master without stopping it.
	first.r.mu.Lock()
	first.r.master = nil
	first.r.mu.Unlock()
	first.stop(t)
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("the leftover master %d is gone: %v", pid, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) }) // only if the test failed to stop it

	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	r, err := NewReloader(ReloaderConfig{Dir: dir, Render: opt, ConfirmTimeout: 10 * time.Second, StopTimeout: 10 * time.Second},
		Exec{Log: log.Named("nginx")}, log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	r.Update(snap(epB))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	second := &liveNginx{r: r, opt: opt}
	want, err := Render(snap(epB), opt)
	if err != nil {
		t.Fatal(err)
	}
	second.waitChecksum(t, want.Checksum)
	second.waitTable(t, want.Digest)
	if got := r.MasterPID(); got != pid {
		t.Errorf("master pid %d, want the adopted %d", got, pid)
	}
	// Only the endpoints changed, and the adopted master serves the text on disk:
	// no reload, the same workers (their clients' kept-alive connections stay).
	if got := workerPIDs(t, second); !slices.Equal(got, workersBefore) {
		t.Errorf("workers %v after adoption, want the same %v (no reload)", got, workersBefore)
	}
	if got := r.Checksum(); got != want.Checksum {
		t.Errorf("Checksum() %q after adoption, want %q (the agent's health reads it)", got, want.Checksum)
	}
	if resp, body := get(t, second.client(false), "http://a.test/x"); resp.StatusCode != 200 || body != "B /x" {
		t.Errorf("after adoption: %d %q, want B", resp.StatusCode, body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	for start := time.Now(); syscall.Kill(pid, 0) == nil; time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("adopted master %d still runs after shutdown", pid)
		}
	}
}

// TestServeLiveness: the liveness server answers every director's probe, many
// on one kept-alive connection, and nothing else.
func TestServeLiveness(t *testing.T) {
	n := startNginx(t, model.Snapshot{})
	c, err := net.Dial("tcp", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), n.opt.LivenessPort).String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	var body string
	ask := func(path string) int {
		t.Helper()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: portico-liveness\r\n\r\n", path)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		resp.Body.Close()
		if resp.Close {
			t.Fatalf("%s: nginx closed the kept-alive connection", path)
		}
		return resp.StatusCode
	}
	for i := 0; i < 200; i++ {
		if got := ask("/live"); got != http.StatusOK || body != "live\n" {
			t.Fatalf("probe %d: status %d, %q (want 200, \"live\" and no verdicts)", i, got, body)
		}
	}
	if got := ask("/healthz"); got != http.StatusNotFound {
		t.Errorf("/healthz on the liveness port: %d, want 404", got)
	}

	// The agent's verdicts: answered to every probe (the other edges learn
	// from them that they are called down), replaced whole, checked line by
	// line (a bad table is refused and the last good one stays).
	ctx := context.Background()
	down := []netip.Addr{netip.MustParseAddr("10.0.0.3"), netip.MustParseAddr("fd00::7"), netip.MustParseAddr("::ffff:10.0.0.4")}
	if err := n.r.PushVerdicts(ctx, down); err != nil {
		t.Fatal(err)
	}
	want := "live\ndown 10.0.0.3\ndown fd00::7\ndown 10.0.0.4\n"
	if got := ask("/live"); got != http.StatusOK || body != want {
		t.Errorf("/live with verdicts: %d %q, want 200 %q", got, body, want)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPut, verdictsURL, strings.NewReader("down 10.0.0.3\nrm -rf /\n"))
	if _, err := controlDo(n.r.ctl, req); err == nil || !strings.Contains(err.Error(), "bad line") {
		t.Errorf("a bad verdicts table: %v, want refused (bad line)", err)
	}
	if got := ask("/live"); got != http.StatusOK || body != want {
		t.Errorf("/live after a refused table: %d %q, want the last good one %q", got, body, want)
	}
	if err := n.r.PushVerdicts(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if got := ask("/live"); got != http.StatusOK || body != "live\n" {
		t.Errorf("/live with no verdicts: %d %q", got, body)
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
