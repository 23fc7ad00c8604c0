package netlab

import (
	"bufio"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/portico-edge/portico/test/testenv"
)

const sweepHelper = "PORTICO_NETLAB_SWEEP_HELPER"

// TestMain lets the sweep test run this binary as a process that makes a lab
// and is killed before it can close it.
func TestMain(m *testing.M) {
	testenv.HelperMain(m, map[string]func(string) int{sweepHelper: sweepMain})
}

// sweepMain makes a lab, prints its switch namespace and waits to be killed.
func sweepMain(string) int {
	l, err := New("pz")
	if err != nil {
		return 3
	}
	os.Stdout.WriteString(l.Switch + "\n")
	select {} // killed by the test
}

// TestSweepKilledLab: a run killed before its cleanup (a test binary's
// timeout, an ended session) leaves its namespaces; the next lab removes them,
// and never a running process's.
func TestSweepKilledLab(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	argv, err := testenv.HelperArgs()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), sweepHelper+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("helper: %v", err)
	}
	ns := strings.TrimSpace(line)
	// A running lab is left alone.
	live, err := New("py")
	if err != nil {
		t.Fatal(err)
	}
	if !hasNS(t, ns) {
		t.Errorf("%s of a running process was removed", ns)
	}
	live.Close()
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	if !hasNS(t, ns) {
		t.Fatalf("%s gone before any sweep: the test shows nothing", ns)
	}
	l, err := New("py")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if hasNS(t, ns) {
		IP("netns", "del", ns)
		t.Errorf("%s of a killed process is still there after New", ns)
	}
}

func hasNS(t *testing.T, ns string) bool {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if name, _, _ := strings.Cut(strings.TrimSpace(line), " "); name == ns {
			return true
		}
	}
	return false
}
