package vrrp

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

type advertEvent struct {
	adv Advert
	src netip.Addr
}

type priorityEvent struct{ p uint8 }

// vipsEvent replaces the virtual router's addresses (SetVIPs); done gets the
// outcome.
type vipsEvent struct {
	vips []netip.Addr
	done chan error
}

// peersEvent replaces the virtual router's unicast peers (SetPeers); done gets
// the outcome.
type peersEvent struct {
	peers []netip.Addr
	done  chan error
}

// instance is one virtual router: its state machine and the goroutine that feeds
// it events and real time, and carries out its outputs.
type instance struct {
	a       *Announcer
	cfg     InstanceConfig
	is4     bool
	primary netip.Addr
	vips    []netip.Addr // in configured order, as adverts carry them; the run goroutine's
	// sorted is vips sorted, for the readers of adverts and claims (which
	// compare with it while SetVIPs may change it).
	sorted atomic.Pointer[[]netip.Addr]
	dsts   []netip.Addr // where adverts go: the group, or the peers but us; the run goroutine's
	// peers are the unicast peers adverts are accepted from (none: any
	// source), for the readers of adverts while SetPeers may change them.
	peers   atomic.Pointer[[]netip.Addr]
	m       *Machine
	log     *zap.Logger
	events  chan any
	stopped chan struct{} // closed when run returns
	state   atomic.Uint32

	// claims holds at most one pending claim on our VIPs: a flood of them
	// coalesces here instead of filling events and holding up adverts.
	claims   chan claim
	claimLog *limiter
	// garp sends one announcement of a VIP (ARP or NDP); a field so tests can
	// count announcements without sockets.
	garp func(vip netip.Addr, count func(kind string)) error

	garpLeft int       // announcements left in the current burst
	garpNext time.Time // when the next announcement is due; zero: none
	garpLast time.Time // when the last announcement went out

	// This instance's series, resolved once rather than per packet.
	mState, mPriority        prometheus.Gauge
	mSent, mReceived, mConfl prometheus.Counter
	mMismatch                prometheus.Counter
	mGARP                    map[string]prometheus.Counter // by kind
	countGARP                func(kind string)
}

// minClaimHoldoff is the least time after an announcement during which a claim
// is not answered with another, whatever GARPSpacing says: with no hold-off, two
// Masters of a split brain would answer each other's announcements without end.
const minClaimHoldoff = 10 * time.Millisecond

func newInstance(a *Announcer, ic InstanceConfig, is4 bool, primary netip.Addr) *instance {
	in := &instance{
		a: a, cfg: ic, is4: is4, primary: primary,
		log:      a.log.With(zap.String("instance", ic.Name), zap.Uint8("vrid", ic.VRID), zap.String("iface", a.cfg.Interface)),
		events:   make(chan any, 64),
		stopped:  make(chan struct{}),
		claims:   make(chan claim, 1),
		claimLog: newLimiter(10 * time.Second),
	}
	switch {
	case is4 && a.arp != nil:
		in.garp = a.arp.announce
	case !is4 && a.ndp != nil:
		in.garp = a.ndp.announce
	default:
		in.garp = func(netip.Addr, func(string)) error { return errors.New("no arp/ndp socket") }
	}
	in.setAddrs(ic.VIPs)
	met := a.met
	in.mState, in.mPriority = met.state.WithLabelValues(ic.Name), met.priority.WithLabelValues(ic.Name)
	in.mSent, in.mReceived = met.advertsSent.WithLabelValues(ic.Name), met.advertsReceived.WithLabelValues(ic.Name)
	in.mConfl = met.conflicts.WithLabelValues(ic.Name)
	in.mMismatch = met.addressMismatch.WithLabelValues(ic.Name)
	in.mGARP = map[string]prometheus.Counter{}
	kinds := []string{kindNA}
	if is4 {
		kinds = []string{kindARPRequest, kindARPReply}
	}
	for _, k := range kinds {
		in.mGARP[k] = met.garpSent.WithLabelValues(ic.Name, k)
	}
	in.countGARP = func(kind string) {
		c := in.mGARP[kind]
		if c == nil {
			c = met.garpSent.WithLabelValues(ic.Name, kind)
		}
		c.Inc()
	}
	in.setPeers(ic.Peers)
	in.m = NewMachine(MachineConfig{
		Version:      ic.Version,
		Priority:     ic.Priority,
		Interval:     ic.AdvertInterval.Duration,
		Preempt:      !ic.NoPreempt,
		PreemptDelay: ic.PreemptDelay.Duration,
		Primary:      primary,
	})
	in.mState.Set(float64(StateInit))
	in.mPriority.Set(float64(ic.Priority))
	return in
}

