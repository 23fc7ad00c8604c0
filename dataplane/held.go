package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
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
// elsewhere too. With all, it returns every connection to a VIP with a ring
// instead: while the edges' liveness verdicts differ their rings do, and one
// on this node's ring may be off another's.
func (d *Dataplane) OffRing(self netip.Addr, flows []Flow, all bool) []Flow {
	var out []Flow
	for _, f := range flows {
		vip, ok := d.st.vipIDs[f.Dst.Unmap()]
		ring := d.st.rings[vip]
		if !ok || len(ring) == 0 {
			continue
		}
		id := ring[FlowHash(f, d.cfg.Seed)%uint32(len(ring))]
		if be, ok := d.st.backends[id]; all || ok && addrFrom16(be.Addr) != self.Unmap() {
			out = append(out, f)
		}
	}
	return out
}

// OwnUDP returns the UDP flows this node's stack served (xdp_lb's udp_seen),
// in the client's direction, that lived at least lived (their first and last
// datagrams that far apart: a DNS query's one or two do not) and sent one
// within idle. UDP leaves no socket per flow (nginx's listeners are
// unconnected), so these stand for its connections in the holder's report.
func (d *Dataplane) OwnUDP(lived, idle time.Duration) ([]Flow, error) {
	now := uint64(coarseNow())
	var (
		k   lbFlowKey
		v   lbUdpSeenVal
		out []Flow
	)
	it := d.objs.UdpSeen.Iterate()
	for it.Next(&k, &v) {
		if v.LastNs < v.FirstNs || v.LastNs-v.FirstNs < uint64(lived) || now > v.LastNs && now-v.LastNs > uint64(idle) {
			continue
		}
		out = append(out, flowFromKey(k))
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read map udp_seen: %w", err)
	}
	return out, nil
}

// PinHeld makes each connection another edge reports holding (OffRing there)
// a director's pin here, so that this node, directing it now or later, sends
// its packets to its holder whatever the rings say: after its transition has
// ended, and on a director that never saw it. A pin already there is kept as
// it is; a connection whose VIP or holder this node does not know is skipped.
// It returns how many pins it wrote. Every CPU's flow cache is retired when it
// wrote one (a cached answer would hide the pin).
//
// xdp_lb looks at these pins while PinHeld wrote or kept one within
// LB_PIN_IDLE_SEC (held_clock, not the directors' pin_clock: a SYN does not
// look at flows for them, bpf/README.md). A held connection may be silent for
// longer (an L4 Service's, for days), so while any report names one PinHeld
// keeps the clock, and the pins it names, from lapsing (pinRefresh).
func (d *Dataplane) PinHeld(held []Held) (int, error) {
	now := uint64(coarseNow())
	wrote, known := 0, 0
	for _, h := range held {
		id, ok := d.heldID(h)
		if !ok {
			continue
		}
		known++
		k := h.Flow.key()
		var v lbFlowVal
		if err := d.objs.Flows.Lookup(&k, &v); err == nil && v.BackendId == id && v.Hop == 0 &&
			now-v.LastSeenNs < uint64(pinRefresh) {
			continue
		}
		v = lbFlowVal{BackendId: id, LastSeenNs: now}
		if err := d.objs.Flows.Put(&k, &v); err != nil {
			return wrote, fmt.Errorf("update map flows: %w", err)
		}
		wrote++
	}
	if known == 0 {
		return 0, nil
	}
	var clock uint64
	if err := d.objs.HeldClock.Lookup(uint32(0), &clock); err != nil {
		return wrote, fmt.Errorf("read map held_clock: %w", err)
	}
	if wrote > 0 || now-clock >= uint64(pinRefresh) {
		if err := d.objs.HeldClock.Put(uint32(0), now); err != nil {
			return wrote, fmt.Errorf("update map held_clock: %w", err)
		}
	}
	if wrote == 0 {
		return 0, nil
	}
	d.cfg.Generation++
	return wrote, d.writeConfig()
}

// pinRefresh is how old a held connection's pin, or the pin clock, may be
// before PinHeld writes it again: well inside LB_PIN_IDLE_SEC (an hour), so
// neither lapses while its holder reports it, and rare enough that a report
// repeated every few seconds writes nothing.
const pinRefresh = 10 * time.Minute

// FlowEntries is the size of the flows table, which the transitions' pins and
// PinHeld's share.
func (d *Dataplane) FlowEntries() int { return int(d.objs.Flows.MaxEntries()) }

// UnpinHeld removes the pins PinHeld made for connections their holder no
// longer reports (they ended, or the ring gives their slot back to it): each
// pin of held that still names its holder as a director's pin (hop 0). A pin
// that names another replica is left alone. It returns how many it removed;
// every CPU's flow cache is retired when it removed one.
func (d *Dataplane) UnpinHeld(held []Held) (int, error) {
	removed := 0
	for _, h := range held {
		id, ok := d.heldID(h)
		if !ok {
			continue
		}
		k := h.Flow.key()
		var v lbFlowVal
		if err := d.objs.Flows.Lookup(&k, &v); err != nil || v.BackendId != id || v.Hop != 0 {
			continue
		}
		if err := d.objs.Flows.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return removed, fmt.Errorf("delete from map flows: %w", err)
		}
		removed++
	}
	if removed == 0 {
		return 0, nil
	}
	d.cfg.Generation++
	return removed, d.writeConfig()
}

// heldID is the backend id of a held connection's holder on its VIP, if this
// node knows both and the connection is TCP.
func (d *Dataplane) heldID(h Held) (uint32, bool) {
	vip, ok := d.st.vipIDs[h.Flow.Dst.Unmap()]
	if !ok || h.Flow.Protocol != unix.IPPROTO_TCP && h.Flow.Protocol != unix.IPPROTO_UDP {
		return 0, false
	}
	id, ok := d.st.backendIDs[backendKey{vip: vip, addr: h.Holder.Unmap()}]
	return id, ok
}
