package dataplane

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/portico-edge/portico/controlplane/model"
)

// Desired is what the maps should say: plain data, built by the agent from the
// model snapshot plus what only this node knows (replica MACs, which replica is
// local).
type Desired struct {
	Seed   uint32 // cluster-wide flow hash seed, equal on every node
	Groups []Group
	// Tunnel is this node's IPv4 address for tunnels between sites (a
	// federation, Group.Remotes): packets for another site's edge leave from
	// it, and packets other sites send to it are steered here. Required with
	// Remotes.
	Tunnel netip.Addr
}

// Group is a set of VIP addresses served by the same replicas.
type Group struct {
	Name     string
	VIPs     []netip.Addr
	Ports    []model.Port // empty: every TCP and UDP port; else the others are closed (dropped)
	Backends []Backend
	// Remotes are the edges of the other sites that serve the group's VIPs
	// (anycast, in a federation), where a site hand-over (Handover) sends the
	// connections this site does not have. They are never in the ring.
	Remotes []Remote
	// Spill are the edges of the site this one overflows to, and SpillRatio
	// (0 to 0.9) the share of the ring's slots that go to them: new
	// connections there are sent through tunnels and served by that site; the
	// slots are always the same ones for a ratio (a fixed order of slots), so
	// a higher ratio only adds slots and a lower one only takes the last ones
	// back, and the ring transition keeps every connection where it started.
	Spill      []Remote
	SpillRatio float64
}

// Remote is an edge of another site, reached through a tunnel.
type Remote struct {
	Site string           // the site's name (Handover selects by it)
	Addr netip.Addr       // the edge's IPv4 tunnel address
	MAC  net.HardwareAddr // the next hop's MAC towards it
}

// Backend is one replica of a group as this node sees it.
type Backend struct {
	Addr     netip.Addr
	MAC      net.HardwareAddr // required unless Local
	Weight   uint32           // 0 counts as 1
	Local    bool             // this node: XDP_PASS
	Draining bool             // keeps its flows, gets no new ones
	// Down: the liveness checks say the replica cannot serve. It gets no new
	// flows and keeps its place in the table, so no other replica's flows move.
	// In a flow's chain it comes after every replica that serves: a survivor's
	// connection is found before a packet goes to a node that may be dead, and
	// its own connections still reach it when it is reachable (Local, or with a
	// MAC) and the check was wrong (a replica too slow for a moment under load).
	// Without a MAC it gets no entry and its flows are picked again, as if
	// removed. A UDP flow cannot be told from a new one, so it is picked again
	// rather than sent to a node that may be dead.
	Down bool
}

type backendKey struct {
	vip   uint32
	addr  netip.Addr
	spill bool // a Group.Spill entry (another site's edge can be both)
}

// keyOf is the key of a backend entry as the maps hold it.
func keyOf(be lbBackend) backendKey {
	return backendKey{be.VipId, addrFrom16(be.Addr), be.Flags&uint16(lbBackendFlagsBACKEND_F_SPILL) != 0}
}

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
	// whether tags are on (selfAddrOf).
	self netip.Addr
	tags bool
	// tagMACs: what tag_macs holds (not pinned: empty after a restart).
	tagMACs map[uint32]lbTagMac
}

// ApplyStats says what one Apply changed.
type ApplyStats struct {
	VIPKeys, Backends, Rings, Peers int // entries written or deleted
}

// recover rebuilds the id assignments from the pinned maps, so a restarted agent
// keeps every VIP and backend id (and with them the flow table) as it was.
func (d *Dataplane) recover() error {
	st := applied{
		vipIDs:     map[netip.Addr]uint32{},
		vipKeys:    map[lbVipKey]lbVipVal{},
		backendIDs: map[backendKey]uint32{},
		retired:    map[backendKey]uint32{},
		backends:   map[uint32]lbBackend{},
		rings:      map[uint32][]uint32{},
		prevUntil:  map[uint32]time.Duration{},
		prevSlots:  map[uint32][]uint32{},
		midSlots:   map[uint32][][]uint32{},
		midHead:    map[uint32]uint32{},
		digests:    map[uint32]string{},
		peers:      map[lbPeerKey]bool{},
		sitePeers:  map[lbSitePeerKey]bool{},
		nextID:     1,
		remotes:    map[uint32][]remoteID{},
		handGroup:  map[uint32]string{},
		handing:    map[uint32][]uint32{},
	}
	pinned, err := d.maps().read()
	if err != nil {
		return err
	}
	var pk lbPeerKey
	var pv uint32
	for it := d.objs.Peers.Iterate(); it.Next(&pk, &pv); {
		st.peers[pk] = true
	}
	var sk lbSitePeerKey
	for it := d.objs.SitePeers.Iterate(); it.Next(&sk, &pv); {
		st.sitePeers[sk] = true
	}
	var tc lbTunnelCfg
	if err := d.objs.Tunnel.Lookup(uint32(0), &tc); err != nil {
		return fmt.Errorf("read map tunnel: %w", err)
	}
	if tc.Src4 != [4]byte{} {
		st.tunnel = netip.AddrFrom4(tc.Src4)
	}
	for vk, vv := range pinned.vips {
		st.vipKeys[vk] = vv
		st.vipIDs[addrFrom16(vk.Addr)] = vv.VipId
	}
	for id, be := range pinned.backends {
		st.backends[id] = be
		st.backendIDs[keyOf(be)] = id
		st.nextID = max(st.nextID, id+1)
		// The other sites' edges this node sends to are the ones it takes
		// tunnel traffic from: known before the first Apply (an upgrade from
		// a version without site_peers finds it empty).
		if a := addrFrom16(be.Addr); be.Flags&uint16(lbBackendFlagsBACKEND_F_REMOTE) != 0 && a.Is4() {
			k := lbSitePeerKey{Addr: a.As4()}
			if !st.sitePeers[k] {
				if err := d.objs.SitePeers.Put(&k, uint32(1)); err != nil {
					return fmt.Errorf("update map site_peers: %w", err)
				}
				st.sitePeers[k] = true
			}
		}
	}
	// A replica removed before the restart gets its id back when it returns,
	// as it would have from this process: the rings of a transition name it
	// by that id (Apply keeps a removed backend's address in its cleared entry).
	for id, be := range pinned.retired {
		if _, taken := st.backendIDs[keyOf(be)]; !taken {
			st.retired[keyOf(be)] = id
		}
	}
	// Where this node stands in the order chains are walked, from the start
	// (self_addr is not pinned): its local replica's address.
	for _, be := range pinned.backends {
		if be.Flags&uint16(lbBackendFlagsBACKEND_F_LOCAL) != 0 {
			self := addrFrom16(be.Addr)
			if err := d.setSelf(&st, self, tagsExact(self, pinned.backends)); err != nil {
				return err
			}
			break
		}
	}
	if st.nextID >= uint32(lbLbLimitsLB_MAX_BACKENDS) {
		st.nextID = 1
	}
	// Rings are read back, so the first Apply swaps only a ring that really
	// changes: a restart must not start a transition (or cut one short by making
	// the current ring the previous one).
	for _, id := range st.vipIDs {
		slots, err := d.maps().ring(id, d.opts.RingSize)
		if err != nil {
			return err
		}
		if slots != nil {
			st.rings[id] = slots
		}
		var m lbRingMeta
		if err := d.objs.RingsMeta.Lookup(id, &m); err != nil {
			return fmt.Errorf("read map rings_meta: %w", err)
		}
		if m.PrevUntilNs != 0 {
			st.prevUntil[id] = time.Duration(m.PrevUntilNs)
			// The transition's history, so that the next ring marks its
			// moved slots right.
			if st.prevSlots[id], err = readRing(d.objs.PrevRings, id, d.opts.RingSize); err != nil {
				return err
			}
			st.midHead[id] = m.MidHead % uint32(lbLbLimitsLB_MID_RINGS)
			for k := range min(int(m.MidCount), int(lbLbLimitsLB_MID_RINGS)) {
				mid, err := readRing(d.objs.MidRings, midKey(id, midPlace(st.midHead[id], k)), d.opts.RingSize)
				if err != nil {
					return err
				}
				if mid == nil {
					break
				}
				st.midSlots[id] = append(st.midSlots[id], mid)
			}
		}
	}
	d.st = st
	return nil
}

