package agent

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/vrrp"
)

// vrrpSink runs the VRRP announcer for the agent's group and keeps the group's
// VIPs on lo. The announcer is rebuilt only when the group's VRID or the
// families of its VIPs change; a VIP added or removed (an L4 Service, an edit)
// is given to the running routers (SetVIPs), and everything else leaves them
// alone, so ownership never moves for an unrelated change.
type vrrpSink struct {
	base         context.Context // the agent's lifetime: announcers run under it
	iface        string
	group        string
	priority     uint8 // configured priority when healthy
	degraded     uint8 // priority while unhealthy
	interval     time.Duration
	version      uint8
	log          *zap.Logger
	newAnnouncer func(vrrp.Config) (announcer, error)
	setLoVIPs    func(want, managed []netip.Addr) error
	// unicast: adverts go to the group's peers and come from them alone
	// (followPeers); the announcer waits until they are known.
	unicast bool

	mu       sync.Mutex
	key      string
	managed  []netip.Addr // VIPs this agent put on lo
	loSynced bool         // lo holds managed (false until the first write)
	ann      announcer
	vrid     uint8    // the running announcer's
	names    []string // its routers
	stopRun  context.CancelFunc
	done     chan struct{}
	healthy  bool
	want     model.Group  // the group as the last snapshot has it
	peers    []netip.Addr // the group's peers, both families; nil: multicast
	ready    bool         // the peers are known (or unicast is off)
	waitLog  bool         // "waiting for peers" was logged
}

// announcer is what the sink uses of a vrrp.Announcer.
type announcer interface {
	Run(ctx context.Context) error
	SetPriority(ctx context.Context, instance string, p uint8) error
	SetVIPs(ctx context.Context, instance string, vips []netip.Addr) error
	SetPeers(ctx context.Context, instance string, peers []netip.Addr) error
	States() map[string]vrrp.State
}

// newAnnouncer is the sink's announcer constructor: vrrp.New with the agent's
// logger and metrics.
func newAnnouncer(log *zap.Logger, met *vrrp.Metrics) func(vrrp.Config) (announcer, error) {
	return func(cfg vrrp.Config) (announcer, error) {
		a, err := vrrp.New(cfg, log, met)
		if err != nil {
			return nil, err // not a typed nil inside the interface
		}
		return a, nil
	}
}

func (v *vrrpSink) Name() string { return "vrrp" }

// instancesFor returns the announcer's virtual routers for a group: one per
// address family, both with the group's VRID.
func (v *vrrpSink) instancesFor(g model.Group) []vrrp.InstanceConfig {
	var v4, v6 []netip.Addr
	for _, a := range g.VIPs {
		if a.Is4() {
			v4 = append(v4, a)
		} else {
			v6 = append(v6, a)
		}
	}
	var out []vrrp.InstanceConfig
	for _, fam := range []struct {
		name string
		vips []netip.Addr
	}{{"v4", v4}, {"v6", v6}} {
		if len(fam.vips) == 0 {
			continue
		}
		version := v.version
		if fam.name == "v6" {
			version = 3 // VRRP v2 has no IPv6
		}
		out = append(out, vrrp.InstanceConfig{
			Name:           fmt.Sprintf("%s/%s", g.Name, fam.name),
			VRID:           g.VRID,
			Version:        version,
			Priority:       v.currentPriority(),
			AdvertInterval: vrrp.Duration{Duration: v.interval},
			VIPs:           fam.vips,
			Peers:          familyPeers(v.peers, fam.name == "v4"),
		})
	}
	return out
}

func (v *vrrpSink) currentPriority() uint8 {
	if v.healthy {
		return v.priority
	}
	return v.degraded
}

// Apply implements controlplane.Sink.
func (v *vrrpSink) Apply(ctx context.Context, snap model.Snapshot) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	g := announcedGroup(snap, v.group)
	if err := syncLo(v.setLoVIPs, &v.loSynced, &v.managed, g.VIPs); err != nil {
		return err
	}
	v.want = g
	return v.reconcileLocked(ctx)
}

// reconcileLocked runs the announcer v.want asks for: kept, given new VIPs in
// place, or rebuilt. With unicast on, nothing starts before the peers are known.
func (v *vrrpSink) reconcileLocked(ctx context.Context) error {
	g := v.want
	if v.unicast && !v.ready {
		if !v.waitLog && g.VRID != 0 && len(g.VIPs) > 0 {
			v.waitLog = true
			v.log.Info("vrrp waits for the group's peers (this node's status Lease among the agents')", zap.String("group", v.group))
		}
		return nil
	}
	key := fmt.Sprint(g.VRID, g.VIPs)
	if key == v.key {
		return nil
	}
	if v.setVIPsLocked(ctx, g) {
		v.key = key
		return nil
	}
	v.stopLocked()
	v.key = key
	if g.VRID == 0 || len(g.VIPs) == 0 {
		v.log.Info("group has no VRID or VIP yet: not announcing", zap.String("group", v.group))
		return nil
	}
	cfg := vrrp.Config{Interface: v.iface, Instances: v.instancesFor(g)}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		v.key = "" // try again with the next snapshot
		return fmt.Errorf("vrrp config for group %s: %w", v.group, err)
	}
	ann, err := v.newAnnouncer(cfg)
	if err != nil {
		v.key = ""
		return fmt.Errorf("start vrrp for group %s: %w", v.group, err)
	}
	ctx, cancel := context.WithCancel(v.base)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := ann.Run(ctx); err != nil {
			v.log.Error("vrrp announcer stopped", zap.Error(err))
		}
	}()
	v.ann, v.stopRun, v.done, v.vrid = ann, cancel, done, g.VRID
	v.names = nil
	for _, in := range cfg.Instances {
		v.names = append(v.names, in.Name)
	}
	v.log.Info("vrrp announcing", zap.String("group", v.group), zap.Uint8("vrid", g.VRID), zap.Stringers("vip", g.VIPs))
	return nil
}

