package main

import (
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/portico-edge/portico/agent"
	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/dataplane/xdpbench"
)

// The subcommands in this file read xdp_lb's pinned maps; they need no agent.

func pinFlag(fs *flag.FlagSet) *string {
	return fs.String("pin", dataplane.DefaultPinPath, "bpffs directory of xdp_lb's pinned maps")
}

// inspect parses a map-reading subcommand's flags (-pin, plus any that flags
// adds), opens the pinned maps and hands them to show.
func inspect(name string, args []string, flags func(*flag.FlagSet), show func(*dataplane.Inspector) error) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	pin := pinFlag(fs)
	if flags != nil {
		flags(fs)
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	in, err := dataplane.OpenPinned(*pin)
	if err != nil {
		return err
	}
	defer in.Close()
	return show(in)
}

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

func runVIPs(args []string) error {
	return inspect("vips", args, nil, func(in *dataplane.Inspector) error {
		cfg, err := in.Config()
		if err != nil {
			return err
		}
		vips, err := in.VIPs()
		if err != nil {
			return err
		}
		return printVIPs(os.Stdout, cfg, vips)
	})
}

func printVIPs(out io.Writer, cfg dataplane.Config, vips []dataplane.VIPView) error {
	fmt.Fprintf(out, "ring size %d, hash seed %#x, NIC MAC %s\n\n", cfg.RingSize, cfg.Seed, cfg.MAC)
	if len(vips) == 0 {
		fmt.Fprintln(out, "no VIPs")
		return nil
	}
	w := table(out)
	fmt.Fprintln(w, "VIP\tPORTS\tDIGEST\tPACKETS\tNEW FLOWS\tFLOW HITS\t")
	for _, v := range vips {
		ports := make([]string, len(v.Ports))
		for i, p := range v.Ports {
			port := "*"
			if p.Port != 0 {
				port = fmt.Sprint(p.Port)
			}
			ports[i] = strings.ToLower(string(p.Protocol)) + "/" + port
		}
		digest := v.Digest
		if digest == "" {
			digest = "(no ring)"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%d\t\n", v.Addr, strings.Join(ports, ","), digest, v.Counters.Packets, v.Counters.NewFlows, v.Counters.FlowHits)
	}
	w.Flush()
	for _, v := range vips {
		fmt.Fprintf(out, "\n%s backends:\n", v.Addr)
		w := table(out)
		fmt.Fprintln(w, "  ID\tADDRESS\tMAC\tSTATE\tWEIGHT\tSLOTS\tSHARE\tPACKETS\tBYTES\t")
		for _, b := range v.Backends {
			state := "ready"
			if b.Draining {
				state = "draining"
			}
			if b.Remote {
				state = "other site"
			}
			if b.Local {
				state += ",local"
			}
			share := 0.0
			if v.RingSize > 0 {
				share = 100 * float64(b.Slots) / float64(v.RingSize)
			}
			fmt.Fprintf(w, "  %d\t%s\t%s\t%s\t%d\t%d\t%.2f%%\t%d\t%d\t\n", b.ID, b.Addr, b.MAC, state, b.Weight, b.Slots, share, b.Counters.Packets, b.Counters.Bytes)
		}
		w.Flush()
	}
	return nil
}

func runFlows(args []string) error {
	var limit *int
	flags := func(fs *flag.FlagSet) {
		limit = fs.Int("n", 50, "show at most this many flows, most recently seen first (0: all)")
	}
	return inspect("flows", args, flags, func(in *dataplane.Inspector) error { return printFlows(in, *limit) })
}

func printFlows(in *dataplane.Inspector, limit int) error {
	flows, err := in.Flows(limit)
	if err != nil {
		return err
	}
	w := table(os.Stdout)
	fmt.Fprintln(w, "PROTO\tCLIENT\tVIP\tBACKEND\tLAST SEEN\t")
	for _, f := range flows {
		proto := map[uint8]string{6: "tcp", 17: "udp"}[f.Flow.Protocol]
		backend := "(gone)"
		if f.Backend.IsValid() {
			backend = f.Backend.String()
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s ago\t\n", proto,
			netip.AddrPortFrom(f.Flow.Src, f.Flow.SPort), netip.AddrPortFrom(f.Flow.Dst, f.Flow.DPort), backend, f.Age.Round(1e6))
	}
	w.Flush()
	fmt.Printf("%d flows shown\n", len(flows))
	return nil
}

func runCounters(args []string) error {
	return inspect("counters", args, nil, func(in *dataplane.Inspector) error {
		c, err := in.Counters()
		if err != nil {
			return err
		}
		w := table(os.Stdout)
		fmt.Fprintln(w, "REASON\tPACKETS\t")
		for r, v := range c.Reasons {
			fmt.Fprintf(w, "%s\t%d\t\n", dataplane.ReasonName(dataplane.Reason(r)), v)
		}
		return w.Flush()
	})
}

func runMaglev(args []string) error {
	fs := flag.NewFlagSet("maglev", flag.ContinueOnError)
	size := fs.Uint("m", uint(dataplane.DefaultRingSize), "table size (a prime)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: portico maglev [-m size] ADDR[=WEIGHT]...\n\nBuilds the Maglev table every node builds for these replicas and prints each one's share and the table digest.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	var in []dataplane.MaglevBackend
	for _, a := range fs.Args() {
		addr, weight, _ := strings.Cut(a, "=")
		ip, err := netip.ParseAddr(addr)
		if err != nil {
			return fmt.Errorf("parse backend %q: %w", a, err)
		}
		b := dataplane.MaglevBackend{Addr: ip, Weight: 1}
		if weight != "" {
			if _, err := fmt.Sscan(weight, &b.Weight); err != nil {
				return fmt.Errorf("parse weight of %q: %w", a, err)
			}
		}
		in = append(in, b)
	}
	t, err := dataplane.BuildTable(in, uint32(*size))
	if err != nil {
		return err
	}
	w := table(os.Stdout)
	fmt.Fprintln(w, "BACKEND\tSLOTS\tSHARE\t")
	for i, n := range t.Shares() {
		fmt.Fprintf(w, "%s\t%d\t%.3f%%\t\n", t.Backends[i], n, 100*float64(n)/float64(len(t.Slots)))
	}
	w.Flush()
	fmt.Printf("digest %s (%d slots)\n", t.Digest(), len(t.Slots))
	return nil
}

func runBench(args []string) error {
	if len(args) == 0 || args[0] != "xdp" {
		return fmt.Errorf("usage: portico bench xdp [-repeat N] [-packets N]")
	}
	fs := flag.NewFlagSet("bench xdp", flag.ContinueOnError)
	repeat := fs.Int("repeat", 1_000_000, "repetitions per call in Repeat mode")
	packets := fs.Int("packets", 20_000, "single-packet calls in run-time-statistics mode")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	res, err := xdpbench.Run(xdpbench.Options{Repeat: *repeat, Packets: *packets})
	if err != nil {
		return err
	}
	fmt.Println("xdp_lb per-packet cost under BPF_PROG_TEST_RUN")
	fmt.Printf("  repeat:  kernel average over %d repetitions of one call (new flows: 1 repetition per call, %d distinct tuples)\n", *repeat, *packets)
	fmt.Printf("  per run: BPF_ENABLE_STATS run time / run count, one packet per call, %d calls\n\n", *packets)
	w := table(os.Stdout)
	fmt.Fprintln(w, "CASE\tVERDICT\tREPEAT ns/pkt\tPER RUN ns/pkt\tvs FLOOR (repeat)\tvs FLOOR (per run)\t")
	var floor, floorRun float64
	for i, r := range res {
		if i == 0 {
			floor, floorRun = float64(r.Repeat.Nanoseconds()), float64(r.PerRun.Nanoseconds())
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\t%s\t\n", r.Name, r.Verdict, r.Repeat.Nanoseconds(), r.PerRun.Nanoseconds(),
			ratio(float64(r.Repeat.Nanoseconds()), floor), ratio(float64(r.PerRun.Nanoseconds()), floorRun))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Println("\ntargets (per run): a new flow at most 3x the floor, an established packet at most 2x")
	fmt.Println("(in a ring transition, a SYN in a slot the change moved is remembered: see bpf/README.md)")
	return nil
}

func ratio(x, floor float64) string {
	if floor <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", x/floor)
}

// runUninstall undoes everything the agent set up on the node: the XDP program
// and its pins (the steering program's too), the VIPs on lo and the
// direct-server-return sysctls. It refuses while an agent runs on the node. An
// agent whose DaemonSet is deleted (helm uninstall) does the same as it stops.
func runUninstall(args []string) error {
	fs := flag.NewFlagSet("uninstall", flag.ContinueOnError)
	pin := pinFlag(fs)
	state := fs.String("state-dir", agent.DefaultStateDir, "the agent's state directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := agent.UndoNode(*pin, *state); err != nil {
		return err
	}
	fmt.Printf("detached xdp_lb and removed %s; removed the agent's VIPs from lo, restored its sysctls, removed %s\n", *pin, *state)
	return nil
}

func runTrace(args []string) error {
	var fs *flag.FlagSet
	var udp *bool
	flags := func(f *flag.FlagSet) {
		fs = f
		udp = f.Bool("udp", false, "the flow is UDP (default TCP)")
		f.Usage = func() {
			fmt.Fprintln(f.Output(), "usage: portico trace [-udp] CLIENT:PORT VIP:PORT\n\nShows what this node's maps say about one flow: its ring slot, the replica each ring of a transition gives it (in the order xdp_lb walks them), and any pin.")
			f.PrintDefaults()
		}
	}
	return inspect("trace", args, flags, func(in *dataplane.Inspector) error {
		if fs.NArg() != 2 {
			fs.Usage()
			return fmt.Errorf("trace needs CLIENT:PORT and VIP:PORT")
		}
		var ends [2]netip.AddrPort
		for i, a := range fs.Args() {
			ap, err := netip.ParseAddrPort(a)
			if err != nil {
				return fmt.Errorf("parse %q: %w", a, err)
			}
			ends[i] = ap
		}
		f := dataplane.Flow{Src: ends[0].Addr(), SPort: ends[0].Port(), Dst: ends[1].Addr(), DPort: ends[1].Port(), Protocol: unix.IPPROTO_TCP}
		if *udp {
			f.Protocol = unix.IPPROTO_UDP
		}
		tr, err := in.Trace(f)
		if err != nil {
			return err
		}
		return printTrace(os.Stdout, tr)
	})
}

func printTrace(out io.Writer, t dataplane.Trace) error {
	proto := map[uint8]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp"}[t.Flow.Protocol]
	fmt.Fprintf(out, "%s %s -> %s\n", proto, netip.AddrPortFrom(t.Flow.Src, t.Flow.SPort), netip.AddrPortFrom(t.Flow.Dst, t.Flow.DPort))
	if !t.VIP {
		fmt.Fprintln(out, "not a VIP of this node: xdp_lb passes it to the stack")
		return nil
	}
	if t.Closed {
		fmt.Fprintln(out, "a VIP of this node on a port it does not serve: xdp_lb drops it (vip_closed)")
		return nil
	}
	moved := "no"
	if t.Moved {
		moved = "yes: a packet other than a SYN walks the rings below"
	}
	fmt.Fprintf(out, "VIP id %d, hash %#08x, slot %d, moved: %s\n", t.VIPID, t.Hash, t.Slot, moved)
	if t.Transition > 0 {
		fmt.Fprintf(out, "in a transition for %s more\n", t.Transition.Round(time.Millisecond))
	} else {
		fmt.Fprintln(out, "no transition: the current ring alone steers it")
	}
	w := table(out)
	fmt.Fprintln(w, "RING\tBACKEND\tSTATE\t")
	for _, r := range t.Rings {
		fmt.Fprintf(w, "%s\t%s\t\n", r.Ring, traceBackend(r.Backend))
	}
	for _, p := range []struct {
		name string
		pin  *dataplane.TracePin
	}{{"flows", t.Pinned}, {"new_pins", t.New}} {
		if p.pin == nil {
			fmt.Fprintf(w, "%s\t(none)\t\t\n", p.name)
			continue
		}
		how := "exact"
		switch {
		case p.pin.Hop == dataplane.PinGuess:
			how = "a director's guess"
		case p.pin.Hop > 0:
			how = fmt.Sprintf("handed on to place %d", p.pin.Hop)
		}
		fmt.Fprintf(w, "%s\t%s, %s, used %s ago\t\n", p.name, traceBackend(p.pin.Backend), how, p.pin.Seen.Round(time.Millisecond))
	}
	return w.Flush()
}

func traceBackend(b dataplane.TraceBackend) string {
	if b.ID == 0 {
		return "(none)\t"
	}
	switch {
	case b.Removed && !b.Addr.IsValid():
		return fmt.Sprintf("id %d (gone)\t", b.ID)
	case b.Removed:
		return fmt.Sprintf("%s\tremoved (id %d)", b.Addr, b.ID)
	}
	var state []string
	for _, s := range []struct {
		on   bool
		what string
	}{{b.Local, "this node"}, {b.Draining, "draining"}, {b.Down, "down"}, {b.Remote, "another site"}, {b.Spill, "spill"}} {
		if s.on {
			state = append(state, s.what)
		}
	}
	if len(state) == 0 {
		state = append(state, "serving")
	}
	return b.Addr.String() + "\t" + strings.Join(state, ", ")
}
