package controlplane

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/portico-edge/portico/test/testenv"
)

// TestIntegrationLeaderStopsWithAPIDown: a leader whose API server has become
// unreachable stops within its own release's bound (2 s) and the informers'
// (1 s) once ctx ends, with the agents' lease timings (15 s, renew deadline
// 10 s). client-go's release (ReleaseOnCancel) waited up to the renew deadline
// for a Lease it could not read, and its reflectors sleep out a watch's backoff
// whatever their context (internal/shutdown): an agent whose site's API server
// was down took more than 10 s to exit on SIGTERM (CI, test/lab/sites
// TestSiteFailures).
func TestIntegrationLeaderStopsWithAPIDown(t *testing.T) {
	e := newEnv(t)
	srv := apiserver.Get(t)
	p := startCutProxy(t, srv.Config.Host)
	cfg := rest.CopyConfig(srv.Config)
	cfg.Host = "https://" + p.addr
	r := e.start(func(c *Config) {
		c.Client, c.Dynamic = kubernetes.NewForConfigOrDie(cfg), dynamic.NewForConfigOrDie(cfg)
		c.LeaseDuration, c.RenewDeadline, c.RetryPeriod = 15*time.Second, 10*time.Second, 2*time.Second
	})
	testenv.Eventually(t, converge, func() string {
		if !r.ctl.IsLeader() {
			return "not leader yet"
		}
		return ""
	})
	p.cut()
	// The renewals fail, and the reflectors' backoffs grow (0.8 s, doubled
	// at each failure, jittered).
	time.Sleep(8 * time.Second)
	start := time.Now()
	r.stop()
	took := time.Since(start)
	t.Logf("Run returned %v after ctx ended, the API server unreachable for 8 s", took.Round(time.Millisecond))
	if took > 4*time.Second {
		t.Errorf("Run returned %v after ctx ended, want within the release's 2 s and the informers' 1 s (and some slack)", took.Round(time.Millisecond))
	}
}

// cutProxy forwards TCP connections to an API server until cut: then it
// resets the ones it carries and refuses new ones (its listener closed), as a
// stopped API server does.
type cutProxy struct {
	addr  string
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func startCutProxy(t *testing.T, host string) *cutProxy {
	t.Helper()
	u, err := url.Parse(host)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{addr: ln.Addr().String(), ln: ln}
	t.Cleanup(p.cut)
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", u.Host)
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			go func() { io.Copy(out, in); out.Close() }()
			go func() { io.Copy(in, out); in.Close() }()
		}
	}()
	return p
}

func (p *cutProxy) cut() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0) // a reset, not a FIN
		}
		c.Close()
	}
	p.conns = nil
}
