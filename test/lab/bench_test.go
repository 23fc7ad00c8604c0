package lab

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/portico-edge/portico/test/testenv"

	"github.com/portico-edge/portico/test/traffic"
)

// TestFailoverBench measures repeated edge deaths (make bench-lab; not in make
// test): kill -9 of an edge's agent and a cut of its link, first of the VIP
// owner, then of another edge, with a stream of new connections (one every
// 5 ms, 500 ms to answer) and long-lived connections running. For each it
// reports the VRRP outage (kill to the first reply through the VIP), when the
// last failed new connection started after the fault, how many failed, and how
// many long-lived connections on surviving replicas kept working.
func TestFailoverBench(t *testing.T) {
	trials := testenv.BenchTrials(t, "PORTICO_BENCH_LAB", "bench-lab")
	l := startLab(t)
	ctx := context.Background()
	for _, kind := range []string{"owner", "non-owner"} {
		var outages, lasts []time.Duration
		conns, survived, failed, total := 0, 0, 0, 0
		for i := range trials {
			victim, err := l.Owner()
			if err == nil && kind == "non-owner" {
				victim, err = l.NonOwner()
			}
			if err != nil {
				t.Fatalf("%s trial %d: %v", kind, i+1, err)
			}
			stream := l.StartStream(ctx, "echo.lab", traffic.StreamOptions{})
			time.Sleep(300 * time.Millisecond)
			res, err := l.EdgeDeath(ctx, victim, "echo.lab", 200)
			if err != nil {
				stream.Stop()
				t.Fatalf("%s trial %d: %v", kind, i+1, err)
			}
			time.Sleep(1500 * time.Millisecond)
			f := traffic.FailuresAround(stream.Stop(), res.Fault)
			t.Logf("%s trial %2d: %s dies (owner %s -> %s)  outage %4dms  last failed new connection %4dms  failed %d/%d  connections kept %d/%d",
				kind, i+1, victim.Name, res.Old, res.New, res.Outage.Milliseconds(), f.Last.Milliseconds(), f.Failed, f.Total, res.Survived, res.Conns)
			outages = append(outages, res.Outage)
			lasts = append(lasts, f.Last)
			conns += res.Conns
			survived += res.Survived
			failed += f.Failed
			total += f.Total
			if err := l.Restore(victim); err != nil {
				t.Fatalf("%s trial %d: %v", kind, i+1, err)
			}
		}
		slices.Sort(outages)
		slices.Sort(lasts)
		q := func(d []time.Duration, p int) time.Duration { return d[(len(d)-1)*p/100].Round(time.Millisecond) }
		t.Logf("%s death over %d trials: outage min %v  median %v  p90 %v  max %v", kind, trials, q(outages, 0), q(outages, 50), q(outages, 90), q(outages, 100))
		t.Logf("%s death: last failed new connection after the fault: median %v  max %v; failed new connections %d of %d (%.2f%%)",
			kind, q(lasts, 50), q(lasts, 100), failed, total, 100*float64(failed)/float64(max(total, 1)))
		t.Logf("%s death: connections on surviving replicas kept working: %d of %d (%.2f%%)", kind, survived, conns, 100*float64(survived)/float64(max(conns, 1)))
	}
}
