package vrrp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
)

// pollInterval bounds how long a reader blocks before it checks for shutdown.
const pollInterval = 250 * time.Millisecond

// Announcer runs every virtual router of one interface: it owns the raw sockets,
// the ARP / NDP sockets and the netlink handle, and one goroutine per virtual
// router drives that router's state machine.
type Announcer struct {
	cfg  Config
	log  *zap.Logger
	met  *Metrics
	ifi  *net.Interface
	nl   *netlink.Handle
	link netlink.Link

	conns map[bool]*advertConn // by "is IPv4"
	arp   *arpAnnouncer
	ndp   *ndpAnnouncer

	insts  []*instance
	byVRID map[vridKey]*instance

	rejectLog *limiter
}

type vridKey struct {
	is4  bool
	vrid uint8
}

// New validates cfg, opens the sockets on its interface and removes any of its
// VIPs left on the interface by an earlier run (this node is not Master yet).
// Close releases what New opened if Run is never called.
func New(cfg Config, log *zap.Logger, met *Metrics) (*Announcer, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("vrrp config: %w", err)
	}
	a := &Announcer{
		cfg: cfg, log: log, met: met,
		conns:     map[bool]*advertConn{},
		byVRID:    map[vridKey]*instance{},
		rejectLog: newLimiter(10 * time.Second),
	}
	ok := false
	defer func() {
		if !ok {
			a.Close()
		}
	}()
	var err error
	if a.ifi, err = net.InterfaceByName(cfg.Interface); err != nil {
		return nil, fmt.Errorf("find interface %s: %w", cfg.Interface, err)
	}
	if a.nl, err = netlink.NewHandle(); err != nil {
		return nil, fmt.Errorf("open netlink: %w", err)
	}
	if a.link, err = a.nl.LinkByName(cfg.Interface); err != nil {
		return nil, fmt.Errorf("find link %s: %w", cfg.Interface, err)
	}
	allVIPs := map[netip.Addr]bool{}
	for _, ic := range cfg.Instances {
		for _, v := range ic.VIPs {
			allVIPs[v.Unmap()] = true
		}
	}
	for v := range allVIPs {
		bits, err := a.hostVIPBits(v)
		if err != nil {
			return nil, err
		}
		if bits >= 0 {
			log.Info("removing stale vip", zap.Stringer("vip", v), zap.String("iface", cfg.Interface))
			if err := delVIP(a.nl, a.link, v); err != nil {
				return nil, err
			}
		}
	}
	for _, ic := range cfg.Instances {
		is4 := ic.VIPs[0].Unmap().Is4()
		if a.conns[is4] == nil {
			if a.conns[is4], err = listenAdverts(a.ifi, is4); err != nil {
				return nil, err
			}
			if is4 {
				a.arp, err = dialARP(a.ifi)
			} else {
				a.ndp, err = dialNDP(a.ifi)
			}
			if err != nil {
				return nil, err
			}
		}
		primary, err := primaryAddr(a.nl, a.link, is4, allVIPs)
		if err != nil {
			return nil, err
		}
		in := newInstance(a, ic, is4, primary)
		a.insts = append(a.insts, in)
		a.byVRID[vridKey{is4, ic.VRID}] = in
	}
	ok = true
	return a, nil
}

// Run drives every virtual router until ctx is done, then shuts them down
// gracefully: a Master sends a priority-0 advert and removes its VIPs. It closes
// the sockets before it returns.
func (a *Announcer) Run(ctx context.Context) error {
	defer a.Close()
	var wg sync.WaitGroup
	instCtx, stopInsts := context.WithCancel(ctx)
	defer stopInsts()
	for _, in := range a.insts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in.run(instCtx)
		}()
	}
	readCtx, stopReaders := context.WithCancel(context.Background())
	var rg sync.WaitGroup
	for is4, c := range a.conns {
		rg.Add(1)
		go func() {
			defer rg.Done()
			a.readAdverts(readCtx, c, is4)
		}()
	}
	if a.arp != nil {
		rg.Add(1)
		go func() {
			defer rg.Done()
			a.readClaims(readCtx, a.arp.readClaim)
		}()
	}
	if a.ndp != nil {
		rg.Add(1)
		go func() {
			defer rg.Done()
			a.readClaims(readCtx, a.ndp.readClaim)
		}()
	}
	wg.Wait() // instances stop once ctx is done, after their shutdown adverts
	stopReaders()
	rg.Wait()
	return nil
}

