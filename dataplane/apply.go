package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"go.uber.org/zap"
)

// applied is what the maps hold, as this process last wrote or recovered it.
type applied struct {
	vipIDs     map[netip.Addr]uint32
	vipKeys    map[lbVipKey]lbVipVal
	backendIDs map[backendKey]uint32
	// retired: the ids of backends removed, which a replica that comes back
	// gets again while no other took it: the rings of a transition still name
	// it by that id.
	retired  map[backendKey]uint32
	backends map[uint32]lbBackend
	rings    map[uint32][]uint32 // vip id -> slot -> backend id
	// prevUntil: vip id -> until when its previous ring counts (monotonic ns).
	prevUntil map[uint32]time.Duration
	// prevSlots, midSlots: vip id -> the slots of its previous ring and of
	// its mid rings (newest first), as this process wrote them (unknown after
	// a restart), so that a ring the history holds already is not kept twice.
	prevSlots map[uint32][]uint32
	midSlots  map[uint32][][]uint32
	// midHead: vip id -> the place of its newest mid ring in its circle
	// (rings_meta.mid_head; the count is len(midSlots)).
	midHead map[uint32]uint32
	digests map[uint32]string
	peers   map[lbPeerKey]bool
	// sitePeers: the other sites' edges' tunnel addresses (site_peers).
	sitePeers map[lbSitePeerKey]bool
	nextID    uint32 // where the round-robin backend id search starts
	// remotes: vip id -> its group's remote edges with their backend ids, for
	// Handover; handGroup: vip id -> its group's name.
	remotes   map[uint32][]remoteID
	handGroup map[uint32]string
	// handing: vip id -> the hand-over ring its previous ring is (Handover),
	// until its transition ends or a ring change makes its own ring previous.
	handing map[uint32][]uint32
	tunnel  netip.Addr
	// self: this node's own replica address, as self_addr holds it, and
	// which tags are on (tagsExact).
	self netip.Addr
	tags lbSelfTags
	// differ: self_addr pins every new connection (Desired.Differ).
	differ bool
	// tagMACs: what tag_macs holds (not pinned: empty after a restart).
	tagMACs map[uint32]lbTagMac
}

// ApplyStats says what one Apply changed.
type ApplyStats struct {
	VIPKeys, Backends, Rings, Peers int // entries written or deleted
}

// Apply makes the maps say what want says. It is idempotent and diff-based: only
// entries that differ are written, VIP and backend ids stay stable, and a VIP's
// ring is replaced whole (a new inner map swapped in), so no packet sees half a
// table. On a validation error nothing is written.
func (d *Dataplane) Apply(want Desired) (ApplyStats, error) {
	var stats ApplyStats
	if err := d.rejoin(want); err != nil {
		return stats, err
	}
	plan, err := d.plan(want)
	if err != nil {
		return stats, err
	}
	if err := d.Expire(); err != nil {
		return stats, err
	}
	// Order matters for packets in flight: new peers first, backends before
	// the rings that name them, rings before the VIP keys that lead to them;
	// deletions the other way. A new peer's frames must never meet rings that
	// already name its replica while this node still takes them for a
	// router's (it would steer its SYN back: a restarted agent did, and the
	// connection opened at a replica no ring named, TestBGPReplicaChange).
	// A backend whose tag is another's turns tags off before any ring names it.
	// Pinning every new connection (Desired.Differ) starts before the rings
	// that differ from the other edges' and ends after them.
	self := selfOf(want, d.st.self)
	if self.IsValid() {
		if err := d.setSelf(&d.st, self, d.st.tags&tagsExact(self, d.st.backends, plan.backends), d.st.differ || want.Differ); err != nil {
			return stats, err
		}
	}
	if err := d.addPeers(plan, &stats); err != nil {
		return stats, err
	}
	if err := d.writeBackends(plan, &stats); err != nil {
		return stats, err
	}
	if err := d.writeRings(plan, &stats); err != nil {
		return stats, err
	}
	if err := d.startArrivals(plan); err != nil {
		return stats, err
	}
	if err := d.writeVIPKeys(plan, &stats); err != nil {
		return stats, err
	}
	if self.IsValid() {
		if err := d.setSelf(&d.st, self, tagsExact(self, plan.backends), want.Differ); err != nil {
			return stats, err
		}
	}
	if err := d.setTagMACs(plan.backends); err != nil {
		return stats, err
	}
	if err := d.forgetPeers(plan, &stats); err != nil {
		return stats, err
	}
	seedChanged := d.cfg.Seed != want.Seed
	d.cfg.Seed = want.Seed
	if err := d.setTunnel(want.Tunnel); err != nil {
		return stats, err
	}
	d.st.remotes, d.st.handGroup = plan.remotes, plan.handGroup

	if err := d.deleteVIPKeys(plan, &stats); err != nil {
		return stats, err
	}
	if err := d.deleteRings(plan, &stats); err != nil {
		return stats, err
	}
	if err := d.retireBackends(plan, &stats); err != nil {
		return stats, err
	}
	d.st.vipIDs = plan.vipIDs
	if stats.VIPKeys+stats.Backends+stats.Rings+stats.Peers > 0 || seedChanged {
		// Every CPU's flow cache (and memo of peer MACs) was filled from the old
		// maps: retire it, now that the maps say what want says.
		d.cfg.Generation++
		if err := d.writeConfig(); err != nil {
			return stats, err
		}
	}
	if stats != (ApplyStats{}) {
		d.log.Info("data plane applied", zap.Int("vip_keys", stats.VIPKeys), zap.Int("backends", stats.Backends), zap.Int("rings", stats.Rings), zap.Int("peers", stats.Peers))
	}
	return stats, nil
}

