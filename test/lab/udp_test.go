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
	stream  bool // sends every udpStreamEvery on its own; the others only at checks
	mu      sync.Mutex
	session string
	edge    string
	moved   []string // sessions it was answered from after its first
	lost    int      // datagrams not answered within a second (sent again)
	sent    int
}

const udpStreamEvery = 200 * time.Millisecond

// ask sends one datagram and waits for its answer, up to tries times a
// second; it records where the answer came from.
func (f *udpFlow) ask(what string, tries int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	buf := make([]byte, 512)
	for range tries {
		f.sent++
		f.c.SetDeadline(time.Now().Add(time.Second))
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
// events: an edge drains and comes back (a rolling restart's two ring
// changes, inside one transition), then the VIP owner dies. UDP has no
// handshake and no socket per flow: the edges find a flow's replica by what
// each one's stack served (bpf/README.md, "UDP"). Half the flows stream (a
// datagram every 200 ms), half send only at the checks. Every flow on a
// surviving replica must keep its session and answer within a second of the
// takeover; new flows (one datagram from a new socket) must be answered after
// it.
func TestUDPFlowsThroughChanges(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	l.serveL4(t)
	udpVIP := netip.MustParseAddr("192.0.2.91")
	// Sessions outlive the test's quiet moments (the idle flows send every
	// few seconds) but not its end by much: the agents' graceful stop waits
	// for them.
	if err := l.l4Service(ctx, "udp-echo", udpVIP, corev1.ProtocolUDP, 53, l4UDPPort, "portico.io/udp-idle-timeout", "20s"); err != nil {
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
	flows := make([]*udpFlow, n)
	if err := netlab.Do(l.Client.NS, func() error {
		for i := range flows {
			c, err := net.Dial("udp4", addr)
			if err != nil {
				return err
			}
			flows[i] = &udpFlow{c: c, stream: i%2 == 0}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, f := range flows {
		t.Cleanup(func() { f.c.Close() })
		if err := f.ask("open", 3); err != nil {
			t.Fatalf("open a UDP flow: %v", err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	deadline := time.Now().Add(2 * time.Minute) // bounds the streams
	for _, f := range flows {
		if !f.stream {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				select {
				case <-stop:
					return
				case <-time.After(udpStreamEvery):
				}
				f.ask("stream", 1)
			}
		}()
	}
	stopStreams := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopStreams)
	per := map[string]int{}
	for _, f := range flows {
		per[f.edge]++
	}
	dIP, oIP := drained.Addr.Addr().String(), owner.Addr.Addr().String()
	if per[dIP] == 0 || per[oIP] == 0 || len(per) < 3 {
		t.Fatalf("flows per edge %v: want some on %s (drains), %s (owner) and the third", per, drained.Name, owner.Name)
	}
	check := func(what string, skip string) (answered, on int) {
		t.Helper()
		for _, f := range flows {
			if f.edge == skip {
				continue
			}
			on++
			if err := f.ask(what, 1); err == nil {
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

	// An edge drains: its slots go to the others, its flows stay.
	if err := l.SetGroupEndpoints(ctx, map[*Node]string{drained: "terminating"}); err != nil {
		t.Fatal(err)
	}
	applied("the drain", func(d bool, s int) bool { return d && s == 0 })
	if a, on := check("draining", ""); a != on {
		t.Errorf("while %s drains: %d of %d flows answered", drained.Name, a, on)
	}
	// It comes back: its slots return, and with them flows that began on the
	// others meanwhile (none here but the streams' datagrams walked).
	if err := l.SetGroupEndpoints(ctx, nil); err != nil {
		t.Fatal(err)
	}
	applied("the return", func(d bool, s int) bool { return !d && s > 0 })
	if a, on := check("back", ""); a != on {
		t.Errorf("after %s came back: %d of %d flows answered", drained.Name, a, on)
	}

	// Then the VIP owner dies, inside the transition those changes began.
	newOwner, takeover := l.killOwner(t, owner)
	kept, on := check("after the takeover", oIP)
	newFailed := 0
	for range 30 {
		if _, err := l.udpQuery(addr); err != nil {
			newFailed++
		}
	}
	time.Sleep(2 * time.Second) // the streams go on through the new owner
	stopStreams()
	moved, lost, sent := 0, 0, 0
	for _, f := range flows {
		if f.edge == oIP {
			continue
		}
		if len(f.moved) > 0 {
			moved++
			t.Logf("a flow whose session was %s (on %s) was answered from %v", f.session, f.edge, f.moved)
		}
		lost += f.lost
		sent += f.sent
	}
	t.Logf("%d UDP flows (per edge %v); %s drained and came back, then %s died and %s took over in %v: %d of %d flows on surviving replicas answered within 1 s of it, %d kept their nginx session throughout; %d of %d datagrams needed sending again; %d of 30 new flows failed after the takeover",
		n, per, drained.Name, owner.Name, newOwner.Name, takeover.Round(time.Millisecond), kept, on, on-moved, lost, sent, newFailed)
	if kept != on || moved > 0 || newFailed > 0 {
		t.Errorf("flows on surviving replicas: %d of %d answered, %d changed session; %d new flows failed; want all, none, none", kept, on, moved, newFailed)
	}
}
