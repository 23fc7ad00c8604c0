package lab

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/portico-edge/portico/test/netlab"
	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

// TestBGPOutageBench measures edge deaths in BGP mode (make bench-bgp; not in make
// test), for BFD at 50 ms x 3, 300 ms x 3 and without BFD (hold timer 3 s): per
// trial, an edge's link is cut and its agent killed (-9) while long-lived
// connections are held and new ones keep coming; then the edge comes back. It
// reports how long the dead edge's next hop stayed in the router's route (the
// outage for the flows the router sent it), the share of the surviving edges'
// flows the router moved on the removal and of all flows on the re-add (its
// ECMP choice for 300 source ports, asked with ip route get), and the
// connections broken.
func TestBGPOutageBench(t *testing.T) {
	trials := testenv.BenchTrials(t, "PORTICO_BENCH_BGP", "bench-bgp")
	for _, bfd := range []time.Duration{50 * time.Millisecond, 300 * time.Millisecond, 0} {
		name := "BFD " + bfd.String() + " x 3"
		if bfd == 0 {
			name = "no BFD (hold 3s)"
		}
		t.Run(fmt.Sprint(bfd), func(t *testing.T) {
			l := startBGPLab(t, bfd)
			ctx := context.Background()
			victim := l.Edges[len(l.Edges)-1]
			var outages []time.Duration
			var movedOut, movedBack []float64
			broken, held, failed, total := 0, 0, 0, 0
			choices := func() map[uint16]netip.Addr {
				out, err := l.Router.Choices(20000, 300)
				if err != nil {
					t.Fatal(err)
				}
				return out
			}
			for i := range trials {
				conns, err := l.OpenKeepConns(ctx, "echo.lab", 90)
				if err != nil {
					t.Fatal(err)
				}
				stream := l.StartStream(ctx, "echo.lab", traffic.StreamOptions{})
				time.Sleep(300 * time.Millisecond)
				before := choices()
				// A silent death: the link is cut first, so the killed speaker's
				// socket closes without a word reaching the router (TestBGPEveryEdge
				// kills first: its FIN ends the session at once).
				fault := time.Now()
				if err := netlab.IP("-n", victim.NS, "link", "set", "eth0", "down"); err != nil {
					t.Fatal(err)
				}
				if err := l.Agent(l.EdgeNo(victim)).Kill(syscall.SIGKILL, 5*time.Second); err != nil {
					t.Fatal(err)
				}
				gone, err := l.Router.waitGone(victim, len(l.Edges), fault, 20*time.Second)
				if err != nil {
					t.Fatalf("trial %d: %v", i+1, err)
				}
				after := choices()
				moved, survivors := 0, 0
				for sport, a := range before {
					if a != victim.Addr.Addr() {
						survivors++
						if after[sport] != a {
							moved++
						}
					}
				}
				time.Sleep(1500 * time.Millisecond)
				f := traffic.FailuresAround(stream.Stop(), fault)
				k, n, _ := CheckKeepConns(OnSurvivors(conns, victim), "/bench")
				conns.Close()
				if err := l.ReviveEdge(victim); err != nil {
					t.Fatal(err)
				}
				if _, err := testenv.Poll(ctx, 60*time.Second, 100*time.Millisecond, func() error { return l.Router.Announced(len(l.Edges)) }); err != nil {
					t.Fatal(err)
				}
				back := choices()
				movedAll := 0
				for sport, a := range after {
					if back[sport] != a {
						movedAll++
					}
				}
				t.Logf("%s trial %d: next hop gone after %4dms; the removal moved %4.1f%% of the surviving edges' flows, the re-add %4.1f%% of all; held connections on surviving replicas kept %d/%d; new connections failed %d/%d (last started %v after the fault)",
					name, i+1, gone.Milliseconds(), 100*float64(moved)/float64(max(survivors, 1)), 100*float64(movedAll)/float64(len(after)), k, n, f.Failed, f.Total, f.Last.Round(time.Millisecond))
				outages = append(outages, gone)
				movedOut = append(movedOut, 100*float64(moved)/float64(max(survivors, 1)))
				movedBack = append(movedBack, 100*float64(movedAll)/float64(len(after)))
				broken += n - k
				held += n
				failed += f.Failed
				total += f.Total
			}
			slices.Sort(outages)
			slices.Sort(movedOut)
			slices.Sort(movedBack)
			mid := len(outages) / 2
			t.Logf("%s over %d trials: next hop gone median %v max %v; removal moved %.1f-%.1f%% of survivors' flows, re-add %.1f-%.1f%% of all; held connections broken %d of %d; new connections failed %d of %d",
				name, trials, outages[mid].Round(time.Millisecond), outages[len(outages)-1].Round(time.Millisecond),
				movedOut[0], movedOut[len(movedOut)-1], movedBack[0], movedBack[len(movedBack)-1], broken, held, failed, total)
		})
	}
}
