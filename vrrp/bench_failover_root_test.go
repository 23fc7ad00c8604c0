package vrrp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/portico-edge/portico/test/testenv"
)

// TestFailoverBench measures the client-visible outage when the Master dies:
// from the kill to the first echo reply from the VIP, probing every millisecond,
// for Portico and keepalived (both VRRP v3) at several advert intervals. It runs
// only from `make bench-failover` (PORTICO_BENCH_FAILOVER=1).
//
// "The Master dies" means its switch port goes down (the node drops off the
// segment, as on a power loss) and its announcer gets SIGKILL; with the port up,
// the killed node would keep answering for the VIP it still holds.
func TestFailoverBench(t *testing.T) {
	trials := testenv.BenchTrials(t, "PORTICO_BENCH_FAILOVER", "bench-failover")
	requireLab(t)
	testenv.RequireProgram(t, "keepalived")
	intervals := []time.Duration{time.Second, 100 * time.Millisecond, 20 * time.Millisecond}
	impls := []string{"portico", "keepalived"}
	t.Logf("client-visible outage, kill → first reply from the VIP (1 ms probes), %d trials each", trials)
	t.Logf("%-7s %-11s %-9s %-9s %-8s %s", "advert", "impl", "median", "worst", "failed", "paired Δ vs keepalived (median)")
	retries := 0
	defer func() { t.Logf("disturbed measurements repeated: %d", retries) }()
	for _, iv := range intervals {
		// outs[impl][trial]; -1 marks a failed trial.
		outs := map[string][]time.Duration{}
		for i := range trials {
			// Trial i kills the Master at the same point of its advert cycle
			// for both implementations, one right after the other, so each
			// pair sees the same phase and about the same machine load.
			phase := (float64(i) + 0.5) / float64(trials)
			for _, impl := range impls {
				d := time.Duration(-1)
				// A disturbed measurement is repeated, at most twice.
				for attempt := 0; attempt < 3 && d < 0; attempt++ {
					t.Run(fmt.Sprintf("%v/%s/%d", iv, impl, i), func(t *testing.T) {
						out, err := failoverTrial(t, impl, iv, phase)
						switch {
						case errors.Is(err, errDisturbed):
							t.Logf("outage %v, not counted: %v", out, err)
							retries++
						case err != nil:
							t.Error(err)
							attempt = 3
						default:
							t.Logf("outage %v", out)
							d = out
						}
					})
				}
				outs[impl] = append(outs[impl], d)
			}
		}
		var diffs []time.Duration
		for i := range trials {
			if p, k := outs["portico"][i], outs["keepalived"][i]; p >= 0 && k >= 0 {
				diffs = append(diffs, p-k)
			}
		}
		slices.Sort(diffs)
		for _, impl := range impls {
			var ok []time.Duration
			for _, d := range outs[impl] {
				if d >= 0 {
					ok = append(ok, d)
				}
			}
			if len(ok) == 0 {
				t.Errorf("%v %s: every trial failed", iv, impl)
				continue
			}
			slices.Sort(ok)
			med, worst := median(ok), ok[len(ok)-1]
			delta := ""
			if impl == "portico" && len(diffs) > 0 {
				delta = fmt.Sprintf("%+.1fms", float64(median(diffs))/float64(time.Millisecond))
			}
			t.Logf("%-7v %-11s %-9v %-9v %-8d %s", iv, impl, med.Round(time.Millisecond), worst.Round(time.Millisecond), trials-len(ok), delta)
			if impl == "portico" && iv == 20*time.Millisecond && med > 100*time.Millisecond {
				t.Errorf("at 20ms adverts Portico's median outage %v is over the 100ms target", med)
			}
			if impl == "portico" && iv == 20*time.Millisecond && worst > 100*time.Millisecond {
				t.Logf("note: at 20ms adverts Portico's worst outage %v is over 100ms", worst)
			}
		}
		// "No worse than keepalived": the median of the paired differences,
		// within the resolution of the two 1 ms probe trains.
		if len(diffs) > 0 && median(diffs) > benchTolerance {
			t.Errorf("at %v Portico is %v slower than keepalived (median of paired trials; tolerance %v)", iv, median(diffs), benchTolerance)
		}
	}
}

// benchTolerance is how much slower than keepalived Portico may be, in the
// median of paired trials, and still count as no worse: one probe interval for
// each of the two measurements.
const benchTolerance = 2 * time.Millisecond

// errDisturbed marks a trial whose measurement lost its 1 ms resolution.
var errDisturbed = errors.New("measurement disturbed")

