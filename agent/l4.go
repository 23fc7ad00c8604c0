package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/portico-edge/portico/api/agentstatus"
	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/liveness"
)

// desiredFor turns the snapshot's view of one group into what this node's data
// plane should say. local tells which replica addresses are this node; dead
// which replicas the liveness checks say cannot serve (they go Down: out of the
// ring as if Kubernetes had removed them, but keeping their place in the table;
// they are returned in out); mac returns a replica's MAC from the neighbour
// table. A remote replica whose MAC is unknown is left out (it cannot be sent
// to) and returned in unresolved, so the caller can resolve it and try again.
//
// A draining replica the checks call dead is Down too (and still draining): a
// graceful stop closes nginx's listeners (so its checks fail) while its
// connections finish, and those still reach it, asked after the serving
// replicas in their chains, while no other replica's connection is ever sent to
// a draining replica that may really be dead. Liveness never empties a group: when it would leave no
// replica that takes new flows (a ready one, or, when none is ready, a draining one: the data
// plane's rings then take the draining replicas), Kubernetes' view holds for the verdicts of the
// last burst (overruled is set), since a checker that sees every replica dead at once is more
// likely starved, broken or cut off itself than right. A verdict older than the burst by more
// than overruleBurst (deadSince says when each went dead; nil, or a zero time: in the burst)
// stands: a replica dead for seconds that Kubernetes has not caught up with yet must not come
// back into the rings because a loaded checker then called the live ones dead too (in a
// loaded TestPortico, the owner killed 13 s before: 8 new connections sent to it).
func desiredFor(snap model.Snapshot, group string, seed uint32, local, dead func(netip.Addr) bool, deadSince func(netip.Addr) time.Time,
	mac func(netip.Addr) (net.HardwareAddr, bool)) (want dataplane.Desired, unresolved, out []netip.Addr, overruled bool) {
	want.Seed = seed
	for _, g := range snap.Groups {
		if g.Name != group || len(g.VIPs) == 0 {
			continue
		}
		var gout []netip.Addr
		serving, draining := 0, 0
		for _, r := range g.Replicas {
			switch {
			case dead(r.Addr):
				gout = append(gout, r.Addr)
			case r.State != model.Draining:
				serving++
			default:
				draining++ // takes new flows when no replica is ready (dataplane's rings)
			}
		}
		if serving == 0 && draining == 0 && len(gout) > 0 {
			gout, overruled = lastBurstRevived(gout, deadSince), true
		}
		out = append(out, gout...)
		dg := dataplane.Group{Name: g.Name, VIPs: g.VIPs, Ports: g.Ports}
		for _, r := range g.Replicas {
			if slices.Contains(gout, r.Addr) {
				// Down: no new flows, and its place in the table kept so that no
				// other replica's flows move; its own flows stay with it while its
				// MAC is known (a wrong verdict breaks nothing), else they are
				// picked again.
				b := dataplane.Backend{Addr: r.Addr, Weight: r.Weight, Down: true, Local: local(r.Addr), Draining: r.State == model.Draining}
				if m, ok := mac(r.Addr); ok && !b.Local {
					b.MAC = m
				}
				dg.Backends = append(dg.Backends, b)
				continue
			}
			b := dataplane.Backend{Addr: r.Addr, Weight: r.Weight, Draining: r.State == model.Draining}
			if local(r.Addr) {
				b.Local = true
			} else if m, ok := mac(r.Addr); ok {
				b.MAC = m
			} else {
				unresolved = append(unresolved, r.Addr)
				continue
			}
			dg.Backends = append(dg.Backends, b)
		}
		want.Groups = append(want.Groups, dg)
		// The group's L4 Services: their VIPs and ports go to the same replicas,
		// by rings of their own built from the same members, so every node
		// steers them alike.
		for _, svc := range snap.Services {
			if svc.Group != g.Name || len(svc.VIPs) == 0 {
				continue
			}
			sg := dataplane.Group{Name: "service " + svc.Name, VIPs: svc.VIPs, Backends: dg.Backends}
			for _, p := range svc.Ports {
				sg.Ports = append(sg.Ports, model.Port{Protocol: p.Protocol, Port: p.Port})
			}
			if len(sg.Ports) == 0 {
				continue // no port to serve: an empty list would mean every port
			}
			want.Groups = append(want.Groups, sg)
		}
		// Its Views (Gateways with addresses of their own) likewise, on their
		// HTTP and HTTPS ports.
		for _, v := range snap.Views {
			if v.Group == g.Name && len(v.VIPs) > 0 && len(v.Ports) > 0 {
				want.Groups = append(want.Groups, dataplane.Group{Name: "gateway " + v.Name, VIPs: v.VIPs, Ports: v.Ports, Backends: dg.Backends})
			}
		}
	}
	return want, unresolved, out, overruled
}

