package lab

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

// TestHeldThroughTransition: connections that send nothing through a whole
// ring transition, held by a replica the change took every slot from (it
// drains), then the VIP owner dies. No director ever saw a packet of them
// after the change, so no pin of the transition carries them: only their
// holder's report does (every agent lists its stack's connections off the
// ring, every edge pins them). Every held connection on a surviving replica
// must answer within 1 s of the takeover, and no new connection may fail
// after it. The agents' transition is 3 s here (2 min by default), so that
// the test waits for its end.
func TestHeldThroughTransition(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces, XDP, VRRP")
	const transition = 3 * time.Second
	l := startLabWith(t, Options{Portico: porticoBin, Transition: transition})
	ctx := context.Background()
	owner := vipOwner(t, l)
	var drained *Node
	for _, e := range l.Edges {
		if e != owner {
			drained = e
			break
		}
	}
	tr := startTraffic(t, l)
	onDrained := len(tr.held) - len(OnSurvivors(tr.held, drained))
	if onDrained == 0 {
		t.Fatalf("no held connection on %s: the test proves nothing", drained.Name)
	}

	// The change: drained's slots go to the others; its connections stay.
	dIP := drained.Addr.Addr().String()
	if err := l.SetGroupEndpoints(ctx, map[*Node]string{drained: "terminating"}); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(ctx, 10*time.Second, 100*time.Millisecond, func() error {
		for _, n := range l.Edges {
			bs, err := l.ownerBackends(n)
			if err != nil {
				return err
			}
			if !bs[dIP].Draining || bs[dIP].Slots != 0 {
				return fmt.Errorf("%s: %s not draining, or still holding ring slots: %+v", n.Name, dIP, bs[dIP])
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()

	// Its list reaches every edge, and every transition ends (its lease, then
	// the agents' next Expire), while the held connections send nothing.
	var reported []string
	if _, err := testenv.Poll(ctx, 20*time.Second, 200*time.Millisecond, func() error {
		reported = reported[:0]
		for i, n := range l.Edges {
			series := `portico_held_connections{holder="peers"}`
			if n == drained {
				series = `portico_held_connections{holder="own"}`
			}
			v, err := l.Metric(i, series)
			if err != nil {
				return err
			}
			if int(v) < onDrained {
				return fmt.Errorf("%s: %s = %v, want >= %d", n.Name, series, v, onDrained)
			}
			reported = append(reported, fmt.Sprintf("%s %v", n.Name, v))
			left, err := l.transitionLeft(n)
			if err != nil {
				return err
			}
			if left > 0 {
				return fmt.Errorf("%s: the VIP's transition lasts %v more", n.Name, left)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s drains; its %d held connections reported on every edge (%v) and every transition over %v after the change",
		drained.Name, onDrained, reported, time.Since(changed).Round(time.Millisecond))

	fault := time.Now()
	newOwner, takeover := l.killOwner(t, owner)
	survivors := OnSurvivors(tr.held, owner)
	kept, failed := AnswerWithin(survivors, "/after-transition", time.Second)
	t.Logf("%s died; %s owns the VIP after %v; held connections on surviving replicas: %d of %d answered within 1 s (%d on the draining %s)",
		owner.Name, newOwner.Name, takeover.Round(time.Millisecond), kept, len(survivors), onDrained, drained.Name)
	if kept != len(survivors) {
		t.Errorf("%d held connections on surviving replicas broke: %v", len(survivors)-kept, failed)
	}
	time.Sleep(time.Second)
	requireNoneAfter(t, traffic.FailuresAround(tr.stream.Stop(), fault), takeover, "the takeover")
}

// transitionLeft is how long the lab VIP's transition still lasts on n's maps.
func (l *Lab) transitionLeft(n *Node) (time.Duration, error) {
	in, err := dataplane.OpenPinned("/sys/fs/bpf/" + l.Net.Prefix + n.Name)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	vips, err := in.VIPs()
	if err != nil {
		return 0, err
	}
	for _, v := range vips {
		if v.Addr == VIP {
			return v.Transition, nil
		}
	}
	return 0, fmt.Errorf("%s has no VIP %s", n.Name, VIP)
}
