package agent

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/dataplane"
)

// Held connections: where an off-ring connection lives, from its holder.
//
// Once a ring transition ends, a connection whose slot the current ring gives
// to another replica is carried only by pins, and a director that never pinned
// it (one that takes over later, or one whose pin the transition never made
// because the connection was silent throughout) sends it by the ring: it is
// reset (bpf/README.md, "Limits"). The one place that always knows where such
// a connection lives is its holder's stack. So every agent, every heldEvery:
//   - lists its stack's connections (sock_diag), keeps those the current ring
//     gives to another replica (Dataplane.OffRing), and serves them on /held of
//     its metrics port;
//   - fetches every other replica's /held (a conditional GET: an unchanged list
//     costs a 304) and pins what each lists to it (Dataplane.PinHeld), its own
//     list too; what a holder stops listing is unpinned (Dataplane.UnpinHeld).
//
// A holder that does not answer keeps its last list pinned (it may be alive
// behind a cut link, and a dead one's pins cost nothing: the down-pin path asks
// the ring's replica first). A replica that leaves the group is unpinned.

// heldEvery is how often an agent lists its connections and fetches its
// peers' lists: well inside a ring transition (an eighth of it, at most 5 s: 5 s
// by default), so every connection a change moves off its holder's slot is
// pinned on every edge long before its transition ends. Listing costs the
// kernel a walk of its TCP table (BenchmarkOwnConnections).
func heldEvery(transition time.Duration) time.Duration {
	if transition <= 0 {
		transition = dataplane.DefaultTransition
	}
	return min(max(transition/8, 250*time.Millisecond), 5*time.Second)
}

// maxHeld bounds one holder's list (the rest is dropped, with a metric): every
// edge pins every list, in flows (shared with the transitions' pins), and all
// of them together get at most half of it (heldReports.budget).
const maxHeld = 65536

// heldResync is how often every list is pinned again in full, not only what
// changed: a pin the LRU evicted, or one written while this node did not know
// the holder yet, comes back.
const heldResync = 30 * time.Second

// heldPath is where an agent serves its list.
const heldPath = "/held"

// heldReports is one agent's side of the held connections.
type heldReports struct {
	sink     *l4Sink
	port     uint16        // the peers' metrics port (every agent's is the same)
	interval time.Duration // heldEvery
	budget   int           // at most this many connections pinned in all (bound)
	client   *http.Client
	log      *zap.Logger
	met      *heldMetrics
	// list is this node's connections in the client's direction
	// (ownConnections; a fake in unit tests).
	list func() ([]dataplane.Flow, error)
	// listUDP is the UDP flows this node served that lived at least lived
	// and sent within idle (Dataplane.OwnUDP; nil: none listed).
	listUDP func(lived, idle time.Duration) ([]dataplane.Flow, error)

	mu         sync.Mutex
	body, etag string           // what /held serves
	own        []dataplane.Flow // what body lists
	// readers are the group's replicas, the only addresses /held answers
	// (besides this node's loopback): the list names clients' addresses.
	readers map[netip.Addr]bool

	// source is this node's replica address, which its fetches come from
	// (the peers answer the group's replicas alone).
	source atomic.Value // netip.Addr

	// Owned by run's goroutine.
	peers    map[netip.Addr]*peerHeld
	lastFull time.Time
}

// udpLived is how long a UDP flow must have lived (its first datagram to its
// last) for its holder to list it: a DNS query's one or two datagrams do not,
// and a spoofed source must keep sending for that long to be pinned.
const udpLived = time.Second

// udpIdle is how long a UDP flow of group's L4 Services may be silent and still
// be in an nginx session (the longest portico.io/udp-idle-timeout of its UDP
// ports); 0: the group serves no UDP.
func udpIdle(snap model.Snapshot, group string) time.Duration {
	var idle time.Duration
	for _, svc := range snap.Services {
		if svc.Group != group || !slices.ContainsFunc(svc.Ports, func(p model.ServicePort) bool { return p.Protocol == model.UDP }) {
			continue
		}
		idle = max(idle, time.Duration(cmp.Or(svc.UDPIdleTimeout, model.DefaultUDPIdleTimeout))*time.Second)
	}
	return idle
}

// peerHeld is what one holder listed last.
type peerHeld struct {
	etag string
	held []dataplane.Held
}

