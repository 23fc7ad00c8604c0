package agent

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/portico-edge/portico/api/agentstatus"
	"github.com/portico-edge/portico/api/bgpfile"
	"github.com/portico-edge/portico/bgp"
	"github.com/portico-edge/portico/controlplane/model"
)

// defaultWithdrawAfter is bgpfile.File.WithdrawAfter's default.
const defaultWithdrawAfter = 10 * time.Second

// defaultSiteUpAfter is how long a federated site's Ingresses must have a ready
// backend again before its VIPs are announced as preferred again.
const defaultSiteUpAfter = 3 * time.Second

// SpeakerConfig turns the file into node's speaker configuration. routerID is
// used when the file names none (the node's address). It may have no peer: the
// BGPPeer objects may bring them (Config.BGPPeerObjects).
func SpeakerConfig(f bgpfile.File, node string, routerID, nextHop6 netip.Addr) (bgp.Config, error) {
	c := bgp.Config{ASN: f.ASN, RouterID: routerID, ListenPort: -1, NextHop6: nextHop6}
	if f.RouterID != "" {
		a, err := netip.ParseAddr(f.RouterID)
		if err != nil {
			return c, fmt.Errorf("bgp routerID: %w", err)
		}
		c.RouterID = a
	}
	if f.GracefulRestart != nil {
		c.GracefulRestart = *f.GracefulRestart
	}
	if f.RestartTime != nil {
		c.RestartTime = f.RestartTime.Duration
	}
	if f.NextHop6 != "" && !nextHop6.IsValid() {
		a, err := netip.ParseAddr(f.NextHop6)
		if err != nil {
			return c, fmt.Errorf("bgp nextHop6: %w", err)
		}
		c.NextHop6 = a
	}
	profiles := map[string]bgpfile.BFDProfile{}
	for _, p := range f.BFDProfiles {
		if _, dup := profiles[p.Name]; dup || p.Name == "" {
			return c, fmt.Errorf("bgp bfdProfiles: name %q empty or listed twice", p.Name)
		}
		profiles[p.Name] = p
	}
	for i, p := range f.Peers {
		if len(p.Nodes) > 0 && !slices.Contains(p.Nodes, node) {
			continue
		}
		a, err := netip.ParseAddr(p.Address)
		if err != nil {
			return c, fmt.Errorf("bgp peers[%d].address: %w", i, err)
		}
		peer := bgp.Peer{Addr: a, ASN: p.ASN, Port: p.Port, Password: p.Password, Communities: p.Communities, LocalPref: p.LocalPref}
		if p.HoldTime != nil {
			peer.HoldTime = p.HoldTime.Duration
		}
		if p.KeepaliveInterval != nil {
			peer.KeepaliveInterval = p.KeepaliveInterval.Duration
		}
		if p.BFDProfile != "" {
			prof, ok := profiles[p.BFDProfile]
			if !ok {
				return c, fmt.Errorf("bgp peers[%d]: no bfdProfile %q", i, p.BFDProfile)
			}
			peer.BFD = &bgp.BFD{MinTx: prof.TransmitInterval.Duration, MinRx: prof.ReceiveInterval.Duration, Multiplier: prof.DetectMultiplier}
		}
		c.Peers = append(c.Peers, peer)
	}
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("bgp config: %w", err)
	}
	return c, nil
}

// withdrawAfter is the file's WithdrawAfter or its default.
func withdrawAfter(f bgpfile.File) time.Duration {
	if f.WithdrawAfter != nil && f.WithdrawAfter.Duration > 0 {
		return f.WithdrawAfter.Duration
	}
	return defaultWithdrawAfter
}

// routes is what bgpSink needs of a bgp.Speaker.
type routes interface {
	Announce(prefixes []netip.Prefix, pref bgp.Preference) error
	Status() bgp.Status
}

