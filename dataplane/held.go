package dataplane

import (
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// Held is a TCP connection that an edge's own stack holds on a VIP, as its
// holder reports it: Flow in the client's direction (client to VIP), Holder
// the holder's replica address.
type Held struct {
	Flow   Flow
	Holder netip.Addr
}

// OffRing returns the connections of flows (this node's own, in the client's
// direction) whose slot the current ring gives to another replica: the ones
// that only a pin or a transition's history can carry to this node. Every
// edge's rings are the same, so the other edges' directors would send them
// elsewhere too.
func (d *Dataplane) OffRing(self netip.Addr, flows []Flow) []Flow {
	var out []Flow
	for _, f := range flows {
		vip, ok := d.st.vipIDs[f.Dst.Unmap()]
		ring := d.st.rings[vip]
		if !ok || len(ring) == 0 {
			continue
		}
		id := ring[FlowHash(f, d.cfg.Seed)%uint32(len(ring))]
		if be, ok := d.st.backends[id]; ok && addrFrom16(be.Addr) != self.Unmap() {
			out = append(out, f)
		}
	}
	return out
}

// PinHeld makes each connection another edge reports holding (OffRing there)
// a director's pin here, so that this node, directing it now or later, sends
// its packets to its holder whatever the rings say: after its transition has
// ended, and on a director that never saw it. A pin already there is kept as
// it is; a connection whose VIP or holder this node does not know is skipped.
// It returns how many pins it wrote. Every CPU's flow cache is retired when it
// wrote one (a cached answer would hide the pin).
func (d *Dataplane) PinHeld(held []Held) (int, error) {
	// xdp_lb's clock is the coarse one (bpf_ktime_get_coarse_ns), up to a
	// tick behind CLOCK_MONOTONIC: a pin clock ahead of it would read as
	// lapsed.
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts)
	now := uint64(ts.Nano())
	wrote := 0
	for _, h := range held {
		vip, ok := d.st.vipIDs[h.Flow.Dst.Unmap()]
		if !ok || h.Flow.Protocol != unix.IPPROTO_TCP {
			continue
		}
		id, ok := d.st.backendIDs[backendKey{vip: vip, addr: h.Holder.Unmap()}]
		if !ok {
			continue
		}
		k := h.Flow.key()
		var v lbFlowVal
		if err := d.objs.Flows.Lookup(&k, &v); err == nil && v.BackendId == id && v.Hop == 0 {
			continue
		}
		v = lbFlowVal{BackendId: id, LastSeenNs: now}
		if err := d.objs.Flows.Put(&k, &v); err != nil {
			return wrote, fmt.Errorf("update map flows: %w", err)
		}
		wrote++
	}
	if wrote == 0 {
		return 0, nil
	}
	if err := d.objs.PinClock.Put(uint32(0), now); err != nil {
		return wrote, fmt.Errorf("update map pin_clock: %w", err)
	}
	d.cfg.Generation++
	return wrote, d.writeConfig()
}