// wantsRings reports whether some group of want has VIPs and backends.
func wantsRings(want Desired) bool {
	return slices.ContainsFunc(want.Groups, func(g Group) bool { return len(g.VIPs) > 0 && len(g.Backends) > 0 })
}

// setSelf writes this node's own replica address to self_addr, where chains
// are walked from (chain_next), and whether tags are on, if st does not hold
// them already.
func (d *Dataplane) setSelf(st *applied, self netip.Addr, tags bool) error {
	if st.self == self && st.tags == tags {
		return nil
	}
	sa := lbSelfAddr{Addr: addr16(self), Set: 1}
	if tags {
		sa.Tags = 1
	}
	if err := d.objs.SelfAddr.Put(uint32(0), &sa); err != nil {
		return fmt.Errorf("update map self_addr: %w", err)
	}
	st.self, st.tags = self, tags
	return nil
}

// setTagMACs makes tag_macs hold the MAC of every other edge of this site
// whose replica is a backend, by its tag, where tags are on (none where not):
// where a frame marked LB_MARK_DOWNPIN goes on to; and mac_tags their tags by
// MAC: whose tag a frame a director sent by its pin carries on a walk.
func (d *Dataplane) setTagMACs(backends map[uint32]lbBackend) error {
	want := map[uint32]lbTagMac{}
	if d.st.tags {
		for _, be := range backends {
			if be.Flags&uint16(lbBackendFlagsBACKEND_F_LOCAL|lbBackendFlagsBACKEND_F_REMOTE) != 0 || be.Mac == ([6]uint8{}) {
				continue
			}
			want[uint32(addrTag(be.Addr))] = lbTagMac{Mac: be.Mac}
		}
	}
	if d.st.tagMACs == nil {
		d.st.tagMACs = map[uint32]lbTagMac{}
	}
	for k, v := range want {
		if old, ok := d.st.tagMACs[k]; ok && old == v {
			continue
		}
		if err := d.objs.TagMacs.Put(k, &v); err != nil {
			return fmt.Errorf("update map tag_macs: %w", err)
		}
		// mac_tags is tag_macs the other way round, written with it.
		if err := d.objs.MacTags.Put(&lbPeerKey{Mac: v.Mac}, k); err != nil {
			return fmt.Errorf("update map mac_tags: %w", err)
		}
		d.st.tagMACs[k] = v
	}
	for k, v := range d.st.tagMACs {
		if _, ok := want[k]; ok {
			continue
		}
		if err := d.objs.TagMacs.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete from map tag_macs: %w", err)
		}
		delete(d.st.tagMACs, k)
		// Its MAC's tag too, unless another tag has that MAC now.
		stillThere := false
		for _, w := range want {
			stillThere = stillThere || w.Mac == v.Mac
		}
		if !stillThere {
			if err := d.objs.MacTags.Delete(&lbPeerKey{Mac: v.Mac}); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("delete from map mac_tags: %w", err)
			}
		}
	}
	return nil
}

// addrTag is an address's tag, as xdp_lb's addr_tag reads it: its last 16 bits.
func addrTag(a [16]byte) uint16 { return uint16(a[14])<<8 | uint16(a[15]) }

