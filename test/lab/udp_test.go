package lab

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/portico-edge/portico/test/netlab"
	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

// udpFlow is one client socket's UDP flow through an L4 Service: the nginx
// session it has (the address the pod sees: the edge's, and the port of
// nginx's upstream socket for that session), and what it was answered.
type udpFlow struct {
	c       net.Conn
	what    string        // when it was opened
	every   time.Duration // how often it sends on its own, besides the checks
	mu      sync.Mutex
	session string
	edge    string
	moved   []string // sessions it was answered from after its first
	lost    int      // datagrams not answered within a second (sent again)
	sent    int
}

// ask sends one datagram and waits wait for its answer, up to tries times
// (UDP resends nothing: a datagram lost in flight is sent again); it records
// where the answer came from.
func (f *udpFlow) ask(what string, tries int, wait time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	buf := make([]byte, 512)
	for range tries {
		f.sent++
		f.c.SetDeadline(time.Now().Add(wait))
		if _, err := fmt.Fprintf(f.c, "%s %d\n", what, f.sent); err != nil {
			return err
		}
		n, err := f.c.Read(buf)
		if err != nil {
			f.lost++
			continue
		}
		rep, err := traffic.ParseL4Reply(string(buf[:n]))
		if err != nil {
			return err
		}
		_, session, _ := strings.Cut(string(buf[:n]), "session=")
		session = strings.TrimSpace(session)
		switch {
		case f.session == "":
			f.session, f.edge = session, rep.Peer
		case session != f.session:
			f.moved = append(f.moved, session)
		}
		return nil
	}
	return fmt.Errorf("no answer in %d tries", tries)
}

