package nginx

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/portico-edge/portico/test/testenv"
)

// soleWorker waits for m's one worker process and returns its pid.
func soleWorker(tb testing.TB, m Master) int {
	tb.Helper()
	var pid int
	testenv.Eventually(tb, 10*time.Second, func() string {
		ws, err := m.Workers()
		if err != nil {
			return err.Error()
		}
		var live []int
		for _, w := range ws {
			if !w.ShuttingDown {
				live = append(live, w.PID)
			}
		}
		if len(live) != 1 {
			return fmt.Sprintf("workers %v, want one", live)
		}
		pid = live[0]
		return ""
	})
	return pid
}

// pin binds pid to cpu (-1: leaves it alone).
func pin(tb testing.TB, pid, cpu int) {
	tb.Helper()
	if cpu < 0 {
		return
	}
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(pid, &set); err != nil {
		tb.Fatalf("pin %d to CPU %d: %v", pid, cpu, err)
	}
}

// cpuTime is the CPU time pid has run (/proc/<pid>/schedstat, in nanoseconds).
func cpuTime(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		tb.Fatalf("schedstat of %d: %q", pid, b)
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ns)
}