// Close releases the sockets and the netlink handle. Run calls it.
func (a *Announcer) Close() error {
	var errs []error
	for _, c := range a.conns {
		errs = append(errs, c.close())
	}
	a.conns = map[bool]*advertConn{}
	if a.arp != nil {
		errs = append(errs, a.arp.close())
		a.arp = nil
	}
	if a.ndp != nil {
		errs = append(errs, a.ndp.close())
		a.ndp = nil
	}
	if a.nl != nil {
		a.nl.Close()
		a.nl = nil
	}
	return errors.Join(errs...)
}

// SetPriority sets the effective priority of the named virtual router, e.g. lower
// when the local XDP program is not attached or nginx is unhealthy, so the VIP
// moves to a healthy node; set it back to the configured priority when healthy.
func (a *Announcer) SetPriority(ctx context.Context, name string, p uint8) error {
	for _, in := range a.insts {
		if in.cfg.Name == name {
			select {
			case in.events <- priorityEvent{p}:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return fmt.Errorf("set priority: no instance %q", name)
}

// hostVIPBits is the prefix length vip has on the interface (-1: not there),
// and an error if it is there with a subnet: a VIP is a host address the
// announcer adds and removes; an address with a subnet is the node's own, never
// to be touched.
func (a *Announcer) hostVIPBits(v netip.Addr) (int, error) {
	bits, err := vipBits(a.nl, a.link, v)
	if err != nil {
		return 0, err
	}
	if host := v.BitLen(); bits >= 0 && bits != host {
		return 0, fmt.Errorf("vip %v is on %s as a /%d, not a /%d: is it the node's own address?", v, a.cfg.Interface, bits, host)
	}
	return bits, nil
}

// SetVIPs makes vips the addresses of the named virtual router while it runs:
// its state stays (a Master stays Master, now with the new addresses on the
// interface, and advertises and announces them at once), so adding or removing
// an address never moves the others, as keepalived keeps its state across a
// reload. The addresses must be of the router's family and not of another
// router; a host address of the node's own is refused, as New refuses it.
func (a *Announcer) SetVIPs(ctx context.Context, name string, vips []netip.Addr) error {
	var in *instance
	for _, x := range a.insts {
		if x.cfg.Name == name {
			in = x
		}
	}
	if in == nil {
		return fmt.Errorf("set vips: no instance %q", name)
	}
	if a.nl == nil {
		return fmt.Errorf("set vips of %s: the announcer has stopped", name)
	}
	cfg := a.cfg
	cfg.Instances = slices.Clone(cfg.Instances)
	for i := range cfg.Instances {
		if cfg.Instances[i].Name == name {
			cfg.Instances[i].VIPs = vips
		}
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("set vips of %s: %w", name, err)
	}
	if len(vips) > 0 && vips[0].Unmap().Is4() != in.is4 {
		return fmt.Errorf("set vips of %s: %v is not of the router's family", name, vips[0])
	}
	for _, v := range vips {
		v = v.Unmap()
		for _, other := range a.insts {
			if other != in && other.has(v) {
				return fmt.Errorf("set vips of %s: %v belongs to %s", name, v, other.cfg.Name)
			}
		}
		if in.has(v) {
			continue
		}
		if _, err := a.hostVIPBits(v); err != nil {
			return fmt.Errorf("set vips of %s: %w", name, err)
		}
	}
	ev := vipsEvent{vips: slices.Clone(vips), done: make(chan error, 1)}
	select {
	case in.events <- ev:
	case <-in.stopped:
		return fmt.Errorf("set vips of %s: the announcer has stopped", name)
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-ev.done:
		return err
	case <-in.stopped:
		return fmt.Errorf("set vips of %s: the announcer has stopped", name)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// SetPeers makes peers the unicast peers of the named virtual router while it
// runs, as SetVIPs does its addresses: its state stays, its adverts go to the new
// peers from the next one on, and only adverts from them are accepted (unless
// AcceptAnySource). No peers: multicast, from any source. The peers are checked
// as New checks them (IPv6 peers by their link-local addresses).
func (a *Announcer) SetPeers(ctx context.Context, name string, peers []netip.Addr) error {
	var in *instance
	for _, x := range a.insts {
		if x.cfg.Name == name {
			in = x
		}
	}
	if in == nil {
		return fmt.Errorf("set peers: no instance %q", name)
	}
	cfg := a.cfg
	cfg.Instances = slices.Clone(cfg.Instances)
	clean := make([]netip.Addr, len(peers))
	for i, p := range peers {
		clean[i] = p.Unmap().WithZone("") // as SetDefaults does
	}
	for i := range cfg.Instances {
		if cfg.Instances[i].Name == name {
			cfg.Instances[i].Peers = clean
		}
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("set peers of %s: %w", name, err)
	}
	ev := peersEvent{peers: clean, done: make(chan error, 1)}
	select {
	case in.events <- ev:
	case <-in.stopped:
		return fmt.Errorf("set peers of %s: the announcer has stopped", name)
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-ev.done:
		return err
	case <-in.stopped:
		return fmt.Errorf("set peers of %s: the announcer has stopped", name)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// States returns the current state of each virtual router by name.
func (a *Announcer) States() map[string]State {
	out := make(map[string]State, len(a.insts))
	for _, in := range a.insts {
		out[in.cfg.Name] = State(in.state.Load())
	}
	return out
}

func (a *Announcer) reject(r Reason, err error, src netip.Addr) {
	a.met.advertsRejected.WithLabelValues(string(r)).Inc()
	if n, ok := a.rejectLog.allow(string(r), time.Now()); ok {
		a.log.Warn("advert rejected", zap.String("reason", string(r)), zap.Stringer("src", src),
			zap.String("iface", a.cfg.Interface), zap.Int("suppressed", n), zap.Error(err))
	}
}

// readAdverts validates every advert arriving on c and hands it to its virtual
// router. Bad adverts are counted by reason, logged (rate-limited) and skipped.
func (a *Announcer) readAdverts(ctx context.Context, c *advertConn, is4 bool) {
	buf := make([]byte, 1500)
	for ctx.Err() == nil {
		r, err := c.recv(buf, time.Now().Add(pollInterval))
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				continue
			}
			if ctx.Err() == nil {
				a.log.Error("read adverts", zap.String("iface", a.cfg.Interface), zap.Error(err))
				time.Sleep(pollInterval)
			}
			continue
		}
		if in, ev, ok := a.accept(r, is4); ok {
			select {
			case in.events <- ev:
			case <-ctx.Done():
			}
		}
	}
}

// accept validates one received packet and finds its virtual router. A refusal
// is counted by reason and logged (rate-limited); the caller skips the packet.
func (a *Announcer) accept(r received, is4 bool) (*instance, advertEvent, bool) {
	adv, err := Decode(r.payload, r.src, r.dst, r.hopLimit)
	if err != nil {
		a.reject(ReasonOf(err), err, r.src)
		return nil, advertEvent{}, false
	}
	in := a.byVRID[vridKey{is4, adv.VRID}]
	if in == nil {
		a.reject(ReasonVRID, fmt.Errorf("no instance for vrid %d", adv.VRID), r.src)
		return nil, advertEvent{}, false
	}
	if r.src == in.primary {
		return nil, advertEvent{}, false // our own advert looped back
	}
	if reason, err := in.check(adv, r.src); err != nil {
		a.reject(reason, err, r.src)
		return nil, advertEvent{}, false
	}
	in.mReceived.Inc()
	return in, advertEvent{adv, r.src}, true
}

// readClaims hands ARP replies / NAs for our VIPs from foreign MACs to the
// virtual router that owns the VIP.
func (a *Announcer) readClaims(ctx context.Context, read func(time.Time) (claim, bool, error)) {
	for ctx.Err() == nil {
		c, ok, err := read(time.Now().Add(pollInterval))
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() == nil {
				a.log.Error("read arp/ndp", zap.String("iface", a.cfg.Interface), zap.Error(err))
				time.Sleep(pollInterval)
			}
			continue
		}
		if !ok {
			continue
		}
		for _, in := range a.insts {
			if in.has(c.vip) {
				in.claimed(c, time.Now())
			}
		}
	}
}

// limiter lets one log line per key through per period and counts the rest.
type limiter struct {
	mu     sync.Mutex
	period time.Duration
	last   map[string]time.Time
	held   map[string]int
}

func newLimiter(period time.Duration) *limiter {
	return &limiter{period: period, last: map[string]time.Time{}, held: map[string]int{}}
}

// allow reports whether to log now, and how many were suppressed since the last.
func (l *limiter) allow(key string, now time.Time) (int, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t, ok := l.last[key]; ok && now.Sub(t) < l.period {
		l.held[key]++
		return 0, false
	}
	n := l.held[key]
	l.last[key], l.held[key] = now, 0
	return n, true
}
