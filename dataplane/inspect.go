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
	"golang.org/x/sys/unix"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/dataplane/pins"
)

// Inspector reads the pinned maps of a running xdp_lb, read-only, for the
// operator's `portico` subcommands. It needs no agent to be running.
type Inspector struct {
	m maps
}

// OpenPinned opens the maps pinned at pinPath (DefaultPinPath if empty).
func OpenPinned(pinPath string) (*Inspector, error) {
	if pinPath == "" {
		pinPath = DefaultPinPath
	}
	versions, err := pinVersions(Options{RingSize: DefaultRingSize})
	if err != nil {
		return nil, err
	}
	open := func(name string) (*ebpf.Map, error) {
		path, err := pins.Find(pinPath, name, versions[name])
		if err != nil {
			return nil, fmt.Errorf("open pinned map %s (is xdp_lb loaded?): %w", name, err)
		}
		m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			return nil, fmt.Errorf("open pinned map %s (is xdp_lb loaded?): %w", name, err)
		}
		return m, nil
	}
	var in Inspector
	for _, p := range []struct {
		dst  **ebpf.Map
		name string
	}{
		{&in.m.vips, lbMapVips}, {&in.m.backends, lbMapBackends}, {&in.m.flows, lbMapFlows},
		{&in.m.rings, lbMapRings}, {&in.m.cfg, lbMapLbCfg}, {&in.m.vipStats, lbMapVipStats},
		{&in.m.backendStats, lbMapBackendStats}, {&in.m.reasonStats, lbMapReasonStats}, {&in.m.ringsMeta, lbMapRingsMeta},
		{&in.m.prevRings, lbMapPrevRings}, {&in.m.midRings, lbMapMidRings}, {&in.m.newPins, lbMapNewPins},
	} {
		if *p.dst, err = open(p.name); err != nil {
			in.Close()
			return nil, err
		}
	}
	return &in, nil
}

