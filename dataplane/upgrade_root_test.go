package dataplane

import (
	"encoding/binary"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/portico-edge/portico/dataplane/pins"
	"github.com/portico-edge/portico/test/netlab"
	"github.com/portico-edge/portico/test/testenv"
)

// flowSink records, per client flow (its source port), the replicas that
// received it and the sequence numbers that arrived.
type flowSink struct {
	mu       sync.Mutex
	replicas map[int]map[string]bool
	seqs     map[uint64]bool
}

func (l *nsLab) listenFlows(t *testing.T, s *flowSink, r *netlab.Node) {
	t.Helper()
	l.listenUDP(t, r, func(p []byte, from *net.UDPAddr) {
		s.mu.Lock()
		if s.replicas[from.Port] == nil {
			s.replicas[from.Port] = map[string]bool{}
		}
		s.replicas[from.Port][r.Name] = true
		s.seqs[uint64(from.Port)<<32|uint64(binary.BigEndian.Uint32(p[4:8]))] = true
		s.mu.Unlock()
	})
}

// check returns how many datagrams arrived and the flows that reached more
// than one replica.
func (s *flowSink) check() (n int, split []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for port, rs := range s.replicas {
		if len(rs) > 1 {
			split = append(split, port)
		}
	}
	return len(s.seqs), split
}