// bgpSink announces the group's VIPs over BGP (--announce=bgp). Every edge node
// announces them while it can serve, so the routers spread flows over all edges
// by ECMP and every edge's xdp_lb steers what reaches it; the Maglev rings are
// the same on every edge, so a flow the routers move to another edge still reaches
// its replica. Like the VRRP sink it keeps the group's VIPs on lo (the replicas
// answer for them, direct server return).
//
// What it announces follows the node, never the control plane's reachability:
//   - healthy, and its own replica not draining: announced (Normal);
//   - unhealthy, draining (cordoned, excluded from load balancers) or stopping:
//     de-preferenced first (routers move flows to the other edges, which steer
//     them to the same replicas), and after withdrawAfter of being unhealthy,
//     withdrawn; a drained or stopping node stays de-preferenced until its agent
//     stops and its session ends (the pinned XDP program forwards meanwhile);
//   - in a federation, the site's own health: when none of the group's federated
//     Ingresses (propagated by a host cluster, model.Group.Federated) has a ready
//     backend in this cluster, the site cannot serve what the anycast VIP promises,
//     so its edges de-prefer the VIP (routers move clients to another site), and
//     withdraw after withdrawAfter; when a backend is ready again they keep it
//     de-preferred for siteUpAfter (a flapping Deployment does not flap routes).
//     This needs no host cluster and no peer site (fail-static).
type bgpSink struct {
	group         string
	log           *zap.Logger
	speaker       routes
	setLoVIPs     func(want, managed []netip.Addr) error
	localAddrs    func() (func(netip.Addr) bool, error) // this node's addresses
	withdrawAfter time.Duration
	now           func() time.Time

	mu             sync.Mutex
	managed        []netip.Addr // VIPs this agent put on lo
	loSynced       bool
	vips           []netip.Addr
	draining       bool // this node's replica is draining in the snapshot
	healthy        bool
	unhealthySince time.Time
	stopping       bool
	// The site's health in a federation: siteDownSince is when the group's last
	// federated Ingress lost its ready backends (zero while one has some),
	// siteUpSince when one got them back.
	siteDownSince time.Time
	siteUpSince   time.Time
	siteUpAfter   time.Duration
	pref          bgp.Preference
	announced     []netip.Prefix
	// handover, in a federation, makes the data plane send connections no
	// replica here has to the other sites (l4Sink.handover); siteAway is set
	// while the site is down and until it is announced normally again.
	handover func()
	siteAway bool
	// siteDrain reports whether the site drains now (a planned drain in a
	// federation, sites.File.Draining): de-preferenced, and away; withdrawn once
	// its drain grace is over.
	siteDrain func(time.Time) (draining, withdraw bool)
}

func (b *bgpSink) Name() string { return "bgp" }

// Apply implements controlplane.Sink: the group's VIPs on lo and announced.
func (b *bgpSink) Apply(_ context.Context, snap model.Snapshot) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	g := announcedGroup(snap, b.group)
	if err := syncLo(b.setLoVIPs, &b.loSynced, &b.managed, g.VIPs); err != nil {
		return err
	}
	b.vips = slices.Clone(g.VIPs)
	b.setSiteHealth(g.Federated)
	isLocal, err := b.localAddrs()
	if err != nil {
		return err
	}
	b.draining = false
	for _, r := range g.Replicas {
		if isLocal(r.Addr) && r.State == model.Draining {
			b.draining = true
		}
	}
	return b.announceLocked()
}

// setSiteHealth follows the group's federated Ingresses: the site is up while any
// of them has a ready backend here, or when the group has none.
func (b *bgpSink) setSiteHealth(federated map[string]bool) {
	up := len(federated) == 0
	for _, ready := range federated {
		up = up || ready
	}
	now := b.now()
	switch {
	case !up && b.siteDownSince.IsZero():
		b.siteDownSince, b.siteUpSince = now, time.Time{}
		b.log.Warn("no federated ingress of the group has a ready backend: the site's VIPs go de-preferenced", zap.Int("ingresses", len(federated)))
	case up && !b.siteDownSince.IsZero():
		b.siteDownSince, b.siteUpSince = time.Time{}, now
		b.log.Info("a federated ingress of the group has a ready backend again")
	}
}

// siteDown reports whether the site counts as down for its announcement, and for
// how long it has been.
func (b *bgpSink) siteDown() (bool, time.Duration) {
	now := b.now()
	if !b.siteDownSince.IsZero() {
		return true, now.Sub(b.siteDownSince)
	}
	if !b.siteUpSince.IsZero() && now.Sub(b.siteUpSince) < b.siteUpAfter {
		return true, 0
	}
	return false, 0
}

// siteDraining reports whether the site drains now (siteDrain).
func (b *bgpSink) siteDraining() bool {
	if b.siteDrain == nil {
		return false
	}
	draining, _ := b.siteDrain(b.now())
	return draining
}

// setHealthy is the health loop's callback.
func (b *bgpSink) setHealthy(_ context.Context, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ok == b.healthy && (ok || !b.unhealthySince.IsZero()) {
		return // nothing new (the first "unhealthy" still starts the clock)
	}
	b.healthy = ok
	if ok {
		b.unhealthySince = time.Time{}
	} else if b.unhealthySince.IsZero() {
		b.unhealthySince = b.now()
	}
	if err := b.announceLocked(); err != nil {
		b.log.Warn("bgp announce after a health change failed", zap.Error(err))
	}
}

