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
// after it. IPv4 and IPv6 alike. The agents' transition is 3 s here (2 min by default), so that
// the test waits for its end.
func TestHeldThroughTransition(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces, XDP, VRRP")
	const transition = 3 * time.Second
	l := startLabWith(t, Options{Portico: porticoBin, Transition: transition})
	ctx := context.Background()
	if err := l.addIPv6(ctx); err != nil {
		t.Fatal(err)
	}
	v6 := traffic.Target{NS: l.Client.NS, VIP: VIP6}
	c6 := v6.HTTPClient(false, 2*time.Second)
	if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error {
		_, err := v6.Get(ctx, c6, "echo.lab", "/wait")
		return err
	}); err != nil {
		t.Fatalf("HTTP through %s: %v", VIP6, err)
	}
	owner := vipOwner(t, l)
	// The drained edge owns neither VIP where it can: the IPv6 virtual
	// router elects its own master.
	var drained *Node
	for _, e := range l.Edges {
		if e == owner {
			continue
		}
		if has6, err := e.holds(VIP6); err != nil {
			t.Fatal(err)
		} else if drained == nil || !has6 {
			drained = e
		}
	}
	tr := startTraffic(t, l)
	held6, err := v6.OpenKeepConns(ctx, "echo.lab", 60)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(held6.Close)
	on := func(held traffic.KeepConns, n *Node) int { return len(held) - len(OnSurvivors(held, n)) }
	onDrained, onDrained6 := on(tr.held, drained), on(held6, drained)
	if onDrained == 0 || onDrained6 == 0 {
		t.Fatalf("held connections on %s: %d over IPv4, %d over IPv6; the test proves less than it says", drained.Name, onDrained, onDrained6)
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
			if int(v) < onDrained+onDrained6 {
				return fmt.Errorf("%s: %s = %v, want >= %d", n.Name, series, v, onDrained+onDrained6)
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
	t.Logf("%s drains; its %d+%d held connections (IPv4+IPv6) reported on every edge (%v) and every transition over %v after the change",
		drained.Name, onDrained, onDrained6, reported, time.Since(changed).Round(time.Millisecond))

	fault := time.Now()
	newOwner, takeover := l.killOwner(t, owner)
	survivors := append(OnSurvivors(tr.held, owner), OnSurvivors(held6, owner)...)
	kept, failed := AnswerWithin(survivors, "/after-transition", time.Second)
	t.Logf("%s died; %s owns the IPv4 VIP after %v; held connections on surviving replicas: %d of %d answered within 1 s (%d+%d on the draining %s)",
		owner.Name, newOwner.Name, takeover.Round(time.Millisecond), kept, len(survivors), onDrained, onDrained6, drained.Name)
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