// replicasOf lists the group's replicas in the snapshot (what liveness checks).
func replicasOf(snap model.Snapshot, group string) []netip.Addr {
	var out []netip.Addr
	for _, g := range snap.Groups {
		if g.Name == group {
			for _, r := range g.Replicas {
				out = append(out, r.Addr)
			}
		}
	}
	return out
}

// localAddrs reports whether an address is one of this node's.
func localAddrs() (func(netip.Addr) bool, error) {
	list, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	own := map[netip.Addr]bool{}
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && a.Scope == unix.RT_SCOPE_UNIVERSE {
			own[ip.Unmap()] = true
		}
	}
	return func(a netip.Addr) bool { return own[a.Unmap()] }, nil
}

// l4Sink applies each snapshot's group to the XDP data plane. It keeps the last
// snapshot so a changed neighbour (a replica's new MAC) can be re-applied.
type l4Sink struct {
	dp    *dataplane.Dataplane
	group string
	seed  uint32
	neigh *neighbors
	live  livenessChecker // nil: Kubernetes' view only
	log   *zap.Logger
	// sites, in a federation (--federation-peers), gives the other sites' edges
	// for a site hand-over, reached from tunnel, this node's tunnel address.
	sites    *peerSites
	tunnel   netip.Addr
	handing  bool      // the last Handover found VIPs to hand over
	allSince time.Time // when handover (towards every site) was last called
	// spill is the share of new connections this edge sends to the site its
	// overflow names (followLoad); spillGauge shows it.
	spill      float64
	spillGauge prometheus.Gauge

	mu      sync.Mutex
	last    model.Snapshot
	given   dataplane.Desired // what the maps were last given
	ok      bool              // the last Apply reached the maps in full
	dead    []netip.Addr      // what liveness said at the last Apply, sorted
	deadOut []netip.Addr      // the replicas that Apply left out as dead
	// publish tells this node's nginx the liveness verdicts
	// (nginx.Reloader.PushVerdicts); nil in tests without nginx.
	publish func(context.Context, []netip.Addr) error
}

// livenessChecker is what the L4 sink asks of the liveness checker.
type livenessChecker interface {
	SetTargets(addrs []netip.Addr, local func(netip.Addr) bool)
	Dead() []netip.Addr
	Changed() <-chan struct{}
	View() []liveness.Replica
	Differ() bool
}

func (s *l4Sink) Name() string { return "dataplane" }

// Apply implements controlplane.Sink. A replica whose MAC is still unknown after
// asking is left out of the maps and the error makes the controller retry.
func (s *l4Sink) Apply(ctx context.Context, snap model.Snapshot) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last, s.ok = snap, false
	return s.applyLocked()
}

