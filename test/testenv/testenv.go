// Package testenv is what Portico's tests share about where they run: a test that
// needs root, a program or a server the machine lacks skips, except in CI, where
// hack/deps.sh has installed everything and the tests run as root, so a
// missing requirement fails it instead; tests wait for what happens
// asynchronously by polling for it (Poll), never by reading it once; they pick
// their servers' ports with FreePorts; and a test binary runs as its own tests'
// child processes with HelperMain.
package testenv

import (
	"context"
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
		t.Fatalf("%s (CI is set: hack/deps.sh installs everything, and CI runs as root)", msg)
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

// A Condition is what Poll waits for: a func() bool holds when it returns true; a
// func() error holds when it returns nil, and its error says why it does not yet.
type Condition interface {
	func() bool | func() error
}

// Poll checks cond at once and then every interval until it holds, timeout has
// passed or ctx is done. It returns how long that took and nil once cond holds;
// otherwise cond's last error (for a func() error), or that it did not hold in
// time, or ctx's error.
func Poll[C Condition](ctx context.Context, timeout, interval time.Duration, cond C) (time.Duration, error) {
	check := func() error {
		switch c := any(cond).(type) {
		case func() error:
			return c()
		case func() bool:
			if c() {
				return nil
			}
		}
		return fmt.Errorf("not within %s", timeout)
	}
	start := time.Now()
	for {
		err := check()
		if err == nil {
			return time.Since(start), nil
		}
		if time.Since(start) >= timeout {
			return time.Since(start), err
		}
		select {
		case <-ctx.Done():
			return time.Since(start), fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-time.After(interval):
		}
	}
}

// Eventually polls check every 25 ms until it returns "", and fails t with check's
// last message once timeout has passed.
func Eventually(t testing.TB, timeout time.Duration, check func() string) {
	t.Helper()
	var msg string
	if _, err := Poll(context.Background(), timeout, 25*time.Millisecond, func() bool { msg = check(); return msg == "" }); err != nil {
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
func FreePorts(n int) ([]uint16, error) {
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
	ports := make([]uint16, 0, n)
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
		ports = append(ports, uint16(p))
	}
	return ports, nil
}

// firstFreePort is the lowest port FreePorts hands out: above the well-known and
// most registered services' ports.
const firstFreePort = 10000

// Ports is FreePorts for a test: it fails t when there are not n.
func Ports(t testing.TB, n int) []uint16 {
	t.Helper()
	ps, err := FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

// HelperMain is the TestMain of a test binary that is also its tests' child
// processes. A test starts one with HelperArgs and one of helpers' environment
// variables set; HelperMain then runs that helper with the variable's value and
// exits with its code. Without any of them set, it runs the tests.
func HelperMain(m *testing.M, helpers map[string]func(value string) int) {
	for env, main := range helpers {
		if v := os.Getenv(env); v != "" {
			os.Exit(main(v))
		}
	}
	os.Exit(m.Run())
}

// HelperArgs is the command line that starts this test binary as a child process
// that runs no test: a helper, when the variable HelperMain knows it by is set.
func HelperArgs() ([]string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find the test binary: %w", err)
	}
	return []string{exe, "-test.run=^$"}, nil
}