// rejoin, on the first Apply with rings after a restart (Options.Rejoin),
// applies want with this node's own replicas down first (localDown), so that
// the rings' history holds the down the other edges saw.
func (d *Dataplane) rejoin(want Desired) error {
	if !d.rejoining || !wantsRings(want) {
		return nil
	}
	d.rejoining = false
	if down, ok := localDown(want); ok {
		if _, err := d.Apply(down); err != nil {
			return fmt.Errorf("replay this node's down after a restart: %w", err)
		}
		d.log.Info("agent restarted: its replica's down, which the other edges saw, is in the rings' history")
	}
	return nil
}

// selfOf is this node's own replica address in want (its first local
// backend), or was if want has none.
func selfOf(want Desired, was netip.Addr) netip.Addr {
	for _, g := range want.Groups {
		if i := slices.IndexFunc(g.Backends, func(b Backend) bool { return b.Local }); i >= 0 {
			return g.Backends[i].Addr.Unmap()
		}
	}
	return was
}

// addPeers writes the plan's new peers. Other sites' edges are taken from
// before anything sends them traffic that they answer through a tunnel; a new
// peer of this site retires the CPUs' memo of peers (src_macs), which holds
// for one generation.
func (d *Dataplane) addPeers(plan plan, stats *ApplyStats) error {
	added, err := putNew(d.objs.SitePeers, lbMapSitePeers, d.st.sitePeers, plan.sitePeers)
	stats.Peers += added
	if err != nil {
		return err
	}
	if added, err := putNew(d.objs.Peers, lbMapPeers, d.st.peers, plan.peers); err != nil {
		return err
	} else if added > 0 {
		stats.Peers += added
		d.cfg.Generation++
		if err := d.writeConfig(); err != nil {
			return err
		}
	}
	return nil
}

// writeBackends writes the plan's backends that are new or changed.
func (d *Dataplane) writeBackends(plan plan, stats *ApplyStats) error {
	for id, be := range plan.backends {
		if old, ok := d.st.backends[id]; ok && old == be {
			continue
		}
		if err := d.objs.Backends.Put(id, &be); err != nil {
			return fmt.Errorf("update map backends: %w", err)
		}
		d.st.backends[id] = be
		stats.Backends++
	}
	return nil
}

// writeRings swaps in the plan's rings that are new or changed (swapRing).
func (d *Dataplane) writeRings(plan plan, stats *ApplyStats) error {
	for vip, ids := range plan.rings {
		d.st.digests[vip] = plan.digests[vip]
		if slices.Equal(d.st.rings[vip], ids) {
			continue
		}
		if err := d.swapRing(vip, ids); err != nil {
			return err
		}
		d.st.rings[vip] = ids
		d.st.digests[vip] = plan.digests[vip]
		stats.Rings++
	}
	return nil
}

// startArrivals, on a new director's first Apply with rings (Options.Arrival),
// makes each VIP's arrival ring its previous ring where it differs from the
// current one.
func (d *Dataplane) startArrivals(plan plan) error {
	if !d.arriving || len(plan.rings) == 0 {
		return nil
	}
	d.arriving = false
	started := 0
	for vip, slots := range plan.arrival {
		if slices.Equal(slots, plan.rings[vip]) {
			continue
		}
		if err := d.startArrival(vip, slots); err != nil {
			return err
		}
		started++
	}
	d.log.Info("new director: flows older than this node's replica go where the others sent them",
		zap.Int("vips_in_transition", started), zap.Duration("for", d.opts.Transition))
	return nil
}

// writeVIPKeys writes the plan's VIP keys that are new or changed.
func (d *Dataplane) writeVIPKeys(plan plan, stats *ApplyStats) error {
	for k, v := range plan.vipKeys {
		if old, ok := d.st.vipKeys[k]; ok && old == v {
			continue
		}
		if err := d.objs.Vips.Put(&k, &v); err != nil {
			return fmt.Errorf("update map vips: %w", err)
		}
		d.st.vipKeys[k] = v
		stats.VIPKeys++
	}
	return nil
}