func (s *l4Sink) applyLocked() error {
	local, err := localAddrs()
	if err != nil {
		return err
	}
	s.dead = nil
	if s.live != nil {
		s.live.SetTargets(replicasOf(s.last, s.group), local)
		s.dead = s.live.Dead()
	}
	isDead := func(a netip.Addr) bool {
		_, found := slices.BinarySearchFunc(s.dead, a, netip.Addr.Compare)
		return found
	}
	// Dead replicas are left out before their MACs are looked for: a cut-off
	// replica must not hold the ring up for an ARP timeout.
	var deadSince func(netip.Addr) time.Time
	if s.live != nil && len(s.dead) > 0 {
		since := map[netip.Addr]time.Time{}
		for _, r := range s.live.View() {
			if !r.Live {
				since[r.Addr] = r.Since
			}
		}
		deadSince = func(a netip.Addr) time.Time { return since[a] }
	}
	want, missing, out, overruled := desiredFor(s.last, s.group, s.seed, local, isDead, deadSince, s.neigh.lookup)
	if len(missing) > 0 {
		rerr := s.neigh.resolve(missing)
		want, missing, out, overruled = desiredFor(s.last, s.group, s.seed, local, isDead, deadSince, s.neigh.lookup)
		if len(missing) > 0 {
			s.log.Warn("replica MACs unresolved, left out of the ring", zap.Stringers("backend", missing), zap.Error(rerr))
		}
	}
	if overruled {
		s.log.Error("liveness checks say no replica can serve: keeping Kubernetes' view of the last verdicts rather than an empty ring",
			zap.Stringers("backend", s.dead), zap.Stringers("still_dead", out))
	}
	if !slices.Equal(out, s.deadOut) {
		s.log.Info("ring follows replica liveness", zap.Stringers("dead", out))
	}
	if s.sites != nil {
		if remotes := s.sites.remotes(); len(remotes) > 0 {
			want.Tunnel = s.tunnel
			o := s.sites.overflow()
			var spill []dataplane.Remote
			for _, r := range remotes {
				if o != nil && r.Site == o.To {
					spill = append(spill, r)
				}
			}
			for i := range want.Groups {
				if want.Groups[i].Name == s.group {
					want.Groups[i].Remotes = remotes
					if len(spill) > 0 {
						want.Groups[i].Spill, want.Groups[i].SpillRatio = spill, s.spill
					}
				}
			}
		}
	}
	// While this node's verdicts differ from another edge's, their rings do
	// where no transition shows it: every new connection is pinned.
	want.Differ = s.live != nil && s.live.Differ()
	if _, err := s.dp.Apply(want); err != nil {
		return err
	}
	// In a federation, a replica of this site that joins, drains, returns or is
	// called down changes what its edge announces, and the routers rehash: flows
	// that live at another site can come here. They go there (a hand-over),
	// not to this site's stack, while the transition lasts.
	if s.given.Groups != nil && replicaStates(s.given, s.group) != replicaStates(want, s.group) && hasRemotes(want, s.group) {
		s.allSince = time.Now()
		s.handoverLocked()
	}
	s.given, s.deadOut = want, out
	if len(missing) > 0 {
		return fmt.Errorf("%d replica MACs unresolved", len(missing))
	}
	s.ok = true
	return nil
}

// overruleBurst is how close to the newest dead verdict another must be to
// count as the same burst when liveness would empty a group (desiredFor): a
// starved checker's probes time out within a few probe intervals of each
// other, and Kubernetes takes many seconds to catch up with a real death.
const overruleBurst = 500 * time.Millisecond

// lastBurstRevived is out without the replicas whose dead verdict came within
// overruleBurst of the newest (those are taken back); a zero time counts as
// in the burst.
func lastBurstRevived(out []netip.Addr, deadSince func(netip.Addr) time.Time) []netip.Addr {
	if deadSince == nil {
		return nil
	}
	var newest time.Time
	for _, a := range out {
		if t := deadSince(a); t.IsZero() {
			return nil
		} else if t.After(newest) {
			newest = t
		}
	}
	var kept []netip.Addr
	for _, a := range out {
		if newest.Sub(deadSince(a)) > overruleBurst {
			kept = append(kept, a)
		}
	}
	return kept
}

// replicaStates describes the group's replicas as the rings see them: each
// address, draining or down, in order.
func replicaStates(d dataplane.Desired, group string) string {
	var b strings.Builder
	for _, g := range d.Groups {
		if g.Name != group {
			continue
		}
		for _, r := range g.Backends {
			fmt.Fprintf(&b, "%s/%t/%t ", r.Addr, r.Draining, r.Down)
		}
	}
	return b.String()
}

// hasRemotes reports whether the group knows other sites' edges.
func hasRemotes(d dataplane.Desired, group string) bool {
	return slices.ContainsFunc(d.Groups, func(g dataplane.Group) bool { return g.Name == group && len(g.Remotes) > 0 })
}