// setPeers makes peers the router's unicast peers: adverts go to each but this
// node (to the multicast group when there are none), and come only from them
// (unless AcceptAnySource).
func (in *instance) setPeers(peers []netip.Addr) {
	peers = slices.Clone(peers)
	in.peers.Store(&peers)
	in.dsts = nil
	switch {
	case len(peers) == 0 && in.is4:
		in.dsts = []netip.Addr{GroupIPv4}
	case len(peers) == 0:
		in.dsts = []netip.Addr{GroupIPv6}
	default:
		// A shared peer list names this node too: no advert to ourselves.
		for _, p := range peers {
			if p != in.primary {
				in.dsts = append(in.dsts, p)
			}
		}
		if len(in.dsts) == 0 {
			in.log.Warn("the only unicast peer is this node's own address: no adverts will be sent", zap.Stringer("primary", in.primary))
		}
	}
}

// setAddrs makes vips the router's addresses.
func (in *instance) setAddrs(vips []netip.Addr) {
	in.vips = nil
	for _, v := range vips {
		in.vips = append(in.vips, v.Unmap())
	}
	sorted := slices.SortedFunc(slices.Values(in.vips), netip.Addr.Compare)
	in.sorted.Store(&sorted)
}

// has reports whether vip is one of the router's addresses.
func (in *instance) has(vip netip.Addr) bool {
	_, ok := slices.BinarySearchFunc(*in.sorted.Load(), vip, netip.Addr.Compare)
	return ok
}

// check applies the per-router validation that needs the configuration. An
// advert of VRRP version 3 whose addresses differ from ours but share one with
// them is accepted, and counted as a mismatch: that is our own virtual router
// while its addresses change (SetVIPs reaches each node at its own moment), and
// RFC 5798 §7.1 asks only that it be logged. Version 2 drops it, as RFC 3768
// §7.1 requires.
func (in *instance) check(adv Advert, src netip.Addr) (Reason, error) {
	if peers := *in.peers.Load(); len(peers) > 0 && !in.cfg.AcceptAnySource && !slices.Contains(peers, src) {
		return ReasonPeer, fmt.Errorf("source %v is not a configured peer", src)
	}
	if adv.Version != in.cfg.Version {
		return ReasonMismatch, fmt.Errorf("version %d, configured %d", adv.Version, in.cfg.Version)
	}
	if adv.Version == 2 && adv.Interval != in.cfg.AdvertInterval.Duration {
		// RFC 3768 §7.1: the interval must match ours.
		return ReasonMismatch, fmt.Errorf("interval %v, configured %v", adv.Interval, in.cfg.AdvertInterval.Duration)
	}
	if sorted := *in.sorted.Load(); !sameAddrs(adv.Addrs, sorted) {
		err := fmt.Errorf("addresses %v, configured %v", adv.Addrs, sorted)
		if adv.Version == 3 && slices.ContainsFunc(adv.Addrs, in.has) {
			in.mMismatch.Inc()
			if n, ok := in.claimLog.allow("addrs", time.Now()); ok {
				in.log.Info("advert accepted with other addresses: are they changing?", zap.Stringer("src", src), zap.Int("suppressed", n), zap.Error(err))
			}
			return "", nil
		}
		return ReasonAddrs, err
	}
	return "", nil
}

// sameAddrs reports whether got (a decoded advert's own list, sorted here in
// place) holds the addresses of sorted.
func sameAddrs(got, sorted []netip.Addr) bool {
	if len(got) != len(sorted) {
		return false
	}
	slices.SortFunc(got, netip.Addr.Compare)
	return slices.Equal(got, sorted)
}

