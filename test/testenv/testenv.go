// Package testenv is what Portico's tests share about where they run: a test that
// needs root, a program or a server the machine lacks skips, except in CI, where
// test/setup/deps.sh has installed everything and the tests run as root, so a
// missing requirement fails it instead; and tests wait for what happens
// asynchronously by polling for it, never by reading it once.
package testenv

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// CI reports whether the tests run in CI: the environment variable CI is set, and
// not to "false".
func CI() bool {
	ci := os.Getenv("CI")
	return ci != "" && ci != "false"
}

// Unavailable skips t because something it needs is missing, or fails it in CI.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if CI() {
		t.Fatalf("%s (CI is set: test/setup/deps.sh installs everything, and CI runs as root)", msg)
	}
	t.Skip(msg)
}

// RequireRoot skips t (fails it in CI) unless the process runs as root; needs says
// what for.
func RequireRoot(t testing.TB, needs string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "needs root: %s", needs)
	}
}

// RequireProgram returns the path of program, or skips t (fails it in CI) when it
// is not installed.
func RequireProgram(t testing.TB, program string) string {
	t.Helper()
	p, err := exec.LookPath(program)
	if err != nil {
		Unavailable(t, "%s is not installed", program)
	}
	return p
}

// Until calls cond every interval until it holds or timeout has passed. It
// returns how long that took and whether cond held.
func Until(timeout, interval time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for {
		if cond() {
			return time.Since(start), true
		}
		if time.Since(start) >= timeout {
			return time.Since(start), false
		}
		time.Sleep(interval)
	}
}

// Eventually calls check every 25 ms until it returns "", and fails t with check's
// last message once timeout has passed.
func Eventually(t testing.TB, timeout time.Duration, check func() string) {
	t.Helper()
	var msg string
	if _, ok := Until(timeout, 25*time.Millisecond, func() bool { msg = check(); return msg == "" }); !ok {
		t.Fatalf("not reached after %s: %s", timeout, msg)
	}
}

// BenchTrials gates a lab benchmark: it skips t unless the environment variable
// gate is set (make says how to run it), and returns the number of trials,
// PORTICO_BENCH_TRIALS (1 to 100, default 10).
func BenchTrials(t testing.TB, gate, target string) int {
	t.Helper()
	if os.Getenv(gate) == "" {
		t.Skipf("benchmark: run with make %s (%s=1)", target, gate)
	}
	s := os.Getenv("PORTICO_BENCH_TRIALS")
	if s == "" {
		return 10
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 100 {
		t.Fatalf("PORTICO_BENCH_TRIALS=%q: want 1 to 100", s)
	}
	return n
}

// FreePorts returns n distinct ports on which nothing listened a moment ago, for
// TCP and UDP on every address. They come from below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), never from it: a port the kernel hands out
// ("127.0.0.1:0") is also what it hands the next outgoing connection of any
// process, so a server started on it a moment later can find it taken (a BGP
// test's listener did, in CI beside the other packages' tests). Below that range
// only another test's explicit listener can take it, and those pick at random too.
func FreePorts(n int) ([]int, error) {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var lo, hi int
		if _, err := fmt.Sscan(string(b), &lo, &hi); err == nil && lo > firstFreePort+1000 {
			low = lo
		}
	}
	var held []io.Closer
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	ports := make([]int, 0, n)
	for tries := 0; len(ports) < n; tries++ {
		if tries == 1000 {
			return nil, fmt.Errorf("no free port in %d to %d after %d tries", firstFreePort, low-1, tries)
		}
		p := firstFreePort + rand.IntN(low-firstFreePort)
		l, err := net.Listen("tcp", ":"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		held = append(held, l)
		u, err := net.ListenPacket("udp", ":"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		held = append(held, u)
		ports = append(ports, p)
	}
	return ports, nil
}

// firstFreePort is the lowest port FreePorts hands out: above the well-known and
// most registered services' ports.
const firstFreePort = 10000

// FreePort is FreePorts(1) for a test: it fails t when there is none.
func FreePort(t testing.TB) int {
	t.Helper()
	ps, err := FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	return ps[0]
}
