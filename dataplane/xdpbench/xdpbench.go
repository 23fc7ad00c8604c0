// Package xdpbench measures xdp_lb's per-packet cost under BPF_PROG_TEST_RUN
// for a fixed set of cases (established and new flows, IPv4 and IPv6, non-VIP
// traffic) against the cheapest transmitting program as a floor: what
// `portico bench xdp` prints and the benchmarks in this package report.
package xdpbench

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/dataplane/xdpaux"
	"github.com/portico-edge/portico/dataplane/xdptest"
)

// Result is the per-packet cost of one case under BPF_PROG_TEST_RUN,
// measured two ways.
type Result struct {
	Name    string
	Verdict string
	// Repeat is the kernel's average run time over many repetitions of one call
	// (BPF_PROG_TEST_RUN's duration; the packet is not restored between them).
	// For the new-flow case every repetition after the first would be a flow hit,
	// so it is measured with one repetition per call over distinct tuples.
	Repeat time.Duration
	// PerRun is the program's run time per run from the kernel's BPF statistics
	// (BPF_ENABLE_STATS), one packet per call.
	PerRun time.Duration
	Runs   int // packets measured in PerRun mode
}

// Options size a benchmark run.
type Options struct {
	Repeat  int // repetitions in Repeat mode; default 1,000,000
	Packets int // single-packet calls in PerRun mode; default 20,000
}

// world is the state the benchmark cases run against: production-sized
// maps, one VIP pair over ten remote replicas, and a third VIP whose ten replicas
// just became eleven (its transition lasts the whole run).
type world struct {
	d       *dataplane.Dataplane
	floor   *ebpf.Program
	nic     net.HardwareAddr
	vip4    netip.Addr
	vip6    netip.Addr
	vipC    netip.Addr // in a transition
	client4 netip.Addr
	client6 netip.Addr
	// movedIdx: candidate flows to vipC (movedClient(i), port 1024+i%60000) that
	// the change moved to another replica.
	movedIdx []int
	cleanup  func()
}

// movedFlows is how many flows across the change the world prepares: enough for
// both measurement passes of Run's defaults.
const movedFlows = 45_000

func newWorld() (*world, error) {
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("remove memlock rlimit: %w", err)
	}
	pin := fmt.Sprintf("%s-bench-%d", dataplane.DefaultPinPath, os.Getpid())
	d, err := dataplane.Load(dataplane.Options{PinPath: pin, Transition: time.Hour})
	if err != nil {
		return nil, err
	}
	floor, err := xdpaux.LoadTX()
	if err != nil {
		d.Close()
		dataplane.Uninstall(pin)
		return nil, err
	}
	w := &world{
		d: d, floor: floor,
		nic:     net.HardwareAddr{2, 0, 0, 0, 0, 0xe},
		vip4:    netip.MustParseAddr("192.0.2.10"),
		vip6:    netip.MustParseAddr("2001:db8::10"),
		vipC:    netip.MustParseAddr("192.0.2.20"),
		client4: netip.MustParseAddr("198.51.100.7"),
		client6: netip.MustParseAddr("2001:db8:1::7"),
		cleanup: func() { floor.Close(); d.Close(); dataplane.Uninstall(pin) },
	}
	var bs []dataplane.Backend
	for i := range 11 {
		bs = append(bs, dataplane.Backend{Addr: netip.AddrFrom4([4]byte{10, 0, 0, byte(11 + i)}), MAC: net.HardwareAddr{2, 0, 0, 0, 1, byte(i)}})
	}
	if err := d.SetMAC(w.nic); err != nil {
		w.cleanup()
		return nil, err
	}
	want := func(changed []dataplane.Backend) dataplane.Desired {
		return dataplane.Desired{Seed: seed, Groups: []dataplane.Group{
			{Name: "bench", VIPs: []netip.Addr{w.vip4, w.vip6}, Ports: []model.Port{{Protocol: model.TCP, Port: 443}}, Backends: bs[:10]},
			{Name: "change", VIPs: []netip.Addr{w.vipC}, Ports: []model.Port{{Protocol: model.TCP, Port: 443}}, Backends: changed},
		}}
	}
	for _, set := range [][]dataplane.Backend{bs[:10], bs} {
		if _, err := d.Apply(want(set)); err != nil {
			w.cleanup()
			return nil, err
		}
	}
	if err := w.findMoved(bs); err != nil {
		w.cleanup()
		return nil, err
	}
	return w, nil
}

