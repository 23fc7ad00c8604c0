package gslb

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/portico-edge/portico/test/testenv"
)

// startUnbound runs Debian's unbound on a loopback port as a caching resolver
// whose only zone, example.test, is a stub to server; it returns its address.
func startUnbound(t *testing.T, server string) string {
	t.Helper()
	bin, err := exec.LookPath("unbound")
	if err != nil {
		if _, statErr := os.Stat("/usr/sbin/unbound"); statErr != nil {
			testenv.Unavailable(t, "unbound is not installed (hack/deps.sh installs it)")
		}
		bin = "/usr/sbin/unbound"
	}
	// The port is found free and released, so another process may take it
	// before unbound binds it: then unbound exits, and another port is tried.
	for try := 1; ; try++ {
		addr, exited := runUnbound(t, bin, server)
		c := &dns.Client{Timeout: 500 * time.Millisecond}
		if _, err := testenv.Poll(context.Background(), 10*time.Second, 100*time.Millisecond, func() bool {
			select {
			case <-exited:
				return true
			default:
			}
			m := new(dns.Msg)
			m.SetQuestion("shop.example.test.", dns.TypeA)
			r, _, err := c.Exchange(m, addr)
			return err == nil && r.Rcode == dns.RcodeSuccess
		}); err == nil {
			select {
			case <-exited:
				if try < 3 {
					continue
				}
				t.Fatalf("unbound exited %d times at start", try)
			default:
				return addr
			}
		}
		t.Fatalf("unbound on %s did not answer within 10 s", addr)
	}
}

// runUnbound starts unbound on a free port; exited closes when it ends.
func runUnbound(t *testing.T, bin, server string) (string, <-chan struct{}) {
	t.Helper()
	pc, tl := listenDNS(t)
	port := pc.LocalAddr().(*net.UDPAddr).Port
	pc.Close()
	tl.Close()
	dir := t.TempDir()
	host, sport, _ := net.SplitHostPort(server)
	conf := fmt.Sprintf(`server:
  interface: 127.0.0.1
  port: %d
  do-daemonize: no
  username: ""
  chroot: ""
  directory: %q
  pidfile: %q
  use-syslog: no
  logfile: ""
  verbosity: 1
  num-threads: 1
  so-reuseport: no
  do-ip6: no
  access-control: 127.0.0.0/8 allow
  do-not-query-localhost: no
  module-config: "iterator"
  qname-minimisation: no
  domain-insecure: "example.test"
  # .test is a special-use name (RFC 6761) that unbound answers itself by default.
  local-zone: "test." nodefault
stub-zone:
  name: "example.test"
  stub-addr: %s@%s
`, port, dir, filepath.Join(dir, "unbound.pid"), host, sport)
	cf := filepath.Join(dir, "unbound.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-d", "-c", cf)
	out, err := os.Create(filepath.Join(dir, "unbound.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start unbound: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			b, _ := os.ReadFile(out.Name())
			t.Logf("unbound log:\n%s", b)
		}
	})
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), exited
}

// resolve asks the resolver for shop.example.test's A records.
func resolve(t *testing.T, resolver string) []string {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion("shop.example.test.", dns.TypeA)
	r, _, err := (&dns.Client{Timeout: time.Second}).Exchange(m, resolver)
	if err != nil {
		t.Fatalf("resolve through %s: %v", resolver, err)
	}
	return answerAddrs(r)
}

// TestThroughUnbound: clients behind a caching resolver (Debian's unbound) move to
// another site within the detection time plus the TTL, and never get an empty
// answer.
func TestThroughUnbound(t *testing.T) {
	const interval, ttl = 200 * time.Millisecond, 2 * time.Second
	f := startFederation(t, interval, ttl)
	a := f.sites["a"]
	resolver := startUnbound(t, a.dns)
	if got := resolve(t, resolver); len(got) != 1 || got[0] != "192.0.2.1" {
		t.Fatalf("through unbound: %v, want site a (no locality for the resolver's address)", got)
	}
	// Site a goes unhealthy by its own report; the resolver's cached answer lasts
	// at most the TTL.
	a.ok.Store(false)
	start := time.Now()
	var got []string
	// FailAfter rounds (each an interval, or longer while a probe takes up to
	// probeTimeout), a round's skew, the TTL, slack.
	bound := 3*(interval+probeTimeout) + interval + ttl + time.Second
	if _, err := testenv.Poll(context.Background(), bound+5*time.Second, 50*time.Millisecond, func() bool {
		got = resolve(t, resolver)
		return len(got) == 1 && got[0] == "192.0.2.2"
	}); err != nil {
		t.Fatalf("through unbound: %v after %v, want site b", got, time.Since(start))
	}
	took := time.Since(start)
	t.Logf("site a unhealthy: clients behind unbound sent to b after %v (bound %v: 3 probe rounds of %v, up to %v each, + TTL %v)",
		took.Round(time.Millisecond), bound, interval, interval+probeTimeout, ttl)
	if took > bound {
		t.Errorf("failover through the resolver took %v, more than the bound %v", took, bound)
	}
	// Every site unhealthy: never an empty answer.
	f.sites["b"].ok.Store(false)
	f.sites["c"].ok.Store(false)
	time.Sleep(5*interval + ttl)
	empty := 0
	for i := 0; i < 20; i++ {
		if len(resolve(t, resolver)) == 0 {
			empty++
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := resolve(t, resolver); len(got) != 3 || empty > 0 {
		t.Errorf("no site healthy: through unbound %v (%d of 20 answers empty), want every site's address", got, empty)
	}
}