// Close releases the map handles.
func (in *Inspector) Close() error {
	var errs []error
	for _, m := range []*ebpf.Map{in.m.vips, in.m.backends, in.m.flows, in.m.rings, in.m.cfg, in.m.vipStats, in.m.backendStats, in.m.reasonStats, in.m.ringsMeta,
		in.m.prevRings, in.m.midRings, in.m.newPins} {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	return errors.Join(errs...)
}

// Counters reads every counter.
func (in *Inspector) Counters() (Counters, error) {
	st, err := in.m.read()
	if err != nil {
		return Counters{}, err
	}
	return in.m.counters(st)
}

// VIPView is one VIP address as the maps describe it.
type VIPView struct {
	Addr     netip.Addr
	ID       uint32
	Ports    []model.Port // sorted; Port 0 means every port
	RingSize int          // 0 when the VIP has no ring (no ready backend)
	Digest   string       // Table.Digest of the ring's content
	// Transition is how long the previous ring still counts (see the package
	// doc); 0 outside a transition.
	Transition time.Duration
	Counters   VIPCounters
	Backends   []BackendView // sorted by address
}

// BackendView is one backend of a VIP.
type BackendView struct {
	ID              uint32
	Addr            netip.Addr
	MAC             net.HardwareAddr
	Local, Draining bool
	Remote          bool // another site's edge (Desired.Groups[].Remotes)
	Weight          uint32
	Slots           int // ring slots pointing at it
	Counters        BackendCounters
}

// VIPs describes every VIP with its backends and their ring shares.
func (in *Inspector) VIPs() ([]VIPView, error) { return in.m.vipViews() }

// VIPs describes every VIP this process applied (see Inspector.VIPs).
func (d *Dataplane) VIPs() ([]VIPView, error) { return d.maps().vipViews() }

func (m maps) vipViews() ([]VIPView, error) {
	st, err := m.read()
	if err != nil {
		return nil, err
	}
	cnt, err := m.counters(st)
	if err != nil {
		return nil, err
	}
	byID := map[uint32]*VIPView{}
	for vk, vv := range st.vips {
		v := byID[vv.VipId]
		if v == nil {
			v = &VIPView{Addr: addrFrom16(vk.Addr), ID: vv.VipId, Counters: cnt.VIPs[vv.VipId]}
			byID[vv.VipId] = v
		}
		if vv.Flags&uint32(lbVipFlagsVIP_F_CLOSED) != 0 {
			continue // the ports it does not serve
		}
		proto := model.TCP
		if vk.Proto == unix.IPPROTO_UDP {
			proto = model.UDP
		}
		v.Ports = append(v.Ports, model.Port{Protocol: proto, Port: portFromMap(vk.Port)})
	}
	backends := st.backends
	for id, be := range backends {
		v := byID[be.VipId]
		if v == nil {
			continue
		}
		v.Backends = append(v.Backends, BackendView{
			ID: id, Addr: addrFrom16(be.Addr), MAC: net.HardwareAddr(be.Mac[:]),
			Local:    be.Flags&uint16(lbBackendFlagsBACKEND_F_LOCAL) != 0,
			Draining: be.Flags&uint16(lbBackendFlagsBACKEND_F_DRAINING) != 0,
			Remote:   be.Flags&uint16(lbBackendFlagsBACKEND_F_REMOTE) != 0,
			Weight:   be.Weight, Counters: cnt.Backends[id],
		})
	}
	var cfg lbLbConfig
	if err := m.cfg.Lookup(uint32(0), &cfg); err != nil {
		return nil, &mapReadError{lbMapLbCfg, err}
	}
	var out []VIPView
	now := monotonicNow()
	for _, v := range byID {
		var meta lbRingMeta
		if err := m.ringsMeta.Lookup(v.ID, &meta); err != nil {
			return nil, &mapReadError{lbMapRingsMeta, err}
		}
		if until := time.Duration(meta.PrevUntilNs); until > now {
			v.Transition = until - now
		}
		slots, err := m.ring(v.ID, cfg.RingSize)
		if err != nil {
			return nil, err
		}
		if len(slots) > 0 {
			v.RingSize = len(slots)
			count := map[uint32]int{}
			addrs := make([]netip.Addr, len(slots))
			for i, s := range slots {
				count[s]++
				addrs[i] = addrFrom16(backends[s].Addr)
			}
			v.Digest = DigestOf(addrs)
			for i := range v.Backends {
				v.Backends[i].Slots = count[v.Backends[i].ID]
			}
		}
		slices.SortFunc(v.Ports, func(a, b model.Port) int {
			return cmp.Or(strings.Compare(string(a.Protocol), string(b.Protocol)), cmp.Compare(a.Port, b.Port))
		})
		slices.SortFunc(v.Backends, func(a, b BackendView) int { return a.Addr.Compare(b.Addr) })
		out = append(out, *v)
	}
	slices.SortFunc(out, func(a, b VIPView) int { return a.Addr.Compare(b.Addr) })
	return out, nil
}

// ring reads a VIP's ring of size slots, nil if it has none.
func (m maps) ring(vipID, size uint32) ([]uint32, error) {
	return readRing(m.rings, vipID, size)
}

// readRing reads the ring an outer ring map (rings, prev_rings, mid_rings) holds
// at key, of size slots; nil if it holds none.
func readRing(outer *ebpf.Map, key, size uint32) ([]uint32, error) {
	packed, err := readPacked(outer, key, size)
	if packed == nil {
		return nil, err
	}
	return unpackRing(packed, size), nil
}

// readPacked reads the ring an outer ring map holds at key as xdp_lb sees it
// (16-bit slots, the moved bit included); nil if it holds none.
func readPacked(outer *ebpf.Map, key, size uint32) ([]byte, error) {
	vipID := key
	var inner *ebpf.Map
	if err := outer.Lookup(key, &inner); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("read map %s: %w", outer, err)
	}
	defer inner.Close()
	n := int(inner.MaxEntries())
	if n != ringElems(size) {
		return nil, fmt.Errorf("ring of vip id %d has %d elements, want %d for %d slots", vipID, n, ringElems(size), size)
	}
	mem, err := inner.Memory()
	if err != nil {
		return nil, fmt.Errorf("map ring of vip id %d: %w", vipID, err)
	}
	packed := make([]byte, n*ringElemSize)
	if _, err := mem.ReadAt(packed, 0); err != nil {
		return nil, fmt.Errorf("read ring of vip id %d: %w", vipID, err)
	}
	return packed, nil
}

// FlowView is one flow table entry.
type FlowView struct {
	Flow    Flow
	Backend netip.Addr // invalid if the backend is gone
	Age     time.Duration
}

// Flows returns up to limit flow table entries (all if limit <= 0), newest first.
func (in *Inspector) Flows(limit int) ([]FlowView, error) {
	st, err := in.m.read()
	if err != nil {
		return nil, err
	}
	backends := map[uint32]netip.Addr{}
	for id, be := range st.backends {
		backends[id] = addrFrom16(be.Addr)
	}
	now := uint64(coarseNow())
	var out []FlowView
	var k lbFlowKey
	var v lbFlowVal
	it := in.m.flows.Iterate()
	for it.Next(&k, &v) {
		age := time.Duration(0)
		if now > v.LastSeenNs {
			age = time.Duration(now - v.LastSeenNs)
		}
		out = append(out, FlowView{Flow: flowFromKey(k), Backend: backends[v.BackendId], Age: age})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read map flows: %w", err)
	}
	slices.SortFunc(out, func(a, b FlowView) int {
		if a.Age != b.Age {
			return int(a.Age - b.Age)
		}
		return a.Flow.Src.Compare(b.Flow.Src)
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// Config is the node-wide settings in lb_cfg.
type Config struct {
	Seed     uint32
	RingSize uint32
	MAC      net.HardwareAddr
}

// Config reads lb_cfg.
func (in *Inspector) Config() (Config, error) {
	var c lbLbConfig
	if err := in.m.cfg.Lookup(uint32(0), &c); err != nil {
		return Config{}, fmt.Errorf("read map lb_cfg: %w", err)
	}
	return Config{Seed: c.Seed, RingSize: c.RingSize, MAC: net.HardwareAddr(c.Mac[:])}, nil
}
