package dataplane

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cilium/ebpf"
)

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
// freed) and forgets a pin clock once no pin was used for LB_PIN_IDLE_SEC. The
// program already ignores both then; cleared, they cost it no clock read. Apply
// calls it, and an agent calls it now and then between Applies.
func (d *Dataplane) Expire() error {
	now := monotonicNow()
	ended := false
	for vip, until := range d.st.prevUntil {
		if until <= now {
			if err := d.endTransition(vip); err != nil {
				return err
			}
			ended = true
		}
	}
	if ended {
		// What the CPUs cached in the transition (a walk's mark, a
		// replica its chain found) was its answer, not the rings' now.
		d.cfg.Generation++
		if err := d.writeConfig(); err != nil {
			return err
		}
	}
	idle := time.Duration(lbLbLimitsLB_PIN_IDLE_SEC) * time.Second
	for _, m := range []*ebpf.Map{d.objs.PinClock, d.objs.RelayClock, d.objs.HeldClock} {
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