// takeoverLead is how early the Backup's timer wakes before Master_Down_Timer
// expires, to wait out the rest precisely: Go's timers can fire up to a
// millisecond late, and this timer decides how long clients see no Master.
const takeoverLead = 2 * time.Millisecond

func (in *instance) run(ctx context.Context) {
	defer close(in.stopped)
	in.apply(in.m.Start(time.Now()))
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next, ok := in.m.Deadline()
		if !ok {
			next = time.Now().Add(time.Hour)
		}
		if !in.garpNext.IsZero() && in.garpNext.Before(next) {
			next = in.garpNext
		}
		wake := next
		if in.m.State() == StateBackup {
			wake = next.Add(-takeoverLead)
		}
		timer.Reset(time.Until(wake))
		select {
		case <-ctx.Done():
			in.apply(in.m.Stop(time.Now()))
			return
		case ev := <-in.events:
			in.handle(ev)
		case c := <-in.claims:
			in.reannounce(c, time.Now())
		case <-timer.C:
			if in.m.State() == StateBackup {
				// Wait out the lead, unless an advert comes in meanwhile;
				// bounded by next, at most takeoverLead away.
				for time.Now().Before(next) && len(in.events) == 0 {
					runtime.Gosched()
				}
				in.drain()
			}
			now := time.Now()
			in.apply(in.m.Tick(now))
			in.garpDue(now)
		}
	}
}

// drain handles every event already queued, so a timer never wins over an
// advert that arrived before it fired.
func (in *instance) drain() {
	for range cap(in.events) {
		select {
		case ev := <-in.events:
			in.handle(ev)
		default:
			return
		}
	}
}

func (in *instance) handle(ev any) {
	now := time.Now()
	switch ev := ev.(type) {
	case advertEvent:
		in.apply(in.m.Advert(now, ev.adv, ev.src))
	case priorityEvent:
		in.log.Info("vrrp priority changed", zap.Uint8("from", in.m.Priority()), zap.Uint8("to", max(ev.p, 1)))
		in.apply(in.m.SetPriority(now, ev.p))
		in.mPriority.Set(float64(in.m.Priority()))
	case vipsEvent:
		ev.done <- in.changeVIPs(ev.vips, now)
	case peersEvent:
		in.log.Info("vrrp peers changed", zap.Stringers("peers", ev.peers), zap.Stringer("state", in.m.State()))
		in.setPeers(ev.peers)
		ev.done <- nil
	}
}

// changeVIPs makes vips the router's addresses without a change of state. A
// Master puts the new ones on the interface, takes the old ones off, and
// advertises and announces at once, so the Backups learn the list and clients
// the new addresses now rather than at the next interval.
func (in *instance) changeVIPs(vips []netip.Addr, now time.Time) error {
	old := in.vips
	in.setAddrs(vips)
	added := slices.DeleteFunc(slices.Clone(in.vips), func(v netip.Addr) bool { return slices.Contains(old, v) })
	removed := slices.DeleteFunc(slices.Clone(old), in.has)
	in.log.Info("vrrp addresses changed", zap.Stringers("added", added), zap.Stringers("removed", removed), zap.Stringer("state", in.m.State()))
	if in.m.State() != StateMaster {
		return nil
	}
	var errs []error
	for _, v := range added {
		if err := addVIP(in.a.nl, in.a.link, v); err != nil {
			errs = append(errs, fmt.Errorf("add vip %v: %w", v, err))
		}
	}
	for _, v := range removed {
		if err := delVIP(in.a.nl, in.a.link, v); err != nil {
			errs = append(errs, fmt.Errorf("remove vip %v: %w", v, err))
		}
	}
	in.sendAdvert(in.m.Priority())
	in.startBurst(now)
	return errors.Join(errs...)
}

// claimed is called by the ARP / NDP reader for each claim on one of our VIPs by
// a foreign MAC. While Master, every claim is counted and logged (rate-limited),
// and handed on for re-announcement; one pending claim is enough, so the rest
// are dropped rather than queued.
func (in *instance) claimed(c claim, now time.Time) {
	if State(in.state.Load()) != StateMaster {
		return
	}
	in.mConfl.Inc()
	if n, ok := in.claimLog.allow(c.vip.String(), now); ok {
		in.log.Warn("vip claimed by another station",
			zap.Stringer("vip", c.vip), zap.Stringer("mac", c.mac), zap.Int("suppressed", n))
	}
	select {
	case in.claims <- c:
	default:
	}
}