type heldMetrics struct {
	conns  *prometheus.GaugeVec
	errors *prometheus.CounterVec
	pins   *prometheus.CounterVec
	all    prometheus.Counter
}

func newHeldMetrics() *heldMetrics {
	return &heldMetrics{
		conns: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "portico", Subsystem: "held", Name: "connections",
			Help: "Connections held off the current ring (their slot names another replica), pinned by this edge's director: by whose they are (own: this node's stack; peers: the other replicas' lists)."},
			[]string{"holder"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "portico", Subsystem: "held", Name: "errors_total",
			Help: "Failures of the held-connection reports, by reason: list (this node's sockets), fetch (a peer's list did not come), malformed (a peer's line was not a connection; skipped), truncated (a list beyond 65536 connections, or all lists beyond half of the flows table), pin (the maps refused)."},
			[]string{"reason"}),
		pins: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "portico", Subsystem: "held", Name: "pins_total",
			Help: "Director pins written for held connections (op=pin) and removed once their holder stopped listing them (op=unpin)."},
			[]string{"op"}),
		all: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "portico", Subsystem: "held", Name: "all_listed_total",
			Help: "Reports that listed every connection of this node, not only those off its ring: an edge it hears called another set of replicas down than it does (their rings differ)."}),
	}
}

func (m *heldMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.conns, m.errors, m.pins, m.all}
}

// serveHTTP serves this node's list: one connection per line, "tcp
// client:port vip:port", with an ETag.
// Only the group's replicas (and loopback) may read it.
func (h *heldReports) serveHTTP(w http.ResponseWriter, r *http.Request) {
	from, err := netip.ParseAddrPort(r.RemoteAddr)
	h.mu.Lock()
	body, etag, ok := h.body, h.etag, err == nil && (from.Addr().IsLoopback() || h.readers[from.Addr().Unmap()])
	h.mu.Unlock()
	if !ok {
		http.Error(w, "only the group's replicas read this list", http.StatusForbidden)
		return
	}
	w.Header().Set("ETag", etag)
	if r.Header.Get("If-None-Match") == etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, body)
}