func median(sorted []time.Duration) time.Duration {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// failoverTrial builds a fresh two-node lab, lets the first node win, kills it
// phase×interval after one of its adverts and returns the outage the client saw.
func failoverTrial(t *testing.T, impl string, interval time.Duration, phase float64) (time.Duration, error) {
	l := newLab(t, 2)
	var kill func()
	switch impl {
	case "portico":
		ic := labInstance(100, interval)
		l.startPortico(l.nodes[1], ic)
		ic.Priority = 200
		p := l.startPortico(l.nodes[0], ic)
		kill = func() { p.signal(syscall.SIGKILL) }
	case "keepalived":
		l.startKeepalived(l.nodes[1], 3, 100, interval)
		k := l.startKeepalived(l.nodes[0], 3, 200, interval)
		kill = k.kill
	}
	limit := 5*interval + 5*time.Second
	l.electAndHold(l.nodes[0], limit, 0)

	// The prober runs until SIGTERM, at most for a generous bound.
	out := filepath.Join(l.dir, "probe.json")
	argv, err := testenv.HelperArgs()
	if err != nil {
		return 0, err
	}
	// The prober is the instrument: it runs SCHED_FIFO so machine load cannot
	// stall its 1 ms train. The announcers under test keep normal priority.
	if chrt, err := exec.LookPath("chrt"); err == nil {
		argv = append([]string{chrt, "-f", "10"}, argv...)
	}
	probe := l.start("probe", l.client, []string{envProbe + "=" + l.vip.String() + "," + out + "," + (limit + 10*time.Second).String()}, argv...)
	time.Sleep(200 * time.Millisecond) // warm up: neighbour entry, replies flowing

	swh, err := netns.GetFromName(l.sw)
	if err != nil {
		return 0, err
	}
	defer swh.Close()
	nl, err := netlink.NewHandleAt(swh)
	if err != nil {
		return 0, err
	}
	defer nl.Close()
	port, err := nl.LinkByName(l.nodes[0].port)
	if err != nil {
		return 0, err
	}
	adverts, err := listenInNS(l.client.ns)
	if err != nil {
		return 0, err
	}
	defer adverts.close()
	if err := waitAdvertFrom(adverts, l.nodes[0].addr, 3*interval+time.Second); err != nil {
		return 0, err
	}
	time.Sleep(time.Duration(phase * float64(interval)))
	killedAt := time.Now()
	if err := nl.LinkSetDown(port); err != nil {
		return 0, err
	}
	deadAt := time.Now()
	kill()
	if _, err := testenv.Poll(context.Background(), limit, 2*time.Millisecond, func() bool { return l.hasVIP(l.nodes[1]) }); err != nil {
		return 0, fmt.Errorf("n1 never took over")
	}
	time.Sleep(300 * time.Millisecond) // replies after the takeover
	probe.signal(syscall.SIGTERM)
	if !probe.wait(5 * time.Second) {
		return 0, fmt.Errorf("prober did not stop")
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return 0, fmt.Errorf("read probe results: %w", err)
	}
	var res probeResult
	if err := json.Unmarshal(b, &res); err != nil {
		return 0, fmt.Errorf("parse probe results: %w", err)
	}
	warm := false
	for i, s := range res.Sent {
		if s < killedAt.UnixNano() && res.Recv[i] != 0 {
			warm = true
		}
		// Only probes sent once the old Master was off the segment count.
		if s > deadAt.UnixNano() && res.Recv[i] != 0 {
			if !warm {
				return 0, fmt.Errorf("no replies before the kill: the probe never worked")
			}
			outage := time.Duration(res.Recv[i] - killedAt.UnixNano())
			// The figure is only good to 1 ms if the probe train kept its pace
			// and the port went down at once; on a starved machine it may not.
			if d := deadAt.Sub(killedAt); d > 2*time.Millisecond {
				return outage, fmt.Errorf("%w: taking the port down took %v", errDisturbed, d)
			}
			var gap int64
			for j := i; j > 0 && res.Sent[j] > killedAt.UnixNano(); j-- {
				gap = max(gap, res.Sent[j]-res.Sent[j-1])
			}
			if g := time.Duration(gap); g > 5*time.Millisecond {
				return outage, fmt.Errorf("%w: the probe train stalled for %v", errDisturbed, g)
			}
			return outage, nil
		}
	}
	return 0, fmt.Errorf("no reply after the kill among %d probes", len(res.Sent))
}

// listenInNS opens a VRRP socket on eth0 inside namespace ns.
func listenInNS(ns string) (*advertConn, error) {
	var c *advertConn
	err := inNS(ns, func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		c, err = listenAdverts(ifi, true)
		return err
	})
	return c, err
}

// inNS runs fn on a thread inside namespace ns; sockets fn opens stay in ns.
func inNS(ns string, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return err
	}
	defer orig.Close()
	h, err := netns.GetFromName(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	if err := netns.Set(h); err != nil {
		return err
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic(fmt.Sprintf("return to the original namespace: %v", err))
		}
	}()
	return fn()
}

// waitAdvertFrom returns when an advert from src arrives.
func waitAdvertFrom(c *advertConn, src netip.Addr, limit time.Duration) error {
	buf := make([]byte, 1500)
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		r, err := c.recv(buf, deadline)
		if err != nil {
			return fmt.Errorf("wait for an advert from %v: %w", src, err)
		}
		if r.src == src {
			return nil
		}
	}
	return fmt.Errorf("no advert from %v within %v", src, limit)
}