// familyPeers returns the peers of one address family.
func familyPeers(peers []netip.Addr, v4 bool) []netip.Addr {
	var out []netip.Addr
	for _, p := range peers {
		if p.Is4() == v4 {
			out = append(out, p)
		}
	}
	return out
}

// setPeers gives the sink the group's peers as the agents' Leases have them
// (followPeers). The first known answer starts the announcer; later changes go
// to the running routers in place (their state stays), and peersUnknown then
// changes nothing. fallback is the wait's end without this node's own Lease:
// multicast until the peers are known. It reports whether it changed anything.
func (v *vrrpSink) setPeers(ctx context.Context, peers []netip.Addr, mode peerMode, fallback bool) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if mode == peersUnknown || (fallback && v.ready) {
		return false
	}
	if mode == peersMulticast {
		peers = nil
	}
	if v.ready && slices.Equal(peers, v.peers) {
		return false
	}
	first := !v.ready
	v.ready, v.peers = true, peers
	v.log.Info("vrrp peers", zap.Bool("unicast", mode == peersUnicast), zap.Stringers("peers", peers))
	if first {
		if err := v.reconcileLocked(ctx); err != nil {
			v.log.Error("start vrrp", zap.String("group", v.group), zap.Error(err))
		}
		return true
	}
	if v.ann == nil {
		return true
	}
	for _, n := range v.names {
		if err := v.ann.SetPeers(ctx, n, familyPeers(peers, strings.HasSuffix(n, "/v4"))); err != nil {
			v.log.Warn("change the vrrp peers in place; restarting the announcer", zap.String("instance", n), zap.Error(err))
			v.stopLocked()
			v.key = ""
			if err := v.reconcileLocked(ctx); err != nil {
				v.log.Error("restart vrrp", zap.String("group", v.group), zap.Error(err))
			}
			break
		}
	}
	return true
}

// setVIPsLocked gives the running announcer g's VIPs, when only they changed
// within the families it runs (an L4 Service made or removed): its routers keep
// their state, so ownership of the other VIPs never moves. It reports false when
// the announcer must be rebuilt: none runs, the VRID or the families changed, or
// the change failed.
func (v *vrrpSink) setVIPsLocked(ctx context.Context, g model.Group) bool {
	if v.ann == nil || g.VRID != v.vrid {
		return false
	}
	want := v.instancesFor(g)
	if !slices.EqualFunc(want, v.names, func(ic vrrp.InstanceConfig, name string) bool { return ic.Name == name }) {
		return false
	}
	for _, ic := range want {
		if err := v.ann.SetVIPs(ctx, ic.Name, ic.VIPs); err != nil {
			v.log.Warn("change the vrrp addresses in place; restarting the announcer", zap.String("instance", ic.Name), zap.Error(err))
			return false
		}
	}
	return true
}

// announcedGroup returns the named group with the VIPs of the L4 Services and
// Views (Gateways) it serves added to its own (sorted): the addresses its
// announcer claims and its replicas hold on lo.
func announcedGroup(snap model.Snapshot, name string) model.Group {
	for _, g := range snap.Groups {
		if g.Name != name {
			continue
		}
		vips := slices.Clone(g.VIPs)
		for _, s := range snap.Services {
			if s.Group == name {
				vips = append(vips, s.VIPs...)
			}
		}
		for _, v := range snap.Views {
			if v.Group == name {
				vips = append(vips, v.VIPs...)
			}
		}
		slices.SortFunc(vips, netip.Addr.Compare)
		g.VIPs = slices.Compact(vips)
		return g
	}
	return model.Group{}
}

// syncLo keeps the group's VIPs on lo (the replicas answer for them, direct
// server return): written when they change, and once after start, since what an
// earlier agent recorded is not proof of what lo holds.
func syncLo(set func(want, managed []netip.Addr) error, synced *bool, managed *[]netip.Addr, want []netip.Addr) error {
	if *synced && slices.Equal(want, *managed) {
		return nil
	}
	*synced = false
	if err := set(want, *managed); err != nil {
		return err
	}
	*managed, *synced = slices.Clone(want), true
	return nil
}

// setHealthy moves the announcer's priority between the configured and the
// degraded value, so an unhealthy node hands the VIP to a healthy one.
func (v *vrrpSink) setHealthy(ctx context.Context, ok bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if ok == v.healthy {
		return
	}
	v.healthy = ok
	if v.ann == nil {
		return
	}
	for _, n := range v.names {
		if err := v.ann.SetPriority(ctx, n, v.currentPriority()); err != nil {
			v.log.Warn("set vrrp priority", zap.String("group", v.group), zap.Error(err))
		}
	}
	v.log.Info("vrrp priority changed with health", zap.Bool("healthy", ok), zap.Uint8("to", v.currentPriority()))
}

// stop releases ownership (a Master sends priority 0, so a Backup takes over
// after its skew time) and waits for the announcer to finish.
func (v *vrrpSink) stop() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.stopLocked()
}

func (v *vrrpSink) stopLocked() {
	if v.stopRun == nil {
		return
	}
	v.stopRun()
	<-v.done
	v.ann, v.stopRun, v.done, v.names = nil, nil, nil, nil
}

// vips returns the group's VIPs as the last snapshot has them: the addresses
// the announcer sends no advert from.
func (v *vrrpSink) vips() []netip.Addr {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.want.VIPs)
}

// states reports each virtual router's state, for /readyz and logs.
func (v *vrrpSink) states() map[string]vrrp.State {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.ann == nil {
		return nil
	}
	return v.ann.States()
}