// run reports and pins every interval until ctx ends.
func (h *heldReports) run(ctx context.Context) error {
	t := time.NewTicker(h.interval)
	defer t.Stop()
	for {
		h.round(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// round is one report: this node's list made and served, the peers' fetched,
// every list pinned.
func (h *heldReports) round(ctx context.Context) {
	flows, err := h.list()
	if err != nil {
		h.met.errors.WithLabelValues("list").Inc()
		h.log.Warn("listing this node's connections failed", zap.Error(err))
	}
	local, lerr := localAddrs()
	if lerr != nil {
		h.log.Warn("listing this node's addresses failed", zap.Error(lerr))
		return
	}
	h.sink.mu.Lock()
	replicas := replicasOf(h.sink.last, h.sink.group)
	var self netip.Addr
	if i := slices.IndexFunc(replicas, local); i >= 0 {
		self = replicas[i]
	}
	// While the edges' verdicts differ their rings do, and a connection on
	// this node's ring may be off another edge's: every one is listed.
	all := h.sink.live != nil && h.sink.live.Differ()
	var own []dataplane.Flow
	if self.IsValid() && err == nil {
		own = h.sink.dp.OffRing(self, flows, all)
		if all {
			h.met.all.Inc()
		}
	}
	// UDP leaves no socket per flow: the flows xdp_lb saw this node serve
	// stand for them, while one may still be in nginx's session. Each is
	// listed, on the ring or off it: a UDP walk asks no replica called down
	// (bpf/README.md, "UDP"), so a replica called down wrongly keeps its
	// flows by these pins alone. Last, so that a bound trims them first
	// (a spoofed source can make them; a TCP connection needs a handshake).
	if idle := udpIdle(h.sink.last, h.sink.group); self.IsValid() && err == nil && idle > 0 && h.listUDP != nil {
		udp, uerr := h.listUDP(udpLived, idle)
		if uerr != nil {
			h.met.errors.WithLabelValues("list").Inc()
			h.log.Warn("listing the UDP flows this node serves failed", zap.Error(uerr))
			err = uerr
		}
		own = append(own, udp...)
	}
	h.sink.mu.Unlock()
	h.source.Store(self)
	if len(own) > maxHeld {
		h.met.errors.WithLabelValues("truncated").Inc()
		own = own[:maxHeld]
	}
	// A list that failed is not served: the peers would unpin everything.
	changed := h.publish(own, replicas, err == nil)

	lists := map[netip.Addr]*peerHeld{}
	if p := h.peers[self]; self.IsValid() && p != nil && !changed {
		lists[self] = p // as a peer's 304: nothing to compare
	} else if self.IsValid() && err == nil {
		mine := make([]dataplane.Held, len(own))
		for i, f := range own {
			mine[i] = dataplane.Held{Flow: f, Holder: self}
		}
		lists[self] = &peerHeld{held: mine}
	}
	h.fetchAll(ctx, replicas, self, lists)
	h.bound(lists)

	full := time.Since(h.lastFull) >= heldResync
	var pin, gone []dataplane.Held
	for a, p := range h.peers {
		if _, ok := lists[a]; !ok {
			gone = append(gone, p.held...) // it left the group
		}
	}
	conns := map[bool]int{}
	for a, p := range lists {
		conns[a == self] += len(p.held)
		old := h.peers[a]
		if full || old == nil {
			pin = append(pin, p.held...)
		}
		if old == nil || old == p {
			continue
		}
		was := make(map[dataplane.Held]bool, len(old.held))
		for _, c := range old.held {
			was[c] = true
		}
		for _, c := range p.held {
			if !was[c] {
				if !full {
					pin = append(pin, c)
				}
			} else {
				delete(was, c)
			}
		}
		for c := range was {
			gone = append(gone, c)
		}
	}
	h.peers = lists
	if full {
		h.lastFull = time.Now()
	}
	h.met.conns.WithLabelValues("own").Set(float64(conns[true]))
	h.met.conns.WithLabelValues("peers").Set(float64(conns[false]))
	if len(pin) == 0 && len(gone) == 0 && !full {
		return
	}
	h.sink.mu.Lock()
	unpinned, uerr := h.sink.dp.UnpinHeld(gone)
	pinned, perr := h.sink.dp.PinHeld(pin)
	h.sink.mu.Unlock()
	h.met.pins.WithLabelValues("unpin").Add(float64(unpinned))
	h.met.pins.WithLabelValues("pin").Add(float64(pinned))
	if err := errors.Join(uerr, perr); err != nil {
		h.met.errors.WithLabelValues("pin").Inc()
		h.log.Warn("pinning held connections failed", zap.Error(err))
		h.lastFull = time.Time{} // everything again next round
	}
	if pinned > 0 || unpinned > 0 {
		h.log.Debug("held connections pinned", zap.Int("pinned", pinned), zap.Int("unpinned", unpinned))
	}
}

// dial is the fetches' dialer: from this node's replica address, when it has
// one, so that a node with several addresses is known to its peers.
func (h *heldReports) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{}
	if self, ok := h.source.Load().(netip.Addr); ok && self.IsValid() {
		d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(self, 0))
	}
	return d.DialContext(ctx, network, addr)
}

// bound trims lists (holders in address order, TCP before UDP) to heldBudget
// connections in all, counting what it drops: clients on the VIPs make these
// lists, and every edge pins all of them, so they must leave room in flows for
// the pins of the transitions.
func (h *heldReports) bound(lists map[netip.Addr]*peerHeld) {
	holders := slices.SortedFunc(maps.Keys(lists), netip.Addr.Compare)
	left := h.budget
	kept := map[netip.Addr][]dataplane.Held{}
	// TCP connections first (each took a handshake), then UDP flows (a
	// spoofed source makes those), each in the holders' order.
	for _, udp := range []bool{false, true} {
		for _, a := range holders {
			for _, held := range lists[a].held {
				if (held.Flow.Protocol == unix.IPPROTO_UDP) == udp && left > 0 {
					kept[a] = append(kept[a], held)
					left--
				}
			}
		}
	}
	for _, a := range holders {
		if p := lists[a]; len(kept[a]) < len(p.held) {
			h.met.errors.WithLabelValues("truncated").Inc()
			lists[a] = &peerHeld{etag: p.etag, held: kept[a]}
		}
	}
}

// publish makes own the list /held serves (unless listed is false: the last
// one stays), to readers, and reports whether the list changed.
func (h *heldReports) publish(own []dataplane.Flow, readers []netip.Addr, listed bool) bool {
	h.mu.Lock()
	h.readers = map[netip.Addr]bool{}
	for _, a := range readers {
		h.readers[a.Unmap()] = true
	}
	same := !listed || h.etag != "" && slices.Equal(h.own, own)
	h.mu.Unlock()
	if same {
		return false
	}
	var b bytes.Buffer
	for _, f := range own {
		proto := "tcp"
		if f.Protocol == unix.IPPROTO_UDP {
			proto = "udp"
		}
		fmt.Fprintf(&b, "%s %s %s\n", proto, netip.AddrPortFrom(f.Src, f.SPort), netip.AddrPortFrom(f.Dst, f.DPort))
	}
	sum := fnv.New64a()
	sum.Write(b.Bytes())
	h.mu.Lock()
	h.body, h.etag, h.own = b.String(), `"`+strconv.FormatUint(sum.Sum64(), 16)+`"`, own
	h.mu.Unlock()
	return true
}

// listed is how many connections this node's list has.
func (h *heldReports) listed() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.own)
}

