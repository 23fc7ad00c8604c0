package nginx

import (
	"fmt"
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
	d, ok := schedCPU(pid)
	if !ok {
		tb.Fatalf("no CPU time of process %d", pid)
	}
	return d
}
