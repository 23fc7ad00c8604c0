package liveness

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/portico-edge/portico/test/testenv"
)

// slowNginx runs a real nginx whose workers take startDelay to start (as on a
// loaded node, where a reload's new workers took 250–400 ms to run), serving
// Path on addr:port as a replica's liveness server does. It returns the
// master's PID file.
func slowNginx(t *testing.T, addr netip.Addr, port int, startDelay time.Duration) string {
	t.Helper()
	bin := ""
	for _, p := range []string{"/usr/sbin/nginx", "/usr/local/sbin/nginx"} {
		if _, err := os.Stat(p); err == nil {
			bin = p
		}
	}
	mods := "/usr/lib/nginx/modules"
	if _, err := os.Stat(filepath.Join(mods, "ngx_http_lua_module.so")); err != nil || bin == "" {
		t.Skip("needs nginx with Debian's Lua module (make deps)")
	}
	dir := t.TempDir()
	pid := filepath.Join(dir, "nginx.pid")
	conf := fmt.Sprintf(`load_module %[1]s/ndk_http_module.so;
load_module %[1]s/ngx_http_lua_module.so;
worker_processes 2;
pid %[2]s;
error_log %[3]s/error.log warn;
events { worker_connections 64; }
http {
    access_log off;
    client_body_temp_path %[3]s/body;
    proxy_temp_path %[3]s/proxy;
    fastcgi_temp_path %[3]s/fastcgi;
    uwsgi_temp_path %[3]s/uwsgi;
    scgi_temp_path %[3]s/scgi;
    init_worker_by_lua_block { os.execute("sleep %[4]s") }
    server {
        listen %[5]s;
        keepalive_requests 1000000;
        keepalive_timeout 75s;
        location = /live { return 200 "live\n"; }
    }
}
`, mods, pid, dir, strconv.FormatFloat(startDelay.Seconds(), 'f', 3, 64), netip.AddrPortFrom(addr, uint16(port)))
	cf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-p", dir+"/", "-c", cf, "-e", filepath.Join(dir, "error.log"), "-g", "daemon off;")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})
	return pid
}

// signalNginx sends sig to the master named in the PID file.
func signalNginx(t *testing.T, pidFile string, sig syscall.Signal) {
	t.Helper()
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		t.Fatal(err)
	}
}

// TestCheckerHoldsThroughReload: a real nginx reloaded while its new workers
// take twice DeadAfter to start stays live with the reload grace (and goes
// dead without it: the verdict every edge used to reach at every reload),
// while an nginx that stops is still out within DeadAfter's bound.
func TestCheckerHoldsThroughReload(t *testing.T) {
	const delay = 400 * time.Millisecond
	for _, tc := range []struct {
		name  string
		grace time.Duration
	}{{"grace", DefaultTiming.ReloadGrace}, {"no-grace", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			port := testenv.Ports(t, 1)[0]
			a := netip.MustParseAddr("127.0.0.2")
			pidFile := slowNginx(t, a, int(port), delay)
			timing := DefaultTiming
			timing.ReloadGrace = tc.grace
			c, _ := startChecker(t, Config{Port: port, Timing: timing})
			c.SetTargets([]netip.Addr{a}, noneLocal)
			// The first start is slow too: wait until it serves and is live.
			deadline := time.Now().Add(10 * time.Second)
			for testutil.ToFloat64(c.met.probes.WithLabelValues(string(OK))) < 10 || len(c.Dead()) > 0 {
				if time.Now().After(deadline) {
					t.Fatalf("nginx not live after 10 s: dead %v", c.Dead())
				}
				time.Sleep(10 * time.Millisecond)
			}
			before := testutil.ToFloat64(c.met.transitions.WithLabelValues("dead"))
			signalNginx(t, pidFile, syscall.SIGHUP)
			// Watch for 3 s: the reload, its slow workers and a margin.
			went := false
			for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
				if len(c.Dead()) > 0 {
					went = true
				}
			}
			deaths := testutil.ToFloat64(c.met.transitions.WithLabelValues("dead")) - before
			holds := testutil.ToFloat64(c.met.holds)
			t.Logf("reload with workers starting in %v, grace %v: %v deaths, %v holds", delay, tc.grace, deaths, holds)
			if tc.grace > 0 {
				if went || deaths > 0 {
					t.Fatalf("a reloading nginx was called dead (%v times) with a %v grace", deaths, tc.grace)
				}
				if holds < 1 {
					t.Fatal("no probe was held through the reload")
				}
				// A stopped nginx is still out at once: nothing listens.
				signalNginx(t, pidFile, syscall.SIGTERM)
				took := waitDead(t, c, []netip.Addr{a}, 2*time.Second)
				t.Logf("stopped nginx called dead %v after the signal", took.Round(time.Millisecond))
				// DeadAfter after its last answer, with room for a loaded
				// machine, and well under the grace it must not wait out.
				if limit := tc.grace * 7 / 10; took > limit {
					t.Errorf("a stopped nginx took %v to be called dead, want under %v (the grace must not delay it)", took, limit)
				}
				return
			}
			if !went {
				t.Fatal("without a grace the reloading nginx stayed live: the test does not show what the grace does")
			}
		})
	}
}