// TestUDPFlowsThroughChanges: UDP flows through an L4 Service keep their nginx
// session (the pod sees the same edge and upstream port) through overlapping
// events: a rolling update's replica drains, is removed and comes back (three
// ring changes, inside one transition; flows open meanwhile), then the VIP
// owner dies. UDP has no
// handshake and no socket per flow: the edges find a flow's replica by what
// each one's stack served (bpf/README.md, "UDP"). Half the flows stream (a
// datagram every 200 ms), half are quiet (one every 2 s, inside nginx's idle
// timeout of 5 s: a flow quiet for longer has no session to keep). Every flow
// on a surviving replica must keep its session and answer within a second of
// the takeover; new flows (one datagram from a new socket) must be answered
// after it. Datagrams lost in flight (each stream's sent once) are counted,
// per phase.
func TestUDPFlowsThroughChanges(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	l.serveL4(t)
	udpVIP := netip.MustParseAddr("192.0.2.91")
	// Sessions outlive the quiet flows' gaps but not the test's end by much:
	// the agents' graceful stop waits for them.
	if err := l.l4Service(ctx, "udp-echo", udpVIP, corev1.ProtocolUDP, 53, l4UDPPort, "portico.io/udp-idle-timeout", "5s"); err != nil {
		t.Fatal(err)
	}
	addr := netip.AddrPortFrom(udpVIP, 53).String()
	if _, err := testenv.Poll(ctx, 30*time.Second, 200*time.Millisecond, func() error {
		_, err := l.udpQuery(addr)
		return err
	}); err != nil {
		t.Fatalf("UDP through %s: %v", addr, err)
	}
	owner := vipOwner(t, l)
	if has, err := owner.holds(udpVIP); err != nil || !has {
		t.Fatalf("%s owns the group's VIP but not %s (%v)", owner.Name, udpVIP, err)
	}
	var drained *Node
	for _, e := range l.Edges {
		if e != owner {
			drained = e
			break
		}
	}

	const n = 48
	var flows []*udpFlow
	stop := make(chan struct{})
	var wg sync.WaitGroup
	deadline := time.Now().Add(2 * time.Minute) // bounds the streams
	// open opens n flows, half streaming, half quiet, each sending on its
	// own from then on.
	open := func(what string) {
		t.Helper()
		opened := make([]*udpFlow, n)
		if err := netlab.Do(l.Client.NS, func() error {
			for i := range opened {
				c, err := net.Dial("udp4", addr)
				if err != nil {
					return err
				}
				opened[i] = &udpFlow{c: c, what: what, every: 200 * time.Millisecond}
				if i%2 == 1 {
					opened[i].every = 2 * time.Second
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		for _, f := range opened {
			t.Cleanup(func() { f.c.Close() })
			if err := f.ask("open", 3, time.Second); err != nil {
				t.Fatalf("open a UDP flow %s: %v", what, err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					select {
					case <-stop:
						return
					case <-time.After(f.every):
					}
					f.ask("stream", 1, time.Second)
				}
			}()
		}
		flows = append(flows, opened...)
	}
	open("before")
	stopStreams := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopStreams)
	per := map[string]int{}
	for _, f := range flows {
		per[f.edge]++
	}
	perOf := func(what string) map[string]int {
		m := map[string]int{}
		for _, f := range flows {
			if f.what == what {
				m[f.edge]++
			}
		}
		return m
	}
	dIP, oIP := drained.Addr.Addr().String(), owner.Addr.Addr().String()
	if per[dIP] == 0 || per[oIP] == 0 || len(per) < 3 {
		t.Fatalf("flows per edge %v: want some on %s (drains), %s (owner) and the third", per, drained.Name, owner.Name)
	}
	// ended: the flows of a replica Kubernetes removed (in a rolling update
	// its pod is gone; here its nginx runs on, but no director owes it its
	// flows), and, once it is dead, the owner's.
	removed, dead := false, false
	ended := func(f *udpFlow) bool {
		return dead && f.edge == oIP || removed && f.what == "before" && f.edge == dIP
	}
	lostSoFar := func() (lost, sent int) {
		for _, f := range flows {
			f.mu.Lock()
			if !ended(f) {
				lost, sent = lost+f.lost, sent+f.sent
			}
			f.mu.Unlock()
		}
		return lost, sent
	}
	var phases []string
	phase := func(what string) {
		lost, sent := lostSoFar()
		phases = append(phases, fmt.Sprintf("%s %d/%d", what, lost, sent))
	}
	check := func(what string) (answered, on int) {
		t.Helper()
		for _, f := range flows {
			if ended(f) {
				continue
			}
			on++
			if err := f.ask(what, 2, 500*time.Millisecond); err == nil { // within 1 s
				answered++
			} else {
				t.Logf("%s: the flow on %s (session %s): %v", what, f.edge, f.session, err)
			}
		}
		return answered, on
	}
	applied := func(what string, want func(draining bool, slots int) bool) {
		t.Helper()
		if _, err := testenv.Poll(ctx, 10*time.Second, 100*time.Millisecond, func() error {
			for _, e := range l.Edges {
				bs, err := l.ownerBackends(e)
				if err != nil {
					return err
				}
				if b := bs[dIP]; !want(b.Draining, b.Slots) {
					return fmt.Errorf("%s: %s %+v", e.Name, dIP, b)
				}
			}
			return nil
		}); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	phase("before")
	// A rolling update's replica: it drains (its slots go to the others, its
	// flows stay), it is removed, and it comes back (its slots return).
	if err := l.SetGroupEndpoints(ctx, map[*Node]string{drained: "terminating"}); err != nil {
		t.Fatal(err)
	}
	applied("the drain", func(d bool, s int) bool { return d && s == 0 })
	time.Sleep(2 * time.Second) // the streams go on through the walk
	if a, on := check("draining"); a != on {
		t.Errorf("while %s drains: %d of %d flows answered", drained.Name, a, on)
	}
	if err := l.SetGroupEndpoints(ctx, map[*Node]string{drained: "gone"}); err != nil {
		t.Fatal(err)
	}
	applied("the removal", func(d bool, s int) bool { return !d && s == 0 })
	removed = true
	// Flows that begin now are on the others: the return moves some of their
	// slots back (issue 21: connections opened in between).
	open("while removed")
	time.Sleep(2 * time.Second)
	if err := l.SetGroupEndpoints(ctx, nil); err != nil {
		t.Fatal(err)
	}
	applied("the return", func(d bool, s int) bool { return !d && s > 0 })
	time.Sleep(2 * time.Second)
	if a, on := check("back"); a != on {
		t.Errorf("after %s came back: %d of %d flows answered", drained.Name, a, on)
	}
	phase("the rolling update")

	// Then the VIP owner dies, inside the transition those changes began.
	newOwner, takeover := l.killOwner(t, owner)
	dead = true
	kept, on := check("after the takeover")
	newFailed := 0
	for range 30 {
		if _, err := l.udpQuery(addr); err != nil {
			newFailed++
		}
	}
	time.Sleep(2 * time.Second) // the streams go on through the new owner
	stopStreams()
	phase("owner's death")
	moved := 0
	for _, f := range flows {
		if ended(f) {
			continue
		}
		if len(f.moved) > 0 {
			moved++
			t.Logf("a flow opened %s whose session was %s (on %s) was answered %d times from another, first %s", f.what, f.session, f.edge, len(f.moved), f.moved[0])
		}
	}
	t.Logf("%d UDP flows before and %d while the replica was removed (per edge %v, %v); %s drained, was removed and came back, then %s died and %s took over in %v: %d of %d flows on surviving replicas answered within 1 s of it, %d kept their nginx session throughout; datagrams of those flows unanswered within 1 s, lost/sent so far, after each phase: %v; %d of 30 new flows failed after the takeover",
		n, n, perOf("before"), perOf("while removed"), drained.Name, owner.Name, newOwner.Name, takeover.Round(time.Millisecond), kept, on, on-moved, phases, newFailed)
	if kept != on || moved > 0 || newFailed > 0 {
		t.Errorf("flows on surviving replicas: %d of %d answered, %d changed session; %d new flows failed; want all, none, none", kept, on, moved, newFailed)
	}
}
