/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Where a new flow goes: the VIP of its destination, the slot of its hash in
 * the VIP's Maglev ring (current or previous, during a transition), the clocks
 * that say whether a transition or the pins are live, and the replica a slot
 * names.
 */
#ifndef PORTICO_RING_H
#define PORTICO_RING_H

/* lookup_vip finds the VIP of a flow's destination (address, port or any port,
 * protocol): 1 and its id; 2 for a VIP address whose port is served by nothing
 * (VIP_F_CLOSED); or 0. The answer is memoized per CPU. */
static __always_inline int lookup_vip(const struct flow_key *flow, const struct lb_config *cfg, __u32 *vip_id)
{
	struct vip_key vk = {};
	struct vip_memo *m;
	struct vip_val *v;
	const __u32 *a, *b;
	__u32 slot, found;

	__builtin_memcpy(vk.addr, flow->dst, sizeof(vk.addr));
	vk.port = flow->dport;
	vk.proto = flow->proto;
	a = (const __u32 *)&vk;
	slot = ((a[3] ^ a[4]) * 0x9e3779b1) >> (32 - 6);
	m = bpf_map_lookup_elem(&vip_memos, &slot);
	if (m && m->generation == cfg->generation) {
		b = (const __u32 *)&m->key;
		if (a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3] && a[4] == b[4]) {
			*vip_id = m->vip_id;
			return m->found;
		}
	}
	v = bpf_map_lookup_elem(&vips, &vk);
	if (!v) {
		vk.port = 0;
		v = bpf_map_lookup_elem(&vips, &vk);
		vk.port = flow->dport;
	}
	found = v ? (v->flags & VIP_F_CLOSED ? 2 : 1) : 0;
	if (m) {
		__builtin_memcpy(&m->key, &vk, sizeof(vk));
		m->generation = cfg->generation;
		m->found = found;
		m->vip_id = v ? v->vip_id : 0;
	}
	if (v)
		*vip_id = v->vip_id;
	return found;
}

/* ring_slot returns the slot a ring map (rings, prev_rings, mid_rings) holds at
 * key for this hash: a backend id, with LB_SLOT_MOVED in the current ring where
 * the transition's rings differ; 0 if none. */
static __always_inline __u32 ring_slot(void *outer, __u32 key, __u32 hash, const struct lb_config *cfg)
{
	void *ring = bpf_map_lookup_elem(outer, &key);
	__u16 *ids;
	__u32 slot, idx;

	if (!ring || cfg->ring_size == 0)
		return 0;
	slot = hash % cfg->ring_size;
	idx = slot / LB_RING_CHUNK;
	ids = bpf_map_lookup_elem(ring, &idx);
	return ids ? ids[slot % LB_RING_CHUNK] : 0;
}

/* pick_from_ring returns the backend id a ring map holds for this hash, 0 if none. */
static __always_inline __u32 pick_from_ring(void *outer, __u32 key, __u32 hash, const struct lb_config *cfg)
{
	return ring_slot(outer, key, hash, cfg) & ~(__u32)LB_SLOT_MOVED;
}

/* clock reads bpf_ktime_get_coarse_ns() once per packet, and only for a packet
 * that needs it: in the steady state (no transition, no pins) none does. */
static __always_inline __u64 clock(__u64 *now)
{
	if (!*now)
		*now = bpf_ktime_get_coarse_ns();
	return *now;
}

/* prev_live reports whether the VIP's previous ring still counts. Go clears
 * the lease of an ended transition, so the clock is read only within one (or
 * until the next Apply after it). */
static __always_inline int prev_live(__u32 vip_id, __u64 *now)
{
	struct ring_meta *m = bpf_map_lookup_elem(&rings_meta, &vip_id);

	return m && m->prev_until_ns && clock(now) < m->prev_until_ns;
}

/* live reports whether a pin clock (pin_clock: directors' pins; relay_clock:
 * hand-off pins) was touched within LB_PIN_IDLE_SEC. Until then flows is not
 * looked at for what that clock guards. */
static __always_inline int live(void *clock_map, __u64 *now)
{
	__u32 zero = 0;
	__u64 *t = bpf_map_lookup_elem(clock_map, &zero);

	return t && *t && clock(now) - *t < (__u64)LB_PIN_IDLE_SEC * NSEC_PER_SEC;
}

static __always_inline int pins_live(__u64 *now) { return live(&pin_clock, now); }
static __always_inline int held_live(__u64 *now) { return live(&held_clock, now); }

/* seen moves a pin clock to now, at most once a second (a shared cache line). */
static __always_inline void seen(void *clock_map, __u64 now)
{
	__u32 zero = 0;
	__u64 *t = bpf_map_lookup_elem(clock_map, &zero);

	if (t && now - *t > NSEC_PER_SEC)
		*t = now;
}

static __always_inline void pin_seen(__u64 now) { seen(&pin_clock, now); }

/* pin_used: a pin was used. It keeps the pin clock going, but not while held
 * connections' pins are live (held_clock): those would keep it going for good. */
static __always_inline void pin_used(__u64 now)
{
	if (!held_live(&now))
		pin_seen(now);
}

static __always_inline struct backend *active_backend(__u32 id)
{
	struct backend *be = bpf_map_lookup_elem(&backends, &id);

	return be && (be->flags & BACKEND_F_ACTIVE) ? be : 0;
}

#endif /* PORTICO_RING_H */