// stop de-preferences the routes: the agent is going away.
func (b *bgpSink) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stopping = true
	if err := b.announceLocked(); err != nil {
		b.log.Warn("bgp de-preference before stopping failed", zap.Error(err))
	}
}

// preference is what the node announces now. Ill health, the node's own or its
// site's in a federation, climbs one ladder: de-preferenced at once, withdrawn once
// it has lasted withdrawAfter (counted from the earlier cause).
func (b *bgpSink) preference() bgp.Preference {
	if b.siteDrain != nil {
		if _, withdraw := b.siteDrain(b.now()); withdraw {
			return bgp.Withdrawn
		}
	}
	if b.stopping || b.draining || b.siteDraining() {
		return bgp.Depreferenced
	}
	ill, since := false, time.Duration(0)
	if !b.healthy {
		ill = true
		if !b.unhealthySince.IsZero() {
			since = b.now().Sub(b.unhealthySince)
		}
	}
	if down, d := b.siteDown(); down {
		ill, since = true, max(since, d)
	}
	switch {
	case !ill:
		return bgp.Normal
	case since >= b.withdrawAfter:
		return bgp.Withdrawn
	default:
		return bgp.Depreferenced
	}
}

func (b *bgpSink) announceLocked() error {
	var prefixes []netip.Prefix
	for _, v := range b.vips {
		prefixes = append(prefixes, netip.PrefixFrom(v.Unmap(), v.Unmap().BitLen()))
	}
	pref := b.preference()
	// A site that was down comes back to connections the other sites took
	// meanwhile: the hand-over is kept up while it is away and renewed as it
	// is announced normally again, before the routers bring them.
	if down, _ := b.siteDown(); down || b.siteDraining() {
		b.siteAway = true
	}
	if b.siteAway && b.handover != nil {
		b.handover()
	}
	if pref == bgp.Normal {
		b.siteAway = false
	}
	if pref == b.pref && slices.Equal(prefixes, b.announced) {
		return nil
	}
	if err := b.speaker.Announce(prefixes, pref); err != nil {
		return err
	}
	if pref != b.pref {
		b.log.Info("bgp announcement changed", zap.Stringer("preference", pref), zap.Stringers("vips", b.vips),
			zap.Bool("healthy", b.healthy), zap.Bool("draining", b.draining), zap.Bool("stopping", b.stopping),
			zap.Bool("siteDown", !b.siteDownSince.IsZero()))
	}
	b.pref, b.announced = pref, prefixes
	return nil
}

// run re-evaluates the announcement every second (an unhealthy node withdraws
// after withdrawAfter even if nothing else happens).
func (b *bgpSink) run(ctx context.Context) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		b.mu.Lock()
		err := b.announceLocked()
		b.mu.Unlock()
		if err != nil {
			b.log.Warn("bgp announce failed", zap.Error(err))
		}
	}
}

// status is this node's BGP state for the published State.
func (b *bgpSink) status() *agentstatus.BGPState {
	st := b.speaker.Status()
	b.mu.Lock()
	defer b.mu.Unlock()
	return bgpState(b.pref, st)
}

// bgpState is what a node in --announce=bgp mode publishes: how it announces,
// its sessions, their BFD state, and what it announces.
func bgpState(pref bgp.Preference, st bgp.Status) *agentstatus.BGPState {
	out := &agentstatus.BGPState{Preference: pref.String()}
	out.Peers = st.Peers // bgp.PeerStatus is agentstatus.BGPPeerStatus
	if st.Announced != nil {
		out.Announced = make([]agentstatus.BGPAnnouncement, 0, len(st.Announced))
	}
	for _, a := range st.Announced {
		out.Announced = append(out.Announced, agentstatus.BGPAnnouncement{Prefix: a.Prefix, Preference: a.Preference.String()})
	}
	return out
}

// firstAddr is the interface's first IPv4 (v4) or global IPv6 address, the zero
// Addr if it has none.
func firstAddr(ifc *net.Interface, v4 bool) netip.Addr {
	addrs, err := ifc.Addrs()
	if err != nil {
		return netip.Addr{}
	}
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if ip.Is4() == v4 && (v4 || ip.IsGlobalUnicast()) {
			return ip
		}
	}
	return netip.Addr{}
}