// TestNamespaceUpgrade: an edge runs an older program with its older pins
// and forwards UDP flows from a client namespace, some of them pinned to their
// replica across a ring change (a second replica joined; the transition is
// over, so only the pins keep them); this version's loader then starts over
// those pins in the middle of the stream and replaces the program on the
// pinned link. Every datagram arrives, no flow reaches two replicas, the XDP
// link is the one the older program was attached with (never detached), and
// each map has one pin left, this version's. The older program is the previous
// release's object with its maps pinned by name (testdata/previous), or this
// version's with flows of another size (copied entry by entry while the
// stream runs, then again for what the old program pinned meanwhile).
func TestNamespaceUpgrade(t *testing.T) {
	prev, err := ebpf.LoadCollectionSpec("testdata/previous/lb_bpfel.o")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		old   Options
		flows pins.Outcome
	}{
		{"from the previous release", Options{spec: prev, legacyPins: true, FlowEntries: 4096}, pins.Adopted},
		{"over flows of another size", Options{FlowEntries: 2048}, pins.Migrated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newNSLab(t)
			sink := &flowSink{replicas: map[int]map[string]bool{}, seqs: map[uint64]bool{}}
			l.listenFlows(t, sink, l.rep1)
			l.listenFlows(t, sink, l.rep2)
			opts := tc.old
			opts.PinPath, opts.RingSize = l.pin, testRing
			old, err := Load(opts)
			if err != nil {
				t.Fatalf("load the older program: %v", err)
			}
			must(t, netlab.Do(l.edge.NS, func() error { return old.Attach("eth0") }))
			oldLink, err := old.link.Info()
			must(t, err)
			_, err = old.Apply(l.udpVIP(l.rep1))
			must(t, err)

			const flows = 32
			conns := l.clientConns(t, flows)
			sent := 0
			step := func(seq uint32) {
				for _, c := range conns {
					must(t, send(c, seq))
					sent++
				}
			}
			wait := func(what string) {
				t.Helper()
				if _, err := testenv.Poll(t.Context(), 5*time.Second, 10*time.Millisecond, func() bool { n, _ := sink.check(); return n == sent }); err != nil {
					n, _ := sink.check()
					t.Fatalf("%s: %d of %d datagrams arrived", what, n, sent)
				}
			}
			step(0)
			wait("one replica")
			_, err = old.Apply(l.udpVIP(l.rep1, l.rep2))
			must(t, err)
			step(1) // in the transition: moved flows stay on rep1
			wait("in the transition")
			// rep1's report (agent/held.go): the flows it holds, pinned to
			// it (those the new ring gives to rep2 are what matter here).
			var moved []Held
			for _, c := range conns {
				a := c.LocalAddr().(*net.UDPAddr).AddrPort()
				f := Flow{Src: a.Addr().Unmap(), Dst: l.vip, SPort: a.Port(), DPort: 9000, Protocol: unix.IPPROTO_UDP}
				if len(old.OffRing(l.rep1.Addr.Addr(), []Flow{f}, false)) == 1 {
					moved = append(moved, Held{Flow: f, Holder: l.rep1.Addr.Addr()})
				}
			}
			if _, err := old.PinHeld(moved); err != nil {
				t.Fatalf("pin rep1's flows: %v", err)
			}
			director{"old", old}.endTransitions(t)
			pinned := entries(t, old.objs.Flows)
			if pinned == 0 || pinned == flows {
				t.Fatalf("%d of %d flows pinned by the ring change, want some", pinned, flows)
			}

			// The stream goes on while the loader is replaced.
			upgraded := make(chan *Dataplane, 1)
			failed := make(chan error, 1)
			go func() {
				time.Sleep(100 * time.Millisecond)
				if err := old.Close(); err != nil {
					failed <- err
					return
				}
				d, err := Load(Options{PinPath: l.pin, RingSize: testRing, FlowEntries: 4096})
				if err == nil {
					err = netlab.Do(l.edge.NS, func() error { return d.Attach("eth0") })
				}
				if err == nil {
					var st ApplyStats
					if st, err = d.Apply(l.udpVIP(l.rep1, l.rep2)); err == nil && st.Rings != 0 {
						t.Errorf("the upgraded loader's first Apply swapped %d rings for the same replicas", st.Rings)
					}
				}
				if err != nil {
					failed <- err
					return
				}
				upgraded <- d
			}()
			var up *Dataplane
			start := time.Now()
			after := 0 // steps sent once the upgrade is done
			for seq := uint32(2); after < 200; seq++ {
				step(seq)
				time.Sleep(time.Millisecond)
				select {
				case up = <-upgraded:
					t.Cleanup(func() {
						if up != nil {
							up.Close()
						}
					})
				case err := <-failed:
					t.Fatalf("upgrade: %v", err)
				default:
				}
				if up != nil {
					after++
				}
				if time.Since(start) > 30*time.Second {
					t.Fatal("the upgrade did not finish in 30 s")
				}
			}
			wait("across the upgrade")
			n, split := sink.check()
			if len(split) > 0 {
				t.Errorf("flows from ports %v reached two replicas across the upgrade", split)
			}
			t.Logf("%d datagrams of %d flows (%d pinned) across the upgrade in %v, none lost", n, flows, pinned, time.Since(start).Round(time.Millisecond))

			newLink, err := up.link.Info()
			must(t, err)
			if newLink.ID != oldLink.ID || newLink.Program == oldLink.Program {
				t.Errorf("link %d running program %d after the upgrade, want link %d running another program than %d",
					newLink.ID, newLink.Program, oldLink.ID, oldLink.Program)
			}
			for _, r := range up.PinnedMaps() {
				if r.Map == lbMapFlows && r.Outcome != tc.flows {
					t.Errorf("flows: %s, want %s", r.Outcome, tc.flows)
				}
				if r.Outcome == pins.Lost || r.Outcome == pins.New {
					t.Errorf("map %s: %s, want its state carried over", r.Map, r.Outcome)
				}
			}
			ents, err := os.ReadDir(l.pin)
			must(t, err)
			per := map[string]int{}
			for _, e := range ents {
				name, _, _ := strings.Cut(e.Name(), pins.Sep)
				per[name]++
			}
			for _, m := range pinnedMaps(Options{}, true) {
				if per[m.Name] != 1 {
					t.Errorf("map %s has %d pins after the upgrade, want 1", m.Name, per[m.Name])
				}
			}

			// Uninstall takes every layout away, and the program off the link.
			must(t, up.Close())
			up = nil
			must(t, Uninstall(l.pin))
			if _, err := os.Stat(l.pin); !os.IsNotExist(err) {
				t.Errorf("pin directory %s left after uninstall: %v", l.pin, err)
			}
			out, err := netlab.Exec(l.edge.NS, "ip", "link", "show", "dev", "eth0")
			must(t, err)
			if strings.Contains(out, "xdp") {
				t.Errorf("eth0 still has an XDP program after uninstall:\n%s", out)
			}
		})
	}
}
