package lab

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/portico-edge/portico/test/netlab"
	"github.com/portico-edge/portico/test/traffic"
)

// TestVerdictsDiffer: the VIP owner alone calls a live replica down (its
// probes of that replica are dropped, the third edge's pass: a lossy path
// between two nodes, or one edge's stall under load), for seconds, then
// agrees with the others again. Meanwhile their rings differ: the owner
// places that replica last in the walk's order, the third edge by its
// address, below itself (bpf/README.md, "Verdicts that differ"). The replica
// is the lowest-addressed of the other two, so a walk from the owner reaches
// the third edge first, and nothing above it there holds the connection.
// Every held connection (idle until the first check, then asked every half
// second) must answer within 1 s throughout and after, and no new connection
// may fail.
func TestVerdictsDiffer(t *testing.T) {
	l := startLab(t)
	owner := vipOwner(t, l)
	rest := others(l, owner)
	slices.SortFunc(rest, func(a, b *Node) int { return a.Addr.Addr().Compare(b.Addr.Addr()) })
	victim, third := rest[0], rest[len(rest)-1]
	tr := startTraffic(t, l)
	on := 0
	for _, k := range tr.held {
		if k.Edge == victim.Addr.Addr().String() {
			on++
		}
	}
	if on == 0 {
		t.Fatalf("no held connection on %s: the test proves nothing", victim.Name)
	}

	rule := []string{"OUTPUT", "-p", "tcp", "-d", victim.Addr.Addr().String(), "--dport", "10247", "-j", "DROP"}
	fault := injectFault(t, func() error {
		_, err := netlab.Exec(owner.NS, "iptables", append([]string{"-w", "-I"}, rule...)...)
		return err
	})
	blocked := true
	unblock := func() {
		if blocked {
			blocked = false
			if _, err := netlab.Exec(owner.NS, "iptables", append([]string{"-w", "-D"}, rule...)...); err != nil {
				t.Errorf("unblock %s's probes of %s: %v", owner.Name, victim.Name, err)
			}
		}
	}
	t.Cleanup(unblock)
	out := waitRing(t, l, []*Node{owner}, victim, false, fault, 5*time.Second)
	if in, err := l.InRing(third, victim); err != nil || !in {
		t.Fatalf("%s has %s in its ring: %v (%v); want the verdicts to differ", third.Name, victim.Name, in, err)
	}
	t.Logf("%s alone calls %s down %v after its probes were dropped; %s still calls it serving (%d held connections on it)",
		owner.Name, victim.Name, out.Round(time.Millisecond), third.Name, on)

	check := func(when string) {
		t.Helper()
		kept, failed := AnswerWithin(tr.held, "/skew", time.Second)
		t.Logf("%s: %d of %d held connections answered within 1 s", when, kept, len(tr.held))
		if kept != len(tr.held) {
			t.Errorf("%s: %d held connections broke: %v", when, len(tr.held)-kept, failed)
		}
	}
	for i := range 6 {
		check(fmt.Sprintf("verdicts differ, check %d", i+1))
		time.Sleep(500 * time.Millisecond)
	}
	if in, err := l.InRing(owner, victim); err != nil || in {
		t.Fatalf("%s took %s back while its probes were dropped (%v): the verdicts did not differ throughout", owner.Name, victim.Name, err)
	}

	back := time.Now()
	unblock()
	in := waitRing(t, l, []*Node{owner}, victim, true, back, 10*time.Second)
	t.Logf("%s calls %s serving again %v after its probes pass", owner.Name, victim.Name, in.Round(time.Millisecond))
	check("verdicts agree again")
	time.Sleep(time.Second)
	check("1 s later")
	requireNoneAfter(t, traffic.FailuresAround(tr.stream.Stop(), fault), 0, "the verdicts began to differ")
}
