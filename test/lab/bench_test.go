package lab

import (
	"context"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"
)

// TestFailoverBench measures repeated director failovers (make bench-lab; not in
// make test): the client-visible outage from kill -9 of the owner's agent (and its
// link cut) to the first reply through the VIP, and how many long-lived
// connections on surviving replicas kept working.
func TestFailoverBench(t *testing.T) {
	if os.Getenv("PORTICO_BENCH_LAB") == "" {
		t.Skip("set PORTICO_BENCH_LAB=1 (make bench-lab)")
	}
	trials := 10
	if n, err := strconv.Atoi(os.Getenv("PORTICO_BENCH_TRIALS")); err == nil && n > 0 {
		trials = n
	}
	l := startLab(t)
	ctx := context.Background()
	var outages []time.Duration
	conns, survived := 0, 0
	for i := range trials {
		res, down, err := l.Failover(ctx, "echo.lab", 200)
		if err != nil {
			t.Fatalf("trial %d: %v", i+1, err)
		}
		t.Logf("trial %2d: %s -> %s  outage %4dms  connections kept %d/%d", i+1, res.Old, res.New, res.Outage.Milliseconds(), res.Survived, res.Conns)
		outages = append(outages, res.Outage)
		conns += res.Conns
		survived += res.Survived
		if err := l.Restore(down); err != nil {
			t.Fatalf("trial %d: %v", i+1, err)
		}
	}
	slices.Sort(outages)
	t.Logf("failover outage over %d trials: min %v  median %v  p90 %v  max %v",
		trials, outages[0], outages[len(outages)/2], outages[len(outages)*9/10], outages[len(outages)-1])
	t.Logf("connections on surviving replicas kept working: %d of %d (%.2f%%)", survived, conns, 100*float64(survived)/float64(conns))
}