// forgetPeers deletes the peers the plan no longer has. Peers that go are
// forgotten last (a frame their director sent is still in flight).
func (d *Dataplane) forgetPeers(plan plan, stats *ApplyStats) error {
	gone, err := deleteGone(d.objs.Peers, lbMapPeers, d.st.peers, plan.peers)
	stats.Peers += gone
	if err != nil {
		return err
	}
	gone, err = deleteGone(d.objs.SitePeers, lbMapSitePeers, d.st.sitePeers, plan.sitePeers)
	stats.Peers += gone
	return err
}

// deleteVIPKeys deletes the VIP keys the plan no longer has.
func (d *Dataplane) deleteVIPKeys(plan plan, stats *ApplyStats) error {
	for k := range d.st.vipKeys {
		if _, ok := plan.vipKeys[k]; ok {
			continue
		}
		if err := d.objs.Vips.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete from map vips: %w", err)
		}
		delete(d.st.vipKeys, k)
		stats.VIPKeys++
	}
	return nil
}

// deleteRings deletes the rings of the VIPs the plan no longer has, and ends
// their transitions.
func (d *Dataplane) deleteRings(plan plan, stats *ApplyStats) error {
	for vip := range d.st.rings {
		if _, ok := plan.rings[vip]; ok {
			continue
		}
		if err := d.objs.Rings.Delete(vip); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete from map rings: %w", err)
		}
		if err := d.endTransition(vip); err != nil {
			return err
		}
		delete(d.st.rings, vip)
		delete(d.st.digests, vip)
		stats.Rings++
	}
	return nil
}

// retireBackends clears the backends the plan no longer has, each with its
// address kept: a restarted agent gives the replica the same id if it returns
// (recover), as this process does (retired).
func (d *Dataplane) retireBackends(plan plan, stats *ApplyStats) error {
	for id, be := range d.st.backends {
		if _, ok := plan.backends[id]; ok {
			continue
		}
		if err := d.objs.Backends.Put(id, &lbBackend{Addr: be.Addr, VipId: be.VipId, Flags: be.Flags & uint16(lbBackendFlagsBACKEND_F_SPILL)}); err != nil {
			return fmt.Errorf("clear entry of map backends: %w", err)
		}
		delete(d.st.backends, id)
		delete(d.st.backendIDs, keyOf(be))
		d.st.retired[keyOf(be)] = id
		stats.Backends++
	}
	return nil
}

// Digests returns the Maglev table digest of each VIP address, as applied.
func (d *Dataplane) Digests() map[netip.Addr]string {
	out := map[netip.Addr]string{}
	for a, id := range d.st.vipIDs {
		if dg, ok := d.st.digests[id]; ok {
			out[a] = dg
		}
	}
	return out
}

// wantsRings reports whether some group of want has VIPs and backends.
func wantsRings(want Desired) bool {
	return slices.ContainsFunc(want.Groups, func(g Group) bool { return len(g.VIPs) > 0 && len(g.Backends) > 0 })
}

// localDown is want with this node's own replicas Down (Options.Rejoin), and
// whether that changes anything. A group whose other replicas could take no
// new flows (every one down: a draining one takes them when none is ready)
// keeps its own: liveness never empties a ring either.
func localDown(want Desired) (Desired, bool) {
	out, changed := want, false
	out.Groups = slices.Clone(want.Groups)
	for i, g := range out.Groups {
		others := slices.ContainsFunc(g.Backends, func(b Backend) bool { return !b.Local && !b.Down })
		if !others || !slices.ContainsFunc(g.Backends, func(b Backend) bool { return b.Local && !b.Down }) {
			continue
		}
		g.Backends = slices.Clone(g.Backends)
		for j := range g.Backends {
			if g.Backends[j].Local {
				g.Backends[j].Down = true
			}
		}
		out.Groups[i], changed = g, true
	}
	return out, changed
}

// putNew writes into m (named name) the keys of want that have lacks, adds them
// to have, and says how many.
func putNew[K comparable](m *ebpf.Map, name string, have, want map[K]bool) (int, error) {
	added := 0
	for k := range want {
		if have[k] {
			continue
		}
		if err := m.Put(&k, uint32(1)); err != nil {
			return added, fmt.Errorf("update map %s: %w", name, err)
		}
		have[k] = true
		added++
	}
	return added, nil
}

// deleteGone deletes from m (named name) the keys of have that want lacks,
// removes them from have, and says how many.
func deleteGone[K comparable](m *ebpf.Map, name string, have, want map[K]bool) (int, error) {
	gone := 0
	for k := range have {
		if want[k] {
			continue
		}
		if err := m.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return gone, fmt.Errorf("delete from map %s: %w", name, err)
		}
		delete(have, k)
		gone++
	}
	return gone, nil
}