// followLiveness re-applies the last snapshot whenever the liveness verdicts
// change, and checks them every second as well (a stalled checker cannot say
// that it stalled, and its Dead then turns empty). It first tells its nginx
// the verdicts (publish), which answers them to the other edges' probes: a
// replica they call down learns it from them (liveness.Checker), and its
// rings then agree with theirs. They are sent again every second, for an
// nginx that restarted.
func (s *l4Sink) followLiveness(ctx context.Context) error {
	if s.live == nil {
		return nil
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var published []netip.Addr
	publishErr := errors.New("nginx not started yet") // quiet until it has worked once
	for first := true; ; first = false {
		ticked := false
		if !first {
			select {
			case <-ctx.Done():
				return nil
			case <-s.live.Changed():
			case <-tick.C:
				ticked = true
			}
		}
		dead, differ := s.live.Dead(), s.live.Differ()
		if s.publish != nil && (first || ticked || !slices.Equal(dead, published)) {
			err := s.publish(ctx, dead)
			if (err == nil) != (publishErr == nil) {
				if err != nil {
					s.log.Warn("cannot tell nginx the liveness verdicts (the other edges do not learn them until it can)", zap.Error(err))
				} else {
					s.log.Info("nginx answers the liveness verdicts again")
				}
			}
			publishErr = err
			if err == nil {
				published = dead
			}
		}
		s.mu.Lock()
		if len(s.last.Groups) > 0 && (!slices.Equal(dead, s.dead) || differ != s.given.Differ) {
			if err := s.applyLocked(); err != nil {
				s.log.Warn("re-apply after a liveness change failed", zap.Error(err))
			}
		}
		s.mu.Unlock()
	}
}

// handover starts (or extends) a site hand-over of the group's VIPs towards
// every other site (dataplane.Dataplane.Handover): bgpSink calls it while the
// site is away and as it comes back.
func (s *l4Sink) handover() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.allSince = time.Now()
	s.handoverLocked()
}

// handoverDraining keeps a hand-over towards the draining peers up (the sites
// watch calls it every second): the routers bring this site their connections.
// A hand-over towards every site (handover) takes precedence while it is renewed.
func (s *l4Sink) handoverDraining(draining []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(draining) == 0 || time.Since(s.allSince) < 3*time.Second {
		return
	}
	s.handoverLocked(draining...)
}

func (s *l4Sink) handoverLocked(sites ...string) {
	n, err := s.dp.Handover(s.group, sites...)
	if err != nil {
		s.log.Warn("site hand-over failed", zap.Error(err))
		return
	}
	if n > 0 && !s.handing {
		s.log.Info("site hand-over: connections no replica here has go to the other sites' edges", zap.Int("vips", n), zap.Strings("sites", sites))
	}
	s.handing = n > 0
}

// reapply applies the last snapshot again (the other sites' edges changed).
func (s *l4Sink) reapply() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.last.Groups) == 0 {
		return
	}
	if err := s.applyLocked(); err != nil {
		s.log.Warn("re-apply after the federation peers changed failed", zap.Error(err))
	}
}

// expireTransitions ends the data plane's ended ring transitions every few
// seconds, so that in the steady state xdp_lb reads no clock (see
// dataplane.Dataplane.Expire).
func (s *l4Sink) expireTransitions(ctx context.Context) error {
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		s.mu.Lock()
		err := s.dp.Expire()
		s.mu.Unlock()
		if err != nil {
			s.log.Warn("ending ring transitions failed", zap.Error(err))
		}
	}
}

// replicas is the group's replicas as Kubernetes lists them, each with this
// node's liveness verdict, for the published status.
func (s *l4Sink) replicas() []agentstatus.ReplicaLiveness {
	s.mu.Lock()
	var out []agentstatus.ReplicaLiveness
	for _, g := range s.last.Groups {
		if g.Name != s.group {
			continue
		}
		for _, r := range g.Replicas {
			k := "ready"
			if r.State == model.Draining {
				k = "draining"
			}
			out = append(out, agentstatus.ReplicaLiveness{Addr: r.Addr.String(), Kubernetes: k, Live: "unchecked"})
		}
	}
	s.mu.Unlock()
	if s.live == nil {
		return out
	}
	view := map[string]liveness.Replica{}
	for _, v := range s.live.View() {
		view[v.Addr.String()] = v
	}
	for i := range out {
		v, ok := view[out[i].Addr]
		switch {
		case !ok:
			continue
		case v.Fallback != "":
			out[i].Live = "live (fallback: " + v.Fallback + ")"
		case v.CalledDown:
			out[i].Live = "called down by the other edges (its own checks: live)"
		case v.Live:
			out[i].Live = "live"
		default:
			out[i].Live = "dead"
		}
		out[i].Since = v.Since.UTC().Truncate(time.Millisecond)
	}
	return out
}

// applied reports whether the last snapshot is fully in the maps (readiness).
func (s *l4Sink) applied() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ok
}