// reannounce answers a claim with a fresh burst of announcements, unless one is
// running or the last announcement went out within the hold-off: our own
// announcement is a claim for another Master, and answering every claim at
// once would have two Masters of a split brain flood the segment.
func (in *instance) reannounce(c claim, now time.Time) {
	if in.m.State() != StateMaster || in.garpLeft > 0 {
		return
	}
	if holdoff := max(in.cfg.GARPSpacing.Duration, minClaimHoldoff); now.Sub(in.garpLast) < holdoff {
		return
	}
	in.log.Debug("re-announcing after a claim", zap.Stringer("vip", c.vip), zap.Stringer("mac", c.mac))
	in.startBurst(now)
}

// garpDue sends the next announcement of a burst or refresh if it is due.
func (in *instance) garpDue(now time.Time) {
	if !in.garpNext.IsZero() && !now.Before(in.garpNext) {
		in.announce(now)
	}
}

// apply carries out a state-machine output: the advert first (so a competing
// Master steps down at once), then the VIPs and the announcements.
func (in *instance) apply(out Output) {
	if out.Send {
		in.sendAdvert(out.SendPriority)
	}
	t := out.Transition
	if t == nil {
		return
	}
	in.state.Store(uint32(t.To))
	// Client-visible work first: the VIPs and their announcement, then the
	// bookkeeping.
	switch {
	case t.To == StateMaster:
		for _, v := range in.vips {
			if err := addVIP(in.a.nl, in.a.link, v); err != nil {
				in.log.Error("add vip", zap.Stringer("vip", v), zap.Error(err))
			}
		}
		in.startBurst(time.Now())
	case t.From == StateMaster:
		in.garpNext, in.garpLeft = time.Time{}, 0
		for _, v := range in.vips {
			if err := delVIP(in.a.nl, in.a.link, v); err != nil {
				in.log.Error("remove vip", zap.Stringer("vip", v), zap.Error(err))
			}
		}
	}
	in.mState.Set(float64(t.To))
	in.a.met.transitions.WithLabelValues(in.cfg.Name, t.From.String(), t.To.String()).Inc()
	in.log.Info("vrrp state changed", zap.Stringer("from", t.From), zap.Stringer("to", t.To), zap.String("reason", t.Reason))
}

func (in *instance) sendAdvert(prio uint8) {
	adv := Advert{Version: in.cfg.Version, VRID: in.cfg.VRID, Priority: prio, Interval: in.cfg.AdvertInterval.Duration, Addrs: in.vips}
	conn := in.a.conns[in.is4]
	for _, dst := range in.dsts {
		b, err := Encode(adv, in.primary, dst)
		if err == nil {
			err = conn.send(b, in.primary, dst)
		}
		if err != nil {
			in.log.Error("send advert", zap.Stringer("dst", dst), zap.Error(err))
			continue
		}
		in.mSent.Inc()
	}
}

// startBurst announces the VIPs now and schedules the rest of the burst.
func (in *instance) startBurst(now time.Time) {
	in.garpLeft = in.cfg.GARPCount
	in.announce(now)
}

// announce sends one round of gratuitous ARP / NA for every VIP and schedules the
// next: the rest of the burst, then the periodic refresh.
func (in *instance) announce(now time.Time) {
	for _, v := range in.vips {
		if err := in.garp(v, in.countGARP); err != nil {
			in.log.Error("announce vip", zap.Stringer("vip", v), zap.Error(err))
		}
	}
	in.garpLast = now
	if in.garpLeft > 0 {
		in.garpLeft--
	}
	switch {
	case in.garpLeft > 0:
		in.garpNext = now.Add(in.cfg.GARPSpacing.Duration)
	case in.cfg.GARPRefresh.Duration > 0:
		in.garpNext = now.Add(in.cfg.GARPRefresh.Duration)
	default:
		in.garpNext = time.Time{}
	}
}
