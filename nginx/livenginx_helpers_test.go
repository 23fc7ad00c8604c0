package nginx

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/testenv"
)

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

// master is the Reloader's running master.
func (n *liveNginx) master(tb testing.TB) Master {
	tb.Helper()
	n.r.mu.Lock()
	defer n.r.mu.Unlock()
	if n.r.master == nil {
		tb.Fatal("no nginx master")
	}
	return n.r.master
}
