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
// may fail. Then, as the verdicts agree again, the owner dies: every held
// connection on a surviving replica answers within 1 s of the takeover, and no
// new connection fails after it.
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
	// The third edge's probes pass: it calls the victim serving (a stall on
	// a loaded host may make it call it down for a moment: waited out).
	waitRing(t, l, []*Node{third}, victim, true, fault, 5*time.Second)
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
	differed := 0
	for i := range 6 {
		check(fmt.Sprintf("verdicts differ, check %d", i+1))
		ownerIn, err1 := l.InRing(owner, victim)
		thirdIn, err2 := l.InRing(third, victim)
		if err1 == nil && err2 == nil && !ownerIn && thirdIn {
			differed++
		}
		time.Sleep(500 * time.Millisecond)
	}
	// The premise, for the record: a stalled checker on a loaded host falls
	// back to Kubernetes' view for a moment (liveness.Checker.Dead).
	t.Logf("the verdicts differed at %d of 6 checks", differed)
	if differed == 0 {
		t.Errorf("the verdicts never differed at a check: the test proved nothing")
	}

	back := time.Now()
	unblock()
	in := waitRing(t, l, []*Node{owner}, victim, true, back, 10*time.Second)
	t.Logf("%s calls %s serving again %v after its probes pass", owner.Name, victim.Name, in.Round(time.Millisecond))
	check("verdicts agree again")

	// Then, within the transitions the differing verdicts left, the owner
	// dies: the walks now start at a new director, whose rings went through
	// other changes than the dead one's.
	killAt := time.Now()
	newOwner, takeover := l.killOwner(t, owner)
	survivors := OnSurvivors(tr.held, owner)
	kept, failed := AnswerWithin(survivors, "/after-death", time.Second)
	t.Logf("%s died; %s owns the VIP after %v; held connections on surviving replicas: %d of %d answered within 1 s",
		owner.Name, newOwner.Name, takeover.Round(time.Millisecond), kept, len(survivors))
	if kept != len(survivors) {
		t.Errorf("%d held connections on surviving replicas broke after the owner's death: %v", len(survivors)-kept, failed)
	}
	time.Sleep(2 * time.Second)
	atts := tr.stream.Stop()
	if f := traffic.FailuresAround(atts, fault); f.Failed > 0 && f.First < killAt.Sub(fault) {
		t.Errorf("new connections failed while the verdicts differed or as they cleared: %v", f)
	}
	requireNoneAfter(t, traffic.FailuresAround(atts, killAt), takeover, "the takeover")
}
