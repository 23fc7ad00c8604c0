package dataplane

import (
	"fmt"
	"slices"
	"strings"
)

// state describes the model: replicas, verdicts, directors.
func (w *pccWorld) state() string {
	var reps, others []string
	for i := range w.nodes {
		s := w.name(i)
		switch {
		case w.dead[i]:
			s += "(dead)"
		case w.down[i]:
			s += "(down)"
		}
		switch w.role[i] {
		case pccReady:
			reps = append(reps, s)
		case pccDraining:
			reps = append(reps, s+"(draining)")
		default:
			others = append(others, s)
		}
	}
	s := "replicas " + strings.Join(reps, " ")
	if len(others) > 0 {
		s += "; others " + strings.Join(others, " ")
	}
	var skews []string
	for k, v := range w.skew {
		skews = append(skews, fmt.Sprintf("%s alone calls %s %s", w.name(k[0]), w.name(k[1]), map[int]string{1: "down", -1: "up"}[v]))
	}
	if len(skews) > 0 {
		slices.Sort(skews)
		s += "; " + strings.Join(skews, ", ")
	}
	if !w.ecmp {
		return s + "; VRRP owner " + w.name(w.owner)
	}
	var on []string
	for _, i := range w.pool {
		if w.on[i] && !w.dead[i] {
			on = append(on, w.name(i))
		}
	}
	return s + "; ECMP over " + strings.Join(on, " ")
}

func (w *pccWorld) mode() string {
	var pool []string
	for _, i := range w.pool {
		pool = append(pool, w.name(i))
	}
	m := "VRRP"
	if w.ecmp {
		m = "ECMP"
	}
	return fmt.Sprintf("%s, %d nodes, directors %s", m, len(w.nodes), strings.Join(pool, " "))
}

func (w *pccWorld) summary() string {
	return fmt.Sprintf("%s: %s", w.mode(), w.stats)
}

func (f *pccFlow) String() string {
	return fmt.Sprintf("f%d %s:%d -> %s:%d", f.id, f.pkt.Src, f.pkt.SPort, f.pkt.Dst, f.pkt.DPort)
}

// opened says when a connection was opened, relative to the events.
func (w *pccWorld) opened(f *pccFlow) string {
	s := fmt.Sprintf("after e%d", f.after)
	if f.after == 0 {
		s = "before the first event"
	}
	s += ", SYN via " + w.name(f.via)
	if f.late >= 0 {
		s += fmt.Sprintf(" (while %s had not applied e%d)", w.name(f.late), f.after)
	}
	return s
}

// brief is a failure in one line.
func (w *pccWorld) brief(f *pccFailure) string {
	v := "v4"
	if f.flow.pkt.Src.Is6() {
		v = "v6"
	}
	skew := ""
	if f.late >= 0 {
		skew = fmt.Sprintf(" while %s lags", w.name(f.late))
	}
	return fmt.Sprintf("%s (%s, %s): %s of %s held by %s, opened %s%s: %s", f.class, w.mode(), v, f.what, f.flow, w.holderName(f.flow), w.opened(f.flow), skew, f.trip)
}

func (w *pccWorld) holderName(f *pccFlow) string {
	if f.holder < 0 {
		return "nobody"
	}
	return w.name(f.holder)
}

// report describes a failure: the world, the connection and its packets, and
// the events up to the failure.
func (w *pccWorld) report(f *pccFailure) string {
	var b strings.Builder
	selfview := ""
	if *pccSelfView != "learns" {
		selfview = " -pcc.selfview=" + *pccSelfView
	}
	fmt.Fprintf(&b, "seed %d, sequence %d (replay: go test -count=1 -run TestPCCModel ./dataplane/ -v -args -pcc.seed=%d -pcc.sequence=%d%s)\n",
		w.seed, w.seq, w.seed, w.seq, selfview)
	fmt.Fprintf(&b, "world: %s\n", w.mode())
	fmt.Fprintf(&b, "%s: %s of connection %s, held by %s, opened %s\n", f.class, f.what, f.flow, w.holderName(f.flow), w.opened(f.flow))
	if f.late >= 0 {
		fmt.Fprintf(&b, "sent while %s had not applied e%d\n", w.name(f.late), w.event)
	}
	fmt.Fprintf(&b, "hops: %s\n", f.trip)
	if f.trip.end == pccPassed && !f.trip.intact {
		fmt.Fprintf(&b, "frame passed (from byte 12): % x\nclient's frame (from byte 12): % x\n", f.trip.frame[12:], f.trip.in[12:])
	}
	fmt.Fprintf(&b, "its ring slot: %s\n", w.ringHistory(f.flow))
	fmt.Fprintf(&b, "what the live nodes hold for it now:\n%s", w.views(f.flow))
	fmt.Fprintf(&b, "its packets:\n")
	for _, h := range f.flow.history {
		fmt.Fprintf(&b, "  %s\n", h)
	}
	fmt.Fprintf(&b, "events:\n")
	for _, l := range w.log {
		fmt.Fprintf(&b, "  %s\n", l)
	}
	return b.String()
}
