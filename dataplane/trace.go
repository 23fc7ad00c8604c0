package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Trace is what this node's maps say about one flow: the question an operator
// asks when a connection hangs or is reset ("where does this node send it, and
// why?"). It reads the maps only; it sends nothing.
type Trace struct {
	Flow Flow
	VIP  bool // the flow's destination is a VIP of this node
	// Closed: a VIP address on a port it does not serve (xdp_lb drops it).
	Closed bool
	VIPID  uint32
	Hash   uint32
	Slot   uint32 // FlowHash % ring size
	Moved  bool   // some ring of the transition names another replica there
	Rings  []TraceRing
	Pinned *TracePin // in flows: a director's pin or a hand-off
	New    *TracePin // in new_pins: a SYN seen in a moved slot, not yet its next packet
	// Transition is how long the VIP's history still counts; 0 outside one.
	Transition time.Duration
}

// TraceRing is the replica one ring of the VIP gives the flow.
type TraceRing struct {
	Ring    string // "previous", "current", or "mid N" (1: the newest)
	Backend TraceBackend
}

// TraceBackend is a backend id and what the backends map says of it.
type TraceBackend struct {
	ID                                   uint32
	Addr                                 netip.Addr // invalid: a gone backend
	Local, Draining, Down, Remote, Spill bool
	// Removed: the entry is cleared (xdp_lb skips it); Addr is the replica it
	// was, if the entry kept it.
	Removed bool
}

// TracePin is an entry of flows or new_pins.
type TracePin struct {
	Backend TraceBackend
	// Hop is the class (+1) of the replica a hand-off pin sent it to;
	// PinGuess for a director's guess; 0 for an exact pin.
	Hop  uint32
	Seen time.Duration // since the entry was last used
}

// PinGuess is TracePin.Hop of a director's pin that is a guess along the chain.
const PinGuess = uint32(lbLbLimitsLB_PIN_GUESS)

// Trace reads what the pinned maps say about f.
func (in *Inspector) Trace(f Flow) (Trace, error) { return in.m.trace(f) }

// Trace reads what this process's maps say about f (see Inspector.Trace).
func (d *Dataplane) Trace(f Flow) (Trace, error) { return d.maps().trace(f) }

func (m maps) trace(f Flow) (Trace, error) {
	f.Src, f.Dst = f.Src.Unmap(), f.Dst.Unmap()
	t := Trace{Flow: f}
	var cfg lbLbConfig
	if err := m.cfg.Lookup(uint32(0), &cfg); err != nil {
		return t, &mapReadError{lbMapLbCfg, err}
	}
	// A port-specific entry wins over the VIP's every-port entry.
	for _, port := range []uint16{f.DPort, 0} {
		k := lbVipKey{Addr: addr16(f.Dst), Port: portToMap(port), Proto: f.Protocol}
		var v lbVipVal
		err := m.vips.Lookup(&k, &v)
		if err == nil {
			t.VIP, t.VIPID = true, v.VipId
			t.Closed = v.Flags&uint32(lbVipFlagsVIP_F_CLOSED) != 0
			break
		}
		if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return t, &mapReadError{lbMapVips, err}
		}
	}
	if !t.VIP || t.Closed || cfg.RingSize == 0 {
		return t, nil
	}
	t.Hash = FlowHash(f, cfg.Seed)
	t.Slot = t.Hash % cfg.RingSize
	var meta lbRingMeta
	if err := m.ringsMeta.Lookup(t.VIPID, &meta); err != nil {
		return t, &mapReadError{lbMapRingsMeta, err}
	}
	if until := time.Duration(meta.PrevUntilNs); until > coarseNow() {
		t.Transition = until - coarseNow()
	}
	slotOf := func(outer *ebpf.Map, key uint32) (uint16, bool, error) {
		packed, err := readPacked(outer, key, cfg.RingSize)
		if packed == nil {
			return 0, false, err
		}
		return binary.LittleEndian.Uint16(packed[2*t.Slot:]), true, nil
	}
	add := func(name string, outer *ebpf.Map, key uint32) error {
		raw, ok, err := slotOf(outer, key)
		if !ok {
			return err
		}
		if name == "current" {
			t.Moved = raw&uint16(lbLbLimitsLB_SLOT_MOVED) != 0
		}
		be, err := m.traceBackend(uint32(raw &^ uint16(lbLbLimitsLB_SLOT_MOVED)))
		if err != nil {
			return err
		}
		t.Rings = append(t.Rings, TraceRing{Ring: name, Backend: be})
		return nil
	}
	// In the order xdp_lb builds a flow's chain from them: previous, current,
	// then the mid rings, newest first.
	if t.Transition > 0 {
		if err := add("previous", m.prevRings, t.VIPID); err != nil {
			return t, err
		}
	}
	if err := add("current", m.rings, t.VIPID); err != nil {
		return t, err
	}
	if t.Transition > 0 {
		for k := range min(int(meta.MidCount), int(lbLbLimitsLB_MID_RINGS)) {
			if err := add(fmt.Sprintf("mid %d", k+1), m.midRings, midKey(t.VIPID, midPlace(meta.MidHead, k))); err != nil {
				return t, err
			}
		}
	}
	var err error
	if t.Pinned, err = m.tracePin(m.flows, lbMapFlows, f); err != nil {
		return t, err
	}
	t.New, err = m.tracePin(m.newPins, lbMapNewPins, f)
	return t, err
}

func (m maps) traceBackend(id uint32) (TraceBackend, error) {
	b := TraceBackend{ID: id}
	if id == 0 {
		return b, nil
	}
	var be lbBackend
	if err := m.backends.Lookup(id, &be); err != nil {
		return b, &mapReadError{lbMapBackends, err}
	}
	has := func(f lbBackendFlags) bool { return be.Flags&uint16(f) != 0 }
	if be.Addr != [16]byte{} {
		b.Addr = addrFrom16(be.Addr)
	}
	if !has(lbBackendFlagsBACKEND_F_ACTIVE) {
		b.Removed = true
		return b, nil
	}
	b.Local, b.Draining, b.Down = has(lbBackendFlagsBACKEND_F_LOCAL), has(lbBackendFlagsBACKEND_F_DRAINING), has(lbBackendFlagsBACKEND_F_DOWN)
	b.Remote, b.Spill = has(lbBackendFlagsBACKEND_F_REMOTE), has(lbBackendFlagsBACKEND_F_SPILL)
	return b, nil
}

func (m maps) tracePin(table *ebpf.Map, name string, f Flow) (*TracePin, error) {
	var v lbFlowVal
	k := f.key()
	if err := table.Lookup(&k, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil, nil
		}
		return nil, &mapReadError{name, err}
	}
	be, err := m.traceBackend(v.BackendId)
	if err != nil {
		return nil, err
	}
	p := &TracePin{Backend: be, Hop: v.Hop}
	if now := coarseNow(); now > time.Duration(v.LastSeenNs) {
		p.Seen = now - time.Duration(v.LastSeenNs)
	}
	return p, nil
}

// coarseNow is bpf_ktime_get_coarse_ns's clock, which stamps pins and leases.
func coarseNow() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts)
	return time.Duration(ts.Nano())
}