const seed = 1

// findMoved finds movedFlows flows to vipC whose replica differs between the ring
// of bs[:10] and that of bs.
func (w *world) findMoved(bs []dataplane.Backend) error {
	var tabs [2]dataplane.Table
	for i, set := range [][]dataplane.Backend{bs[:10], bs} {
		var in []dataplane.MaglevBackend
		for _, b := range set {
			in = append(in, dataplane.MaglevBackend{Addr: b.Addr})
		}
		t, err := dataplane.BuildTable(in, dataplane.DefaultRingSize)
		if err != nil {
			return err
		}
		tabs[i] = t
	}
	for i := 0; len(w.movedIdx) < movedFlows; i++ {
		if i >= 1<<24 {
			return fmt.Errorf("only %d moved flows in 2^24", len(w.movedIdx))
		}
		f := dataplane.Flow{Src: movedClient(i), Dst: w.vipC, SPort: uint16(1024 + i%60000), DPort: 443, Protocol: 6}
		h := dataplane.FlowHash(f, seed) % dataplane.DefaultRingSize
		if tabs[0].Backends[tabs[0].Slots[h]] != tabs[1].Backends[tabs[1].Slots[h]] {
			w.movedIdx = append(w.movedIdx, i)
		}
	}
	return nil
}

// movedClient is the client address of candidate flow i across the change.
func movedClient(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{198, 19, byte(i >> 16), byte(i >> 8)})
}

func (w *world) tcp(src, dst netip.Addr, sport uint16, flags uint8) []byte {
	return xdptest.Packet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: w.nic, Src: src, Dst: dst,
		Proto: xdptest.TCP, SPort: sport, DPort: 443, Flags: flags, Payload: make([]byte, 64)}.Bytes()
}

// benchCase is one row: a program and the frame for call i.
type benchCase struct {
	name     string
	prog     *ebpf.Program
	frame    func(i int) []byte
	distinct bool   // every call must see a new flow
	prep     []byte // sent once first (a SYN whose connection the row's frames carry)
	setup    func() error
}

func (w *world) cases() []benchCase {
	est4 := w.tcp(w.client4, w.vip4, 40000, xdptest.ACK)
	pinned := func(flags uint8) []byte {
		j := w.movedIdx[0]
		return w.tcp(movedClient(j), w.vipC, uint16(1024+j%60000), flags)
	}
	est6 := w.tcp(w.client6, w.vip6, 40000, xdptest.ACK)
	other := w.tcp(w.client4, netip.MustParseAddr("192.0.2.99"), 40000, xdptest.ACK)
	same := func(f []byte) func(int) []byte { return func(int) []byte { return f } }
	return []benchCase{
		{name: "floor: bare XDP_TX", prog: w.floor, frame: same(est4)},
		{name: "established TCP v4", prog: w.d.Program(), frame: same(est4)},
		{name: "new TCP v4 flow (SYN)", prog: w.d.Program(), distinct: true, frame: func(i int) []byte {
			src := netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})
			return w.tcp(src, w.vip4, uint16(1024+i%60000), xdptest.SYN)
		}},
		{name: "established TCP v6", prog: w.d.Program(), frame: same(est6)},
		{name: "non-VIP pass", prog: w.d.Program(), frame: same(other)},
		// Outside transitions, connections held off the ring (their holders'
		// reports, PinHeld) keep flows consulted for packets the flow cache
		// misses, not for SYNs (held_clock). Before any row that makes a
		// director's pin: those make every SYN look at flows for an hour.
		{name: "new TCP v4 flow (SYN), held connections pinned", prog: w.d.Program(), distinct: true, setup: w.pinHeld, frame: func(i int) []byte {
			src := netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})
			return w.tcp(src, w.vip4, uint16(1024+i%60000), xdptest.SYN)
		}},
		{name: "established TCP v4, held connections pinned", prog: w.d.Program(), setup: w.pinHeld, frame: same(est4)},
		{name: "new TCP v4 flow (SYN) in a ring transition", prog: w.d.Program(), distinct: true, frame: func(i int) []byte {
			src := netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})
			return w.tcp(src, w.vipC, uint16(1024+i%60000), xdptest.SYN)
		}},
		{name: "non-SYN packet of a flow across a ring change", prog: w.d.Program(), distinct: true, frame: func(i int) []byte {
			j := w.movedIdx[i%len(w.movedIdx)]
			return w.tcp(movedClient(j), w.vipC, uint16(1024+j%60000), xdptest.ACK)
		}},
		// Opened in the transition: its handshake pinned it, and a pin holds
		// while the director's own stack says it may (a socket lookup).
		{name: "packet of a connection pinned in a ring transition", prog: w.d.Program(), frame: same(pinned(xdptest.ACK)), prep: pinned(xdptest.SYN)},
	}
}