// fetchAll fetches the list of every replica but self, at once, into lists;
// a replica whose list does not come keeps its last one.
func (h *heldReports) fetchAll(ctx context.Context, replicas []netip.Addr, self netip.Addr, lists map[netip.Addr]*peerHeld) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, a := range replicas {
		if a == self {
			continue
		}
		old := h.peers[a]
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := h.fetch(ctx, a, old)
			if err != nil {
				h.met.errors.WithLabelValues("fetch").Inc()
				h.log.Debug("a peer's held connections did not come", zap.Stringer("peer", a), zap.Error(err))
				p = old
			}
			if p == nil {
				p = &peerHeld{}
			}
			mu.Lock()
			lists[a] = p
			mu.Unlock()
		}()
	}
	wg.Wait()
}

// fetch asks holder for its list; old is its last (nil: none), returned as it
// is when the holder answers that nothing changed.
func (h *heldReports) fetch(ctx context.Context, holder netip.Addr, old *peerHeld) (*peerHeld, error) {
	ctx, cancel := context.WithTimeout(ctx, max(h.interval*8/10, 200*time.Millisecond))
	defer cancel()
	url := "http://" + net.JoinHostPort(holder.String(), strconv.Itoa(int(h.port))) + heldPath
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if old != nil && old.etag != "" {
		req.Header.Set("If-None-Match", old.etag)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotModified && old != nil:
		return old, nil
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	held, malformed, err := parseHeld(io.LimitReader(resp.Body, 128<<20), holder)
	if malformed > 0 {
		h.met.errors.WithLabelValues("malformed").Add(float64(malformed))
		h.log.Warn("a peer's held connections had malformed lines (skipped)", zap.Stringer("peer", holder), zap.Int("lines", malformed))
	}
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if len(held) > maxHeld {
		h.met.errors.WithLabelValues("truncated").Inc()
		held = held[:maxHeld]
	}
	return &peerHeld{etag: resp.Header.Get("ETag"), held: held}, nil
}

// parseHeld reads a list as /held serves it, every connection held by holder.
// A line that is not a TCP connection between two addresses of one family is
// counted in malformed and skipped.
func parseHeld(r io.Reader, holder netip.Addr) (held []dataplane.Held, malformed int, err error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		f, ok := parseHeldLine(string(line))
		if !ok {
			malformed++
			continue
		}
		held = append(held, dataplane.Held{Flow: f, Holder: holder})
	}
	return held, malformed, sc.Err()
}

func parseHeldLine(line string) (dataplane.Flow, bool) {
	var proto, src, dst string
	if n, err := fmt.Sscanf(line, "%s %s %s", &proto, &src, &dst); err != nil || n != 3 || proto != "tcp" && proto != "udp" {
		return dataplane.Flow{}, false
	}
	s, err1 := netip.ParseAddrPort(src)
	d, err2 := netip.ParseAddrPort(dst)
	if err1 != nil || err2 != nil || s.Addr().Unmap().Is4() != d.Addr().Unmap().Is4() || s.Port() == 0 || d.Port() == 0 {
		return dataplane.Flow{}, false
	}
	p := uint8(unix.IPPROTO_TCP)
	if proto == "udp" {
		p = unix.IPPROTO_UDP
	}
	return dataplane.Flow{Src: s.Addr().Unmap(), Dst: d.Addr().Unmap(), SPort: s.Port(), DPort: d.Port(), Protocol: p}, true
}
