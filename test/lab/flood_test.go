package lab

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/test/testenv"
)

// backendPackets reads node n's pinned maps: packets steered to each replica of
// the VIP, and how many flows its tables hold (pinned, and new in a transition).
func (l *Lab) backendPackets(t *testing.T, n *Node) (map[netip.Addr]uint64, []dataplane.FlowView) {
	t.Helper()
	in, err := dataplane.OpenPinned(l.pinDir(n))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	vips, err := in.VIPs()
	if err != nil {
		t.Fatal(err)
	}
	out := map[netip.Addr]uint64{}
	for _, v := range vips {
		if v.Addr == VIP {
			for _, b := range v.Backends {
				out[b.Addr] += b.Counters.Packets
			}
		}
	}
	flows, err := in.Flows(0)
	if err != nil {
		t.Fatal(err)
	}
	return out, flows
}

// floodSources is where TestSYNFloodAcrossRingChanges's spoofed SYNs come from.
var floodSources = netip.MustParsePrefix("198.18.0.0/15")

func names(nodes []*Node) []string {
	out := make([]string, len(nodes))
	for i, n := range nodes {
		out[i] = n.Name
	}
	return out
}

// TestSYNFloodAcrossRingChanges: 200 long-lived connections through the VIP, then a
// bounded flood of spoofed SYNs at the VIP (500,000 packets, at most 20 s), during
// which a replica joins and then another starts draining. No long-lived connection
// breaks (those on the draining replica included), the flood's SYNs spread over the
// replicas by the ring, and the owner's table of pinned flows holds none of the
// flood's spoofed sources: the flood pinned nothing. (It holds the client's real
// connections in the slots the changes moved: the long-lived ones, and an idle
// keep-alive connection of an earlier check that closes meanwhile, found along
// its chain.)
func TestSYNFloodAcrossRingChanges(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	e1, e3 := l.Edges[0], l.Edges[2]
	if err := l.SetGroupEndpoints(ctx, map[*Node]string{e3: "gone"}); err != nil {
		t.Fatal(err)
	}
	owner, err := l.Owner()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(ctx, 10*time.Second, 100*time.Millisecond, func() error {
		in, err := l.InRing(owner, e3)
		if err == nil && in {
			err = fmt.Errorf("%s still in the owner's ring", e3.Name)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	held, err := l.OpenKeepConns(ctx, "echo.lab", 200)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(held.Close)

	// Counters are read at each ring change, so every phase is judged by the ring
	// it had, however fast this machine floods.
	type phase struct {
		name    string
		ring    []*Node
		at      time.Time
		packets map[netip.Addr]uint64
	}
	mark := func(name string, ring ...*Node) phase {
		p, _ := l.backendPackets(t, owner)
		return phase{name: name, ring: ring, at: time.Now(), packets: p}
	}
	e2 := l.Edges[1]
	phases := []phase{mark("e3 out", e1, e2)}
	type result struct {
		sent int
		err  error
	}
	done := make(chan result, 1)
	t0 := time.Now()
	go func() {
		n, err := l.FloodSpoofedSYNs(ctx, floodSources, 80, 500_000, 20*time.Second)
		done <- result{n, err}
	}()
	time.Sleep(time.Second)
	phases = append(phases, mark("e3 joined", e1, e2, e3))
	if err := l.SetGroupEndpoints(ctx, nil); err != nil { // e3 joins
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	phases = append(phases, mark("e1 draining", e2, e3))
	if err := l.SetGroupEndpoints(ctx, map[*Node]string{e1: "terminating"}); err != nil { // e1 drains
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	took := time.Since(t0)
	t.Logf("%d spoofed SYNs in %.1f s (%.0f/s); %s joined 1 s in, %s drained 2 s in", r.sent, took.Seconds(), float64(r.sent)/took.Seconds(), e3.Name, e1.Name)
	if r.sent < 100_000 {
		t.Errorf("only %d SYNs sent", r.sent)
	}

	kept, onE1 := 0, 0
	for _, k := range held {
		if k.Edge == e1.Addr.Addr().String() {
			onE1++
		}
		if _, err := k.Do("echo.lab", "/after-flood", 3*time.Second); err == nil {
			kept++
		} else {
			t.Logf("held connection via %s: %v", k.Edge, err)
		}
	}
	t.Logf("%d of %d long-lived connections kept working (%d on the draining %s)", kept, len(held), onE1, e1.Name)
	if kept != len(held) || onE1 == 0 {
		t.Errorf("%d of %d long-lived connections kept working (%d on %s), want all, and some on the draining replica", kept, len(held), onE1, e1.Name)
	}

	end, pinned := l.backendPackets(t, owner)
	phases = append(phases, phase{name: "end", at: time.Now(), packets: end})
	for i, p := range phases[:len(phases)-1] {
		next := phases[i+1]
		share, total := map[string]uint64{}, uint64(0)
		for _, e := range l.Edges {
			d := next.packets[e.Addr.Addr()] - p.packets[e.Addr.Addr()]
			share[e.Name] = d
			total += d
		}
		t.Logf("%s (%.1f s): packets steered per replica %v", p.name, next.at.Sub(p.at).Seconds(), share)
		if total < 5000 {
			continue // the flood ended before this phase did much
		}
		// A ring change reaches the owner some milliseconds after it is written,
		// so a phase's first packets may still follow the ring before it: every
		// ring member gets at least half its fair share.
		for _, e := range p.ring {
			if share[e.Name]*uint64(2*len(p.ring)) < total {
				t.Errorf("%s: %s got %d of %d packets: the flood's SYNs should spread over the ring %v", p.name, e.Name, share[e.Name], total, names(p.ring))
			}
		}
		// and a replica out of the ring (gone, or draining) gets no new flows
		// once the change has landed.
		for _, e := range l.Edges {
			if !slices.Contains(p.ring, e) && share[e.Name]*4 > total {
				t.Errorf("%s: %s, not in the ring, got %d of %d packets", p.name, e.Name, share[e.Name], total)
			}
		}
	}
	// No spoofed SYN leaves a pin (it never completes a handshake); the
	// client's real connections in the moved slots do (the held ones, and any
	// other the lab opened meanwhile).
	var spoofed []string
	for _, f := range pinned {
		if floodSources.Contains(f.Flow.Src) {
			spoofed = append(spoofed, fmt.Sprintf("%+v", f.Flow))
		}
	}
	t.Logf("%d flows pinned on the owner after the flood (%d long-lived connections held)", len(pinned), len(held))
	if len(spoofed) > 0 {
		t.Errorf("%d spoofed flows pinned on the owner after the flood, want none: %v", len(spoofed), spoofed[:min(len(spoofed), 10)])
	}
}
