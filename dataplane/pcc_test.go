package dataplane

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/portico-edge/portico/dataplane/bpftest"
)

var (
	pccSeed      = flag.Uint64("pcc.seed", 0, "TestPCCModel: the seed of the sequences (0: a random one)")
	pccSequences = flag.Int("pcc.sequences", 1000, "TestPCCModel: how many sequences to run")
	pccSequence  = flag.Int("pcc.sequence", -1, "TestPCCModel: run only this sequence of the seed (a replay)")
	pccSelfView  = flag.String("pcc.selfview", "learns", "TestPCCModel: how a node comes to call itself down: 'learns' (the agent: from the other edges' answers to its probes, a moment after they decided, and by a cycle when its agent restarts), 'never' (its checks of itself are local only: the open class before it learned), 'at-once' (with the others)")
	pccAll       = flag.Bool("pcc.all", false, "TestPCCModel: run every sequence and count the failing ones by class, instead of stopping at the first")
	pccHeld      = flag.Bool("pcc.held", true, "TestPCCModel: after each event every edge reports the connections it holds off the current ring (Dataplane.OffRing) and every edge pins them (Dataplane.PinHeld), and unpins what a holder no longer reports (the agents' held reports); false: a measure of what they add")
	pccSkew      = flag.Bool("pcc.skew", true, "TestPCCModel: also let one edge's verdict on a live replica differ from the others' for a while (it alone calls it down, or alone still calls it up): per-edge liveness verdicts differ for as long as their probes' answers do")
	pccUDP       = flag.Bool("pcc.udp", true, "TestPCCModel: also open UDP flows (an L4 Service's): every datagram must reach the node its first went to")
	pccExpire    = flag.Bool("pcc.expire", true, "TestPCCModel: also let every transition end between events (minutes pass without a change); with -pcc.held=false a measure of bpf/README.md's limits, which then break sequences (a connection silent through a whole transition, or carried only by the pin of a director that no longer directs)")
)

const (
	pccMaxNodes = 8
	pccMaxHops  = 16
)

// TestPCCModel checks per-connection consistency: a packet of an established TCP
// connection reaches the node whose stack accepted its SYN, whatever happened
// since the connection opened: replicas added, removed, draining, called down by
// the liveness checks (a node that really died, or a false positive), the VRRP
// owner or the ECMP set of directors changing, one node applying a change later
// than the others.
//
// Each sequence is a random world of 3-8 edge nodes, 2-5 of them directors (one
// VIP owner, or all behind a router's ECMP hash; a director is an edge with a
// replica), and 3-14 events (within the 16 rings a transition holds) with new
// connections and packets of open ones between them. Every frame goes through
// the real xdp_lb of each node it reaches (BPF_PROG_TEST_RUN), following XDP_TX
// from node to node by MAC; a node's sockets are its sock_model map. A packet of
// an open connection fails when a node that is not its holder passes it (its
// stack would reset it), when it is sent to a dead node, dropped, or loops, or
// when the holder's stack gets other bytes than the client sent (MACs aside).
// Two losses TCP recovers from by sending the packet again are counted, not
// failed: a packet sent while one edge had not applied a change yet, dropped or
// sent to a node it does not know is dead, and one of a replica called down
// wrongly that went to a dead one. The connection's next packets must arrive
// (the wrong verdicts clear before the last ones), and its last packet counts
// strictly.
//
// -pcc.seed=S -pcc.sequence=K replays one sequence; -pcc.sequences sets how many
// run; -pcc.all runs them all and counts the failing ones by class. With -v each
// sequence logs its counts. The test runs on one CPU (the flow cache and the
// memos are per CPU, so the outcome depends on the seed alone) and turns on
// expedited RCU while it runs (/sys/kernel/rcu_expedited): every ring swap waits
// for a grace period, 10 ms or more on a small VM, where a thousand sequences
// would take most of an hour.
func TestPCCModel(t *testing.T) {
	if !slices.Contains([]string{"learns", "never", "at-once"}, *pccSelfView) {
		t.Fatalf("-pcc.selfview=%q: want learns, never or at-once", *pccSelfView)
	}
	bpftest.Require(t)
	defer onOneCPU(t)()
	expediteRCU(t)
	start := time.Now()
	nodes := loadPCCNodes(t)
	t.Logf("loaded %d nodes in %v", len(nodes), time.Since(start).Round(time.Millisecond))

	seed := *pccSeed
	if seed == 0 {
		seed = rand.Uint64N(1<<53) + 1
	}
	first, last := 0, *pccSequences
	if *pccSequence >= 0 {
		first, last = *pccSequence, *pccSequence+1
	}
	t.Logf("seed %d, sequences %d to %d", seed, first, last-1)
	var total pccStats
	failed := map[string]int{}
	examples := map[string]string{}
	start = time.Now()
	for seq := first; seq < last; seq++ {
		w := newPCCWorld(t, nodes, seed, seq)
		fail := w.run()
		total.add(w.stats)
		if testing.Verbose() {
			t.Logf("sequence %d: %s", seq, w.summary())
		}
		if fail != nil {
			if !*pccAll {
				t.Fatalf("%s", w.report(fail))
			}
			failed[fail.class]++
			if _, ok := examples[fail.class]; !ok {
				examples[fail.class] = w.report(fail)
			}
			t.Logf("sequence %d FAILS: %s", seq, w.brief(fail))
		}
		for _, n := range w.nodes {
			if err := n.reset(); err != nil {
				t.Fatalf("seed %d, sequence %d: reset n%d: %v", seed, seq, n.id, err)
			}
		}
	}
	t.Logf("seed %d: %d sequences in %v: %s", seed, last-first, time.Since(start).Round(time.Millisecond), total)
	if len(failed) > 0 {
		var b strings.Builder
		fmt.Fprintf(&b, "seed %d: failing sequences by class (of %d):", seed, last-first)
		for _, class := range sortedKeys(failed) {
			fmt.Fprintf(&b, " %s %d;", class, failed[class])
		}
		for _, class := range sortedKeys(examples) {
			fmt.Fprintf(&b, "\n\nfirst %s:\n%s", class, examples[class])
		}
		t.Error(b.String())
	}
}

func sortedKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// expediteRCU turns expedited RCU grace periods on for the test, and back off
// when it ends: every ring swap (a map-in-map update) waits for a grace period.
func expediteRCU(t *testing.T) {
	const knob = "/sys/kernel/rcu_expedited"
	was, err := os.ReadFile(knob)
	if err != nil || strings.TrimSpace(string(was)) != "0" {
		return
	}
	if err := os.WriteFile(knob, []byte("1"), 0o644); err != nil {
		t.Logf("expedited RCU not available (%v): ring swaps will be slow", err)
		return
	}
	t.Cleanup(func() {
		if err := os.WriteFile(knob, was, 0o644); err != nil {
			t.Errorf("restore %s: %v", knob, err)
		}
	})
}