// heldPins is how many held connections pinHeld pins.
const heldPins = 10_000

// pinHeld pins heldPins connections to vip4 to its first replica, as the
// holders' reports do.
func (w *world) pinHeld() error {
	held := make([]dataplane.Held, heldPins)
	for i := range held {
		held[i] = dataplane.Held{Holder: netip.AddrFrom4([4]byte{10, 0, 0, 11}),
			Flow: dataplane.Flow{Src: netip.AddrFrom4([4]byte{198, 20, byte(i >> 8), byte(i)}), Dst: w.vip4, SPort: 50000, DPort: 443, Protocol: 6}}
	}
	_, err := w.d.PinHeld(held)
	return err
}

// Run measures xdp_lb's per-packet cost for the standard cases. It needs root;
// it pins its own maps under a temporary path and removes them.
func Run(o Options) ([]Result, error) {
	if o.Repeat <= 0 {
		o.Repeat = 1_000_000
	}
	if o.Packets <= 0 {
		o.Packets = 20_000
	}
	w, err := newWorld()
	if err != nil {
		return nil, err
	}
	defer w.cleanup()

	var out []Result
	for _, c := range w.cases() {
		if c.setup != nil {
			if err := c.setup(); err != nil {
				return nil, fmt.Errorf("%s: %w", c.name, err)
			}
		}
		if c.prep != nil {
			if _, _, err := c.prog.Test(c.prep); err != nil {
				return nil, fmt.Errorf("%s: %w", c.name, err)
			}
		}
		// Warm up: the established cases create their flow here.
		verdict, _, err := c.prog.Test(c.frame(0))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.name, err)
		}
		r := Result{Name: c.name, Verdict: xdptest.VerdictName(verdict), Runs: o.Packets}
		if c.distinct {
			var sum time.Duration
			for i := 1; i <= o.Packets; i++ {
				_, d, err := c.prog.Benchmark(c.frame(i), 1, nil)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", c.name, err)
				}
				sum += d
			}
			r.Repeat = sum / time.Duration(o.Packets)
			// The flows those calls created would make the next pass all hits.
			if err := w.d.ClearFlows(); err != nil {
				return nil, err
			}
		} else {
			_, d, err := c.prog.Benchmark(c.frame(0), o.Repeat, nil)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", c.name, err)
			}
			r.Repeat = d
		}
		// Statistics cost two clock reads per run, so they are on only here.
		if r.PerRun, err = perRun(c, o.Packets); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// perRun sends n single-packet calls with BPF run-time statistics enabled and
// returns the program's run time per run.
func perRun(c benchCase, n int) (time.Duration, error) {
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return 0, fmt.Errorf("enable BPF run-time statistics: %w", err)
	}
	defer stats.Close()
	before, err := c.prog.Stats()
	if err != nil {
		return 0, fmt.Errorf("%s: read program stats: %w", c.name, err)
	}
	for i := 1; i <= n; i++ {
		if _, _, err := c.prog.Test(c.frame(i)); err != nil {
			return 0, fmt.Errorf("%s: %w", c.name, err)
		}
	}
	after, err := c.prog.Stats()
	if err != nil {
		return 0, fmt.Errorf("%s: read program stats: %w", c.name, err)
	}
	runs := after.RunCount - before.RunCount
	if runs == 0 {
		return 0, fmt.Errorf("%s: no runs counted", c.name)
	}
	return (after.Runtime - before.Runtime) / time.Duration(runs), nil
}