// tagsExact reports whether the last 16 bits of an address (xdp_lb's
// addr_tag) tell apart this node (self) and every backend of the maps: only
// then does a walked frame carry its director's tag, for the edges along the
// walk to skip (bpf/README.md). On a segment of a /16 or less it always holds.
func tagsExact(self netip.Addr, sets ...map[uint32]lbBackend) bool {
	tags := map[uint16]netip.Addr{addrTag(self.Unmap().As16()): self.Unmap()}
	for _, set := range sets {
		for _, be := range set {
			a := addrFrom16(be.Addr).Unmap()
			tag := addrTag(be.Addr)
			if other, ok := tags[tag]; ok && other != a {
				return false
			}
			tags[tag] = a
		}
	}
	return true
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

// localDown is want with this node's own replicas Down (Options.Rejoin), and
// whether that changes anything. A group whose other replicas do not serve
// keeps its own: liveness never empties a ring either.
func localDown(want Desired) (Desired, bool) {
	out, changed := want, false
	out.Groups = slices.Clone(want.Groups)
	for i, g := range out.Groups {
		others := slices.ContainsFunc(g.Backends, func(b Backend) bool { return !b.Local && !b.Down && !b.Draining })
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

// Apply makes the maps say what want says. It is idempotent and diff-based: only
// entries that differ are written, VIP and backend ids stay stable, and a VIP's
// ring is replaced whole (a new inner map swapped in), so no packet sees half a
// table. On a validation error nothing is written.
func (d *Dataplane) Apply(want Desired) (ApplyStats, error) {
	var stats ApplyStats
	if d.rejoining && wantsRings(want) {
		d.rejoining = false
		if down, ok := localDown(want); ok {
			if _, err := d.Apply(down); err != nil {
				return stats, fmt.Errorf("replay this node's down after a restart: %w", err)
			}
			d.log.Info("agent restarted: its replica's down, which the other edges saw, is in the rings' history")
		}
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
	self := d.st.self
	for _, g := range want.Groups {
		if i := slices.IndexFunc(g.Backends, func(b Backend) bool { return b.Local }); i >= 0 {
			self = g.Backends[i].Addr.Unmap()
			break
		}
	}
	if self.IsValid() {
		if err := d.setSelf(&d.st, self, d.st.tags && tagsExact(self, d.st.backends, plan.backends)); err != nil {
			return stats, err
		}
	}
	// Other sites' edges are taken from before anything sends them traffic
	// that they answer through a tunnel, and forgotten last.
	added, err := putNew(d.objs.SitePeers, lbMapSitePeers, d.st.sitePeers, plan.sitePeers)
	stats.Peers += added
	if err != nil {
		return stats, err
	}
	if added, err := putNew(d.objs.Peers, lbMapPeers, d.st.peers, plan.peers); err != nil {
		return stats, err
	} else if added > 0 {
		stats.Peers += added
		// Peers are memoized per CPU for one generation (src_macs).
		d.cfg.Generation++
		if err := d.writeConfig(); err != nil {
			return stats, err
		}
	}
	for id, be := range plan.backends {
		if old, ok := d.st.backends[id]; ok && old == be {
			continue
		}
		if err := d.objs.Backends.Put(id, &be); err != nil {
			return stats, fmt.Errorf("update map backends: %w", err)
		}
		d.st.backends[id] = be
		stats.Backends++
	}
	for vip, ids := range plan.rings {
		d.st.digests[vip] = plan.digests[vip]
		if slices.Equal(d.st.rings[vip], ids) {
			continue
		}
		if err := d.swapRing(vip, ids); err != nil {
			return stats, err
		}
		d.st.rings[vip] = ids
		d.st.digests[vip] = plan.digests[vip]
		stats.Rings++
	}
	if d.arriving && len(plan.rings) > 0 {
		d.arriving = false
		started := 0
		for vip, slots := range plan.arrival {
			if slices.Equal(slots, plan.rings[vip]) {
				continue
			}
			if err := d.startArrival(vip, slots); err != nil {
				return stats, err
			}
			started++
		}
		d.log.Info("new director: flows older than this node's replica go where the others sent them",
			zap.Int("vips_in_transition", started), zap.Duration("for", d.opts.Transition))
	}
	for k, v := range plan.vipKeys {
		if old, ok := d.st.vipKeys[k]; ok && old == v {
			continue
		}
		if err := d.objs.Vips.Put(&k, &v); err != nil {
			return stats, fmt.Errorf("update map vips: %w", err)
		}
		d.st.vipKeys[k] = v
		stats.VIPKeys++
	}
	if self.IsValid() {
		if err := d.setSelf(&d.st, self, tagsExact(self, plan.backends)); err != nil {
			return stats, err
		}
	}
	if err := d.setTagMACs(plan.backends); err != nil {
		return stats, err
	}
	// Peers that go are forgotten last (a frame their director sent is
	// still in flight).
	gone, err := deleteGone(d.objs.Peers, lbMapPeers, d.st.peers, plan.peers)
	stats.Peers += gone
	if err != nil {
		return stats, err
	}
	gone, err = deleteGone(d.objs.SitePeers, lbMapSitePeers, d.st.sitePeers, plan.sitePeers)
	stats.Peers += gone
	if err != nil {
		return stats, err
	}
	seedChanged := d.cfg.Seed != want.Seed
	d.cfg.Seed = want.Seed
	if want.Tunnel != d.st.tunnel {
		var tc lbTunnelCfg
		if want.Tunnel.IsValid() {
			tc.Src4 = want.Tunnel.Unmap().As4()
		}
		if err := d.objs.Tunnel.Put(uint32(0), &tc); err != nil {
			return stats, fmt.Errorf("update map tunnel: %w", err)
		}
		d.st.tunnel = want.Tunnel
	}
	d.st.remotes, d.st.handGroup = plan.remotes, plan.handGroup

	for k := range d.st.vipKeys {
		if _, ok := plan.vipKeys[k]; ok {
			continue
		}
		if err := d.objs.Vips.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return stats, fmt.Errorf("delete from map vips: %w", err)
		}
		delete(d.st.vipKeys, k)
		stats.VIPKeys++
	}
	for vip := range d.st.rings {
		if _, ok := plan.rings[vip]; ok {
			continue
		}
		if err := d.objs.Rings.Delete(vip); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return stats, fmt.Errorf("delete from map rings: %w", err)
		}
		if err := d.endTransition(vip); err != nil {
			return stats, err
		}
		delete(d.st.rings, vip)
		delete(d.st.digests, vip)
		stats.Rings++
	}
	for id, be := range d.st.backends {
		if _, ok := plan.backends[id]; ok {
			continue
		}
		// Cleared (not active), with its address kept: a restarted agent
		// gives the replica the same id if it returns (Load).
		if err := d.objs.Backends.Put(id, &lbBackend{Addr: be.Addr, VipId: be.VipId, Flags: be.Flags & uint16(lbBackendFlagsBACKEND_F_SPILL)}); err != nil {
			return stats, fmt.Errorf("clear entry of map backends: %w", err)
		}
		delete(d.st.backends, id)
		delete(d.st.backendIDs, keyOf(be))
		d.st.retired[keyOf(be)] = id
		stats.Backends++
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

type plan struct {
	peers map[lbPeerKey]bool // every remote backend's MAC
	// sitePeers: every other site's edge's tunnel address (Remotes, Spill).
	sitePeers map[lbSitePeerKey]bool
	vipIDs    map[netip.Addr]uint32
	vipKeys   map[lbVipKey]lbVipVal
	backends  map[uint32]lbBackend
	rings     map[uint32][]uint32
	digests   map[uint32]string
	arrival   map[uint32][]uint32 // with d.arriving: vip id -> the ring before this node joined
	// remotes, handGroup: see applied.
	remotes   map[uint32][]remoteID
	handGroup map[uint32]string
}

// plan validates want and assigns ids, reusing the ones already in the maps. It
// only reserves new ids in d.st once the whole of want is valid.
func (d *Dataplane) plan(want Desired) (plan, error) {
	p := plan{
		peers:     map[lbPeerKey]bool{},
		sitePeers: map[lbSitePeerKey]bool{},
		vipIDs:    map[netip.Addr]uint32{},
		vipKeys:   map[lbVipKey]lbVipVal{},
		backends:  map[uint32]lbBackend{},
		rings:     map[uint32][]uint32{},
		digests:   map[uint32]string{},
		arrival:   map[uint32][]uint32{},
		remotes:   map[uint32][]remoteID{},
		handGroup: map[uint32]string{},
	}
	var problems []string
	if want.Tunnel.IsValid() && !want.Tunnel.Unmap().Is4() {
		problems = append(problems, fmt.Sprintf("tunnel address %s is not IPv4", want.Tunnel))
	}
	groupOf := map[netip.Addr]string{}
	for _, g := range want.Groups {
		for _, v := range g.VIPs {
			if !v.IsValid() {
				problems = append(problems, fmt.Sprintf("group %s: invalid VIP", g.Name))
				continue
			}
			v = v.Unmap()
			if other, dup := groupOf[v]; dup {
				problems = append(problems, fmt.Sprintf("VIP %s in groups %s and %s", v, other, g.Name))
			}
			groupOf[v] = g.Name
		}
		seen := map[netip.Addr]bool{}
		for _, b := range g.Backends {
			switch {
			case !b.Addr.IsValid():
				problems = append(problems, fmt.Sprintf("group %s: backend without address", g.Name))
			case seen[b.Addr.Unmap()]:
				problems = append(problems, fmt.Sprintf("group %s: backend %s listed twice", g.Name, b.Addr))
			case !b.Local && !b.Down && len(b.MAC) != 6:
				problems = append(problems, fmt.Sprintf("group %s: remote backend %s has no MAC", g.Name, b.Addr))
			case !b.Local && len(b.MAC) == 6:
				var k lbPeerKey
				copy(k.Mac[:], b.MAC)
				p.peers[k] = true
			}
			seen[b.Addr.Unmap()] = true
		}
		for _, r := range slices.Concat(g.Remotes, g.Spill) {
			if r.Addr.Unmap().Is4() {
				p.sitePeers[lbSitePeerKey{Addr: r.Addr.Unmap().As4()}] = true
			}
		}
		for _, r := range g.Remotes {
			if problem := r.check("remote", want.Tunnel); problem != "" {
				problems = append(problems, fmt.Sprintf("group %s: %s", g.Name, problem))
			} else if seen[r.Addr.Unmap()] {
				problems = append(problems, fmt.Sprintf("group %s: %s is a replica and a remote edge", g.Name, r.Addr))
			}
			seen[r.Addr.Unmap()] = true
		}
		for _, r := range g.Spill {
			if problem := r.check("spill", want.Tunnel); problem != "" {
				problems = append(problems, fmt.Sprintf("group %s: %s", g.Name, problem))
			}
		}
		if g.SpillRatio < 0 || g.SpillRatio > MaxSpill || (g.SpillRatio > 0 && len(g.Spill) == 0) {
			problems = append(problems, fmt.Sprintf("group %s: spill ratio %v: want 0 to %v, and spill edges", g.Name, g.SpillRatio, MaxSpill))
		}
		for _, port := range g.Ports {
			if port.Protocol != model.TCP && port.Protocol != model.UDP {
				problems = append(problems, fmt.Sprintf("group %s: protocol %q", g.Name, port.Protocol))
			}
		}
	}
	if len(problems) > 0 {
		return p, fmt.Errorf("invalid data plane input: %s", strings.Join(problems, "; "))
	}

	// VIP ids: keep the ones in use, give new VIPs the lowest free id.
	used := map[uint32]bool{}
	for a := range groupOf {
		if id, ok := d.st.vipIDs[a]; ok {
			p.vipIDs[a] = id
			used[id] = true
		}
	}
	newVIPs := []netip.Addr{}
	for a := range groupOf {
		if _, ok := p.vipIDs[a]; !ok {
			newVIPs = append(newVIPs, a)
		}
	}
	slices.SortFunc(newVIPs, netip.Addr.Compare)
	next := uint32(0)
	for _, a := range newVIPs {
		for used[next] {
			next++
		}
		if next >= uint32(lbLbLimitsLB_MAX_VIPS) {
			return p, fmt.Errorf("more than %d VIP addresses", lbLbLimitsLB_MAX_VIPS)
		}
		p.vipIDs[a] = next
		used[next] = true
	}

	// Backend ids: one per (VIP, replica); kept while the pair exists, new ones
	// taken round-robin so a freed id is not reused soon (flows may still name it).
	ids := map[backendKey]uint32{}
	usedB := map[uint32]bool{}
	for _, g := range want.Groups {
		for _, v := range g.VIPs {
			for _, k := range g.keys(p.vipIDs[v.Unmap()]) {
				if id, ok := d.st.backendIDs[k]; ok {
					ids[k] = id
					usedB[id] = true
				}
			}
		}
	}
	retiredID := map[uint32]bool{}
	for _, id := range d.st.retired {
		retiredID[id] = true
	}
	nextB := d.st.nextID
	alloc := func() (uint32, error) {
		// An id no removed backend may want back first; one that may, if
		// none is left.
		for _, spare := range []bool{false, true} {
			for range lbLbLimitsLB_MAX_BACKENDS {
				id := nextB
				nextB++
				if nextB >= uint32(lbLbLimitsLB_MAX_BACKENDS) {
					nextB = 1
				}
				if !usedB[id] && d.st.backends[id] == (lbBackend{}) && (spare || !retiredID[id]) {
					usedB[id] = true
					return id, nil
				}
			}
		}
		return 0, fmt.Errorf("more than %d backends", lbLbLimitsLB_MAX_BACKENDS-1)
	}
	// idFor is a key's backend id: the one it has, or a new one.
	idFor := func(k backendKey) (uint32, error) {
		if id, ok := ids[k]; ok {
			return id, nil
		}
		if id, ok := d.st.retired[k]; ok && !usedB[id] && d.st.backends[id] == (lbBackend{}) {
			usedB[id] = true
			ids[k] = id
			return id, nil
		}
		id, err := alloc()
		if err == nil {
			ids[k] = id
		}
		return id, err
	}

	for _, g := range want.Groups {
		var ports []model.Port
		if len(g.Ports) == 0 {
			ports = []model.Port{{Protocol: model.TCP}, {Protocol: model.UDP}}
		} else {
			ports = g.Ports
		}
		// One table per group: every VIP of the group spreads over the same
		// replicas, so only the backend ids differ between their rings. The
		// table is built from every replica; the slots of draining and down ones
		// go to a table of the serving ones, so that a replica turning draining
		// or down moves no other replica's flows.
		var members, ring []MaglevBackend
		serving := map[netip.Addr]bool{}
		for _, b := range g.Backends {
			mb := MaglevBackend{Addr: b.Addr.Unmap(), Weight: b.Weight}
			members = append(members, mb)
			if !b.Draining && !b.Down {
				ring = append(ring, mb)
				serving[mb.Addr] = true
			}
		}
		var tab, arrival Table
		var digest string
		if len(ring) > 0 && d.arriving {
			var err error
			if arrival, err = arrivalTable(g.Backends, members, d.opts.RingSize); err != nil {
				return p, fmt.Errorf("group %s: %w", g.Name, err)
			}
		}
		if len(ring) > 0 {
			var err error
			if tab, err = BuildTable(ring, d.opts.RingSize); err != nil {
				return p, fmt.Errorf("group %s: %w", g.Name, err)
			}
			if len(members) > len(ring) {
				all, err := BuildTable(members, d.opts.RingSize)
				if err != nil {
					return p, fmt.Errorf("group %s: %w", g.Name, err)
				}
				tab = all.Fill(func(a netip.Addr) bool { return serving[a] }, tab)
			}
			digest = tab.Digest()
		}
		for _, v := range g.VIPs {
			v = v.Unmap()
			vipID := p.vipIDs[v]
			for _, port := range ports {
				proto := uint8(unix.IPPROTO_TCP)
				if port.Protocol == model.UDP {
					proto = unix.IPPROTO_UDP
				}
				p.vipKeys[lbVipKey{Addr: addr16(v), Port: portToMap(port.Port), Proto: proto}] = lbVipVal{VipId: vipID}
			}
			// With ports named, the address's other TCP and UDP ports are
			// closed: xdp_lb drops what reaches them, so no listener of the
			// node (the agent's metrics, the liveness checks, the kubelet,
			// ssh) ever answers on a VIP.
			if len(g.Ports) > 0 {
				for _, proto := range []uint8{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
					k := lbVipKey{Addr: addr16(v), Port: 0, Proto: proto}
					if _, every := p.vipKeys[k]; !every {
						p.vipKeys[k] = lbVipVal{VipId: vipID, Flags: uint32(lbVipFlagsVIP_F_CLOSED)}
					}
				}
			}
			idOf := map[netip.Addr]uint32{}
			for _, b := range g.Backends {
				if b.Down && !b.Local && len(b.MAC) != 6 {
					continue // no entry: flows that name it are picked again
				}
				a := b.Addr.Unmap()
				id, err := idFor(backendKey{vip: vipID, addr: a})
				if err != nil {
					return p, err
				}
				flags := uint16(lbBackendFlagsBACKEND_F_ACTIVE)
				if b.Local {
					flags |= uint16(lbBackendFlagsBACKEND_F_LOCAL)
				}
				if b.Draining || b.Down {
					flags |= uint16(lbBackendFlagsBACKEND_F_DRAINING)
				}
				if b.Down {
					flags |= uint16(lbBackendFlagsBACKEND_F_DOWN)
				}
				p.backends[id] = lbBackend{Addr: addr16(a), Mac: mac6(b.MAC), Flags: flags, VipId: vipID, Weight: max(b.Weight, 1)}
				idOf[a] = id
			}
			if len(ring) > 0 && len(g.Remotes) > 0 {
				for _, r := range g.Remotes {
					a := r.Addr.Unmap()
					id, err := idFor(backendKey{vip: vipID, addr: a})
					if err != nil {
						return p, err
					}
					flags := uint16(lbBackendFlagsBACKEND_F_ACTIVE | lbBackendFlagsBACKEND_F_REMOTE)
					p.backends[id] = lbBackend{Addr: addr16(a), Mac: mac6(r.MAC), Flags: flags, VipId: vipID, Weight: 1}
					p.remotes[vipID] = append(p.remotes[vipID], remoteID{site: r.Site, addr: a, id: id})
				}
				p.handGroup[vipID] = g.Name
			}
			if len(ring) == 0 {
				continue
			}
			idByIndex := make([]uint32, len(tab.Backends))
			for i, a := range tab.Backends {
				idByIndex[i] = idOf[a]
			}
			slots := make([]uint32, len(tab.Slots))
			for i, s := range tab.Slots {
				slots[i] = idByIndex[s]
			}
			p.digests[vipID] = digest
			if n := spillSlots(g.SpillRatio, len(slots)); n > 0 {
				spill := make([]uint32, len(g.Spill))
				for i, r := range sortedRemotes(g.Spill) {
					k := backendKey{vip: vipID, addr: r.Addr.Unmap(), spill: true}
					id, err := idFor(k)
					if err != nil {
						return p, err
					}
					flags := uint16(lbBackendFlagsBACKEND_F_ACTIVE | lbBackendFlagsBACKEND_F_REMOTE | lbBackendFlagsBACKEND_F_SPILL)
					p.backends[id] = lbBackend{Addr: addr16(k.addr), Mac: mac6(r.MAC), Flags: flags, VipId: vipID, Weight: 1}
					spill[i] = id
				}
				for j, slot := range spillOrder(len(slots))[:n] {
					slots[slot] = spill[j%len(spill)]
				}
				p.digests[vipID] = fmt.Sprintf("%s+spill%d", digest, n)
			}
			p.rings[vipID] = slots
			if len(arrival.Slots) > 0 {
				a := make([]uint32, len(arrival.Slots))
				for i, s := range arrival.Slots {
					a[i] = idOf[arrival.Backends[s]]
				}
				p.arrival[vipID] = a
			}
		}
	}
	d.st.nextID = nextB
	for k, id := range ids {
		d.st.backendIDs[k] = id
		delete(d.st.retired, k)
	}
	for k, id := range d.st.retired {
		if usedB[id] {
			delete(d.st.retired, k) // another backend has it now
		}
	}
	return p, nil
}

// MaxSpill is the highest Group.SpillRatio: a site keeps at least a tenth of its
// new connections.
const MaxSpill = 0.9

// spillSlots is how many of a ring's slots a spill ratio takes.
func spillSlots(ratio float64, size int) int {
	if ratio <= 0 {
		return 0
	}
	return min(int(ratio*float64(size)+0.5), size)
}

// spillOrder is the order in which a ring's slots spill: a fixed pseudo-random
// permutation of the slot indices (the same on every node, for every ratio), so
// that the slots a ratio spills are spread over the ring and a higher ratio
// spills the same ones and more.
func spillOrder(size int) []int {
	order := make([]int, size)
	keys := make([]uint32, size)
	for i := range order {
		order[i] = i
		x := uint32(i) * 0x9e3779b1
		x ^= x >> 15
		x *= 0x85ebca6b
		x ^= x >> 13
		keys[i] = x
	}
	slices.SortFunc(order, func(a, b int) int {
		if keys[a] != keys[b] {
			return cmp.Compare(keys[a], keys[b])
		}
		return cmp.Compare(a, b)
	})
	return order
}

// sortedRemotes is rs by address.
func sortedRemotes(rs []Remote) []Remote {
	out := slices.Clone(rs)
	slices.SortFunc(out, func(a, b Remote) int { return a.Addr.Compare(b.Addr) })
	return out
}

// keys lists the backend keys of the group's replicas, remote and spill edges
// for one VIP.
func (g Group) keys(vip uint32) []backendKey {
	var out []backendKey
	for _, b := range g.Backends {
		out = append(out, backendKey{vip: vip, addr: b.Addr.Unmap()})
	}
	for _, r := range g.Remotes {
		out = append(out, backendKey{vip: vip, addr: r.Addr.Unmap()})
	}
	for _, r := range g.Spill {
		out = append(out, backendKey{vip: vip, addr: r.Addr.Unmap(), spill: true})
	}
	return out
}

// check says what is wrong with another site's edge (kind: remote or spill), ""
// when nothing is.
func (r Remote) check(kind string, tunnel netip.Addr) string {
	switch {
	case !r.Addr.IsValid() || !r.Addr.Unmap().Is4():
		return fmt.Sprintf("%s edge %s is not an IPv4 address", kind, r.Addr)
	case len(r.MAC) != 6:
		return fmt.Sprintf("%s edge %s has no next-hop MAC", kind, r.Addr)
	case !tunnel.IsValid():
		return kind + " edges need a tunnel address"
	}
	return ""
}

// remoteID is a remote edge's backend for one VIP.
type remoteID struct {
	site string
	addr netip.Addr
	id   uint32
}

// Handover starts a site hand-over for the VIPs of the named group that have
// remote edges (Group.Remotes) of the named sites (all of them if none is
// named): for Options.Transition, a TCP packet that no replica of this site has
// a connection for is sent, in a tunnel, to those sites' edges (by a Maglev
// ring of them), which serve it and never send it on; this node pins what it
// sent, so the connection keeps going there after the transition. A site calls
// it when the routers may bring it connections that live at another site: as it
// starts to announce a VIP again after being away, and while another site
// drains. A VIP already in the same hand-over has its lease extended; one in
// another transition has its previous ring replaced (this site's replicas are
// asked first either way). It returns how many VIPs are in a hand-over.
func (d *Dataplane) Handover(group string, sites ...string) (int, error) {
	n, started := 0, 0
	defer func() {
		if started > 0 {
			// Every CPU's flow cache holds the rings' answers of before.
			d.cfg.Generation++
			if err := d.writeConfig(); err != nil {
				d.log.Warn("hand-over: write lb_cfg", zap.Error(err))
			}
		}
	}()
	for vip, remotes := range d.st.remotes {
		if d.st.handGroup[vip] != group {
			continue
		}
		if _, ok := d.st.rings[vip]; !ok {
			continue // no ring: nothing steers the VIP here
		}
		var members []MaglevBackend
		ids := map[netip.Addr]uint32{}
		for _, r := range remotes {
			if len(sites) == 0 || slices.Contains(sites, r.site) {
				members = append(members, MaglevBackend{Addr: r.addr})
				ids[r.addr] = r.id
			}
		}
		if len(members) == 0 {
			continue
		}
		tab, err := BuildTable(members, d.opts.RingSize)
		if err != nil {
			return n, err
		}
		slots := make([]uint32, len(tab.Slots))
		for i, s := range tab.Slots {
			slots[i] = ids[tab.Backends[s]]
		}
		if slices.Equal(d.st.handing[vip], slots) && d.st.prevUntil[vip] > monotonicNow() {
			// Renewed: the lease only (writeMeta keeps where the mid
			// rings are).
			d.st.prevUntil[vip] = monotonicNow() + d.opts.Transition
			if err := d.writeMeta(vip); err != nil {
				return n, err
			}
		} else {
			if err := d.startArrival(vip, slots); err != nil {
				return n, err
			}
			started++
		}
		d.st.handing[vip] = slots
		n++
	}
	return n, nil
}

// arrivalTable is the table the other directors most likely held before this
// node's replica joined (Options.Arrival): members without the local replica and
// the down ones, draining ones still serving, in the same structure as Apply's
// (the missing replicas' slots refilled from a table of the others). Empty when
// no replica would serve.
func arrivalTable(backends []Backend, members []MaglevBackend, size uint32) (Table, error) {
	serving := map[netip.Addr]bool{}
	var ring []MaglevBackend
	for _, b := range backends {
		if !b.Local && !b.Down {
			ring = append(ring, MaglevBackend{Addr: b.Addr.Unmap(), Weight: b.Weight})
			serving[b.Addr.Unmap()] = true
		}
	}
	if len(ring) == 0 {
		return Table{}, nil
	}
	tab, err := BuildTable(ring, size)
	if err != nil || len(ring) == len(members) {
		return tab, err
	}
	all, err := BuildTable(members, size)
	if err != nil {
		return Table{}, err
	}
	return all.Fill(func(a netip.Addr) bool { return serving[a] }, tab), nil
}

// newRing is a new inner ring map holding slots; the caller closes it.
func (d *Dataplane) newRing(vip uint32, slots []uint32) (*ebpf.Map, error) {
	inner, err := ebpf.NewMap(d.inner)
	if err != nil {
		return nil, fmt.Errorf("create ring for vip id %d: %w", vip, err)
	}
	mem, err := inner.Memory()
	if err == nil {
		_, err = mem.WriteAt(packRing(slots), 0)
	}
	if err != nil {
		inner.Close()
		return nil, fmt.Errorf("fill ring for vip id %d: %w", vip, err)
	}
	return inner, nil
}

// startArrival makes slots the VIP's previous ring for a transition
// (Options.Arrival, Handover). The ring goes in before its lease, so no packet
// sees a lease without it. A previous ring it replaces within a transition
// becomes the newest mid ring: connections there are still found.
func (d *Dataplane) startArrival(vip uint32, slots []uint32) error {
	inner, err := d.newRing(vip, slots)
	if err != nil {
		return err
	}
	defer inner.Close()
	if d.st.prevUntil[vip] > monotonicNow() {
		var old *ebpf.Map
		if err := d.objs.PrevRings.Lookup(vip, &old); err == nil {
			err = d.pushMid(vip, old, d.st.prevSlots[vip])
			old.Close()
			if err != nil {
				return err
			}
		} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("read map prev_rings: %w", err)
		}
	} else if err := d.clearMids(vip); err != nil {
		return err
	}
	if err := d.objs.PrevRings.Put(vip, inner); err != nil {
		return fmt.Errorf("update map prev_rings: %w", err)
	}
	d.st.prevSlots[vip] = slots
	until := monotonicNow() + d.opts.Transition
	d.st.prevUntil[vip] = until
	if cur, ok := d.st.rings[vip]; ok {
		if err := d.putRing(vip, cur); err != nil {
			return err
		}
	}
	if err := d.writeMeta(vip); err != nil {
		return err
	}
	return d.changed(vip)
}

// writeMeta writes the VIP's transition lease and where its mid rings are.
func (d *Dataplane) writeMeta(vip uint32) error {
	m := lbRingMeta{PrevUntilNs: uint64(d.st.prevUntil[vip]), MidHead: d.st.midHead[vip], MidCount: uint32(len(d.st.midSlots[vip]))}
	if err := d.objs.RingsMeta.Put(vip, m); err != nil {
		return fmt.Errorf("update map rings_meta: %w", err)
	}
	return nil
}

// midKey is the mid_rings index of a place in a VIP's circle of mid rings.
func midKey(vip, place uint32) uint32 { return vip*uint32(lbLbLimitsLB_MID_RINGS) + place }

// midPlace is the place of the k-th newest mid ring in a circle whose newest is
// at head.
func midPlace(head uint32, k int) uint32 { return (head + uint32(k)) % uint32(lbLbLimitsLB_MID_RINGS) }

// pushMid makes ring, of slots (nil: unknown), the VIP's newest mid ring; the
// oldest one goes. A ring the history holds already is not kept twice (a
// replica called down and up again, a drain taken back): the history then
// reaches further back. It writes one place of the circle, the one before the
// newest (the oldest's, when the circle is full); the caller's writeMeta then
// makes it the newest. Until then a packet sees the history as it was (or, in
// a full circle, this ring in the oldest's place).
func (d *Dataplane) pushMid(vip uint32, ring *ebpf.Map, slots []uint32) error {
	if slots != nil {
		if slices.Equal(slots, d.st.prevSlots[vip]) {
			return nil
		}
		for _, m := range d.st.midSlots[vip] {
			if slices.Equal(slots, m) {
				return nil
			}
		}
	}
	head := midPlace(d.st.midHead[vip], int(lbLbLimitsLB_MID_RINGS)-1)
	if err := d.objs.MidRings.Put(midKey(vip, head), ring); err != nil {
		return fmt.Errorf("update map mid_rings: %w", err)
	}
	mids := append([][]uint32{slots}, d.st.midSlots[vip]...)
	d.st.midSlots[vip] = mids[:min(len(mids), int(lbLbLimitsLB_MID_RINGS))]
	d.st.midHead[vip] = head
	return nil
}

// clearMids forgets a VIP's mid rings: the places they hold are emptied (each
// delete waits for a grace period, so only those), and the caller's writeMeta
// (or a cleared lease) says there are none.
func (d *Dataplane) clearMids(vip uint32) error {
	for k := range len(d.st.midSlots[vip]) {
		err := d.objs.MidRings.Delete(midKey(vip, midPlace(d.st.midHead[vip], k)))
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete from map mid_rings: %w", err)
		}
	}
	delete(d.st.midSlots, vip)
	return nil // the head stays: the next transition's rings go on round the circle
}

// swapRing fills a new inner map with slots and puts it in place of the VIP's ring
// in one map update. The ring it replaces becomes the previous ring, which counts
// for the transition (Options.Transition) after this change; within a transition
// the previous ring stays the one from before its first change, so a burst of
// changes is one transition, and the ring replaced becomes the newest mid ring
// (connections opened between two changes live where it sent them).
func (d *Dataplane) swapRing(vip uint32, slots []uint32) error {
	// The order keeps every packet's answer sound: the history takes the
	// current ring (no slot differs from it yet), then the lease, then the
	// swap to the new ring, whose slots say where the history differs.
	var cur *ebpf.Map
	switch err := d.objs.Rings.Lookup(vip, &cur); {
	case errors.Is(err, ebpf.ErrKeyNotExist):
		// A new VIP: no older flow to keep.
		if err := d.endTransition(vip); err != nil {
			return err
		}
	case err != nil:
		return fmt.Errorf("read map rings: %w", err)
	default:
		defer cur.Close()
		now := monotonicNow()
		if d.st.prevUntil[vip] <= now {
			if err := d.clearMids(vip); err != nil {
				return err
			}
			if err := d.objs.PrevRings.Put(vip, cur); err != nil {
				return fmt.Errorf("update map prev_rings: %w", err)
			}
			d.st.prevSlots[vip] = d.st.rings[vip]
		} else if err := d.pushMid(vip, cur, d.st.rings[vip]); err != nil {
			return err
		}
		d.st.prevUntil[vip] = now + d.opts.Transition
		if err := d.writeMeta(vip); err != nil {
			return err
		}
	}
	return d.putRing(vip, slots)
}

// putRing makes slots the VIP's current ring, each slot marked LB_SLOT_MOVED
// where a ring of its transition (previous, mids) names another backend: only
// there does xdp_lb read the other rings.
func (d *Dataplane) putRing(vip uint32, slots []uint32) error {
	marked := slices.Clone(slots)
	if d.st.prevUntil[vip] > 0 {
		for _, h := range append([][]uint32{d.st.prevSlots[vip]}, d.st.midSlots[vip]...) {
			for i := range marked {
				if h == nil || (i < len(h) && h[i] != slots[i]) {
					marked[i] |= uint32(lbLbLimitsLB_SLOT_MOVED) // unknown history: every slot
				}
			}
		}
	}
	inner, err := d.newRing(vip, marked)
	if err != nil {
		return err
	}
	defer inner.Close()
	if err := d.objs.Rings.Put(vip, inner); err != nil {
		return fmt.Errorf("update map rings: %w", err)
	}
	return d.changed(vip)
}

// changed records that a VIP's rings changed now (ring_changed): for
// LB_SETTLE_MS xdp_lb drops, rather than serves, a handed-on packet that no
// replica of its chain has, since another edge may not have applied the change.
func (d *Dataplane) changed(vip uint32) error {
	if err := d.objs.RingChanged.Put(vip, uint64(monotonicNow())); err != nil {
		return fmt.Errorf("update map ring_changed: %w", err)
	}
	return nil
}

// Expire ends the transitions whose lease has passed (their previous rings are
// freed) and forgets the pin clock once no pin was used for LB_PIN_IDLE_SEC. The
// program already ignores both then; cleared, they cost it no clock read. Apply
// calls it, and an agent calls it now and then between Applies.
func (d *Dataplane) Expire() error {
	now := monotonicNow()
	for vip, until := range d.st.prevUntil {
		if until <= now {
			if err := d.endTransition(vip); err != nil {
				return err
			}
		}
	}
	idle := time.Duration(lbLbLimitsLB_PIN_IDLE_SEC) * time.Second
	for _, m := range []*ebpf.Map{d.objs.PinClock, d.objs.RelayClock} {
		var t uint64
		if err := m.Lookup(uint32(0), &t); err != nil {
			return fmt.Errorf("read map %s: %w", m, err)
		}
		if t != 0 && time.Duration(t)+idle <= now {
			if err := m.Put(uint32(0), uint64(0)); err != nil {
				return fmt.Errorf("update map %s: %w", m, err)
			}
		}
	}
	return nil
}

// endTransition forgets a VIP's previous ring.
func (d *Dataplane) endTransition(vip uint32) error {
	if err := d.objs.RingsMeta.Put(vip, lbRingMeta{}); err != nil {
		return fmt.Errorf("clear entry of map rings_meta: %w", err)
	}
	if err := d.objs.PrevRings.Delete(vip); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete from map prev_rings: %w", err)
	}
	if err := d.clearMids(vip); err != nil {
		return err
	}
	delete(d.st.prevUntil, vip)
	delete(d.st.prevSlots, vip)
	delete(d.st.handing, vip)
	return nil
}
