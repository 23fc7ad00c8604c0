// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * xdp_lb: Portico's L4 steering on an edge node's NIC.
 *
 * VIP traffic goes to one ingress replica chosen by the flow table (established
 * flows) or the VIP's Maglev ring (new flows): a replica on this node gets
 * XDP_PASS, a replica elsewhere gets the frame with only its two MAC addresses
 * rewritten, sent back out with XDP_TX (L2 direct server return). Everything that
 * is not VIP traffic passes untouched. The program never returns XDP_ABORTED; it
 * drops only a handed-on packet of a connection no replica of its chain has,
 * within LB_SETTLE_MS of a ring change (TCP sends it again).
 *
 * Policy for the awkward cases (each counted in reason_stats):
 *  - IPv4 fragments and IPv6 fragment headers: XDP_PASS to the local stack (a
 *    non-first fragment has no ports to steer by). Edge paths use PMTU discovery,
 *    which ICMP steering below keeps working, so fragments are rare.
 *  - IPv4 options: steered like any other packet (the header is not modified).
 *  - IPv6 extension headers before TCP/UDP: XDP_PASS.
 *  - A VIP whose ring is empty or missing: XDP_PASS (the local stack answers).
 *  - A frame not addressed to this NIC's MAC (a switch flooding unknown
 *    unicast, e.g. after the previous VIP owner's link failed): XDP_PASS, so
 *    only one edge node ever steers a given frame.
 *
 * Established flows are looked up first in a per-CPU direct-mapped cache
 * (flow_cache) that is valid for one generation of the maps, so the common case
 * costs no hash-map lookup; flows stays the table every CPU (and a new VIP owner's
 * ring) agrees with.
 */
#include <linux/bpf.h>
#include "bpf_helpers.h"
#include "bpf_endian.h"
#include "lb_types.h"
#include "lb_maps.h"
#include "parse.h"
#include "hash.h"
#include "encap.h"

#define NSEC_PER_SEC 1000000000ULL

/* Set at load by the data-plane model test only (dataplane's Options.sockModel):
 * has_connection then reads the sock_model map, a model of the node's sockets,
 * so several simulated nodes share one kernel. The agent never sets it, and the
 * verifier drops the branch. */
volatile const __u32 lb_sock_model = 0;

/* Keep the enums Go needs in BTF for bpf2go. */
const enum lb_limits *unused_limits __attribute__((unused));
const enum backend_flags *unused_backend_flags __attribute__((unused));
const enum vip_flags *unused_vip_flags __attribute__((unused));
const enum cache_pin *unused_cache_pin __attribute__((unused));

static __always_inline int count(enum reason r, int verdict)
{
	__u32 key = r;
	__u64 *c = bpf_map_lookup_elem(&reason_stats, &key);

	if (c)
		*c += 1;
	return verdict;
}

static __always_inline int mac_eq(const __u8 *a, const __u8 *b)
{
	return *(const __u32 *)a == *(const __u32 *)b && *(const __u16 *)(a + 4) == *(const __u16 *)(b + 4);
}

/* from_peer reports whether a frame comes from another edge: a director that
 * already chose this node. The answer for a MAC is memoized per CPU. */
static __always_inline int from_peer(const struct ethhdr *eth, const struct lb_config *cfg)
{
	__u32 slot = (eth->h_source[5] ^ eth->h_source[3]) & (LB_MAC_MEMO - 1);
	struct mac_verdict *mv = bpf_map_lookup_elem(&src_macs, &slot);
	struct peer_key pk = {};
	int peer;

	if (mv && mv->generation == cfg->generation && mac_eq(mv->mac, eth->h_source))
		return mv->peer;
	__builtin_memcpy(pk.mac, eth->h_source, ETH_ALEN);
	peer = bpf_map_lookup_elem(&peers, &pk) != 0;
	if (mv) {
		__builtin_memcpy(mv->mac, eth->h_source, ETH_ALEN);
		mv->peer = peer;
		mv->generation = cfg->generation;
	}
	return peer;
}

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

/* seen moves a pin clock to now, at most once a second (a shared cache line). */
static __always_inline void seen(void *clock_map, __u64 now)
{
	__u32 zero = 0;
	__u64 *t = bpf_map_lookup_elem(clock_map, &zero);

	if (t && now - *t > NSEC_PER_SEC)
		*t = now;
}

static __always_inline void pin_seen(__u64 now) { seen(&pin_clock, now); }

static __always_inline struct backend *active_backend(__u32 id)
{
	struct backend *be = bpf_map_lookup_elem(&backends, &id);

	return be && (be->flags & BACKEND_F_ACTIVE) ? be : 0;
}

/* kept reports whether a flow that names backend be stays with it. A replica the
 * liveness checks call down keeps its TCP connections (they are lost either way
 * if it is dead, and kept if the check was wrong), but not other flows: without
 * a handshake nothing tells a new UDP flow from an old one, so keeping them would
 * send every new flow of its slots to a dead node for as long as the transition
 * lasts; picked again, a DNS query or a new QUIC connection is answered. */
static __always_inline int kept(const struct backend *be, const struct flow_key *f)
{
	return !(be->flags & BACKEND_F_DOWN) || f->proto == IPPROTO_TCP;
}

static __always_inline int flow_key_eq(const struct flow_key *a, const struct flow_key *b)
{
	const __u64 *x = (const __u64 *)a, *y = (const __u64 *)b;

	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3] && x[4] == y[4];
}

/* touch_flow keeps a cached pinned flow alive in flows (the fast path calls it
 * every 64th packet): it refreshes last_seen (and the LRU's reference bit), or puts
 * the flow back if the LRU evicted it. */
static __always_inline void touch_flow(const struct flow_key *flow, __u32 bid, __u64 now)
{
	struct flow_val *fv = bpf_map_lookup_elem(&flows, flow);

	if (fv) {
		fv->last_seen_ns = now;
	} else {
		struct flow_val nv = { .backend_id = bid, .last_seen_ns = now };

		bpf_map_update_elem(&flows, flow, &nv, BPF_ANY);
	}
	pin_seen(now);
}

#define TCP_FIN 0x01
#define TCP_RST 0x04

/* The kernel's tcp_sock, as far as has_connection reads it (CO-RE: the
 * offsets come from the running kernel's BTF). */
struct tcp_sock {
	__u32 rcv_nxt;
	__u32 snd_una;
	__u32 write_seq;
} __attribute__((preserve_access_index));

/* ACK_STALE bounds how far below snd_una a connection's own ACK may be (an old
 * duplicate): further, or above write_seq, the packet is of another connection.
 * Not snd_nxt: the stack moves it only after a segment is sent, and on a fast
 * path (a veth pair, a client on the same host) the peer's ACK of that segment
 * reaches XDP before (lab: a held connection's first ACK taken for a stranger's
 * and walked to a replica that reset it). write_seq moves when the data is
 * queued, before it is sent; it counts the FIN too. */
#define ACK_STALE (1U << 24)

/* pkt_ack is a TCP packet's acknowledgment number with bit 32 set, or 0 for a
 * packet without ACK (or no TCP header). */
static __always_inline __u64 pkt_ack(const __u8 *th)
{
	if (!th || !(th[13] & 0x10))
		return 0;
	return 1ULL << 32 | ((__u32)th[8] << 24 | (__u32)th[9] << 16 | (__u32)th[10] << 8 | th[11]);
}

/* has_connection reports whether this node's stack has the TCP connection of
 * a packet (established, in its handshake, or closing). A listening socket
 * alone does not count, nor a connection that ended here (TIME_WAIT, CLOSE):
 * a client reuses its port, and the same 5-tuple may be a new connection that
 * another replica holds (a director that took it for its own reset it). */
static __always_inline int has_connection(struct xdp_md *ctx, int v4, const struct flow_key *f, __u64 ack)
{
	struct bpf_sock_tuple t = {};
	struct bpf_sock *sk;
	__u32 size, *modeled;
	int has;

	if (lb_sock_model) {
		modeled = bpf_map_lookup_elem(&sock_model, f);
		return modeled && *modeled == LB_SOCK_LIVE;
	}
	if (v4) {
		t.ipv4.saddr = ((const __u32 *)f->src)[3];
		t.ipv4.daddr = ((const __u32 *)f->dst)[3];
		t.ipv4.sport = f->sport;
		t.ipv4.dport = f->dport;
		size = sizeof(t.ipv4);
	} else {
		__builtin_memcpy(t.ipv6.saddr, f->src, 16);
		__builtin_memcpy(t.ipv6.daddr, f->dst, 16);
		t.ipv6.sport = f->sport;
		t.ipv6.dport = f->dport;
		size = sizeof(t.ipv6);
	}
	sk = bpf_skc_lookup_tcp(ctx, &t, size, BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return 0;
	has = sk->state != BPF_TCP_LISTEN && sk->state != BPF_TCP_TIME_WAIT && sk->state != BPF_TCP_CLOSE;
	/* A socket of an ended connection whose end never reached it (the
	 * client's RST went to another replica while the rings moved) still
	 * names the 5-tuple a client reuses: its new connection lives where its
	 * SYN went, and an ACK this socket never sent for shows it. */
	if (has && ack) {
		struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);

		if (tp) {
			__u32 a = (__u32)ack, una = tp->snd_una, end = tp->write_seq;

			if ((__s32)(a - end) > 0 || (__s32)(una - a) > (__s32)ACK_STALE)
				has = 0;
		}
	}
	bpf_sk_release(sk);
	return has;
}

/* from_site takes out of its tunnel a packet another site's edge sent to this
 * node's tunnel address (to_site there): 1, with the packet now the inner one
 * and p describing it, if the inner packet is VIP traffic; -1, untouched, for
 * VIP traffic from any other source (a stranger would reach the VIPs with a
 * source address of its choosing, past the network's filters); 0, the packet
 * untouched, for anything else (the stack gets it as it came: other tunnels to
 * the node's address, as a CNI's, are none of xdp_lb's business). */
static __always_inline int from_site(struct xdp_md *ctx, struct parsed *p, const struct lb_config *cfg)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct site_peer_key sk;
	__u32 vip_id;
	__be16 proto;

	if (!tunnel_inner(eth, data_end, p, &proto) || lookup_vip(&p->flow, cfg, &vip_id) != 1)
		return 0;
	__builtin_memcpy(sk.addr, &ip->saddr, sizeof(sk.addr));
	if (!bpf_map_lookup_elem(&site_peers, &sk))
		return -1;
	return decap(ctx, eth, proto);
}

/* fill_history fills c->h[2...] with what the VIP's mid rings hold for the hash,
 * newest first (0 where there is none); the caller sets h[0] (the previous ring)
 * and h[1] (the current one). A global function, verified once. */
__attribute__((noinline)) int fill_history(struct chain *c, __u32 vip_id, __u32 hash)
{
	__u32 zero = 0, head, n;
	struct lb_config *cfg = bpf_map_lookup_elem(&lb_cfg, &zero);
	struct ring_meta *m = bpf_map_lookup_elem(&rings_meta, &vip_id);

	if (!c || !cfg || !m || vip_id >= LB_MAX_VIPS)
		return 0;
	head = m->mid_head;
	n = m->mid_count;
	for (int k = 0; k < LB_MID_RINGS; k++) {
		__u32 place = head + k;

		if (place >= LB_MID_RINGS)
			place -= LB_MID_RINGS;
		c->h[2 + k] = (__u32)k < n && place < LB_MID_RINGS ?
			pick_from_ring(&mid_rings, vip_id * LB_MID_RINGS + place, hash, cfg) : 0;
	}
	return 0;
}


/* in_history reports whether the rings of a flow's transition (c->h, filled)
 * name the replica id. A global function, verified once. */
__attribute__((noinline)) int in_history(struct chain *c, __u32 id)
{
	if (!c || !id)
		return 0;
	for (int i = 0; i < LB_CHAIN; i++)
		if (c->h[i] == id)
			return 1;
	return 0;
}

/* build_chain collects c->h into c->id, each replica once, with its class in
 * c->cls. A global function, verified once and not at every place that calls
 * it. It returns c->n. */
__attribute__((noinline)) int build_chain(struct chain *c)
{
	__u32 cls[LB_CHAIN];

	if (!c)
		return 0;
	c->n = 0;
	for (int i = 0; i < LB_CHAIN; i++) {
		struct backend *be = c->h[i] ? active_backend(c->h[i]) : 0;

		cls[i] = LB_CLASSES; /* none */
		if (!be)
			continue;
		cls[i] = (be->flags & BACKEND_F_REMOTE) ? 2 : (be->flags & BACKEND_F_DOWN) ? 1 : 0;
		if (cls[i] == 2 && !c->sites)
			cls[i] = LB_CLASSES;
		for (int j = 0; j < i; j++)
			if (c->h[j] == c->h[i])
				cls[i] = LB_CLASSES;
	}
	for (int i = 0; i < LB_CHAIN; i++) {
		if (cls[i] < LB_CLASSES && c->n < LB_CHAIN) {
			c->id[c->n & (LB_CHAIN - 1)] = c->h[i];
			c->cls[c->n & (LB_CHAIN - 1)] = cls[i];
			c->n++;
		}
	}
	return c->n;
}

/* addr_cmp compares two addresses as numbers: <0, 0, >0. */
static __always_inline int addr_cmp(const __u8 *a, const __u8 *b)
{
	const __u32 *x = (const __u32 *)a, *y = (const __u32 *)b;

#pragma unroll
	for (int i = 0; i < 4; i++) {
		__u32 p = bpf_ntohl(x[i]), q = bpf_ntohl(y[i]);

		if (p != q)
			return p < q ? -1 : 1;
	}
	return 0;
}

/* above reports whether a replica be of class cl lies above where a frame
 * marked after (a class + 1, as its sender saw this node) stands at this node
 * (me) in the order chains are walked: a higher class, or the same class and a
 * higher address (any, for a node that does not know its own). */
static __always_inline int above(__u32 cl, const struct backend *be, __u32 after, const struct self_addr *me)
{
	if (cl != after - 1)
		return cl > after - 1;
	return !me || !me->set || addr_cmp(be->addr, me->addr) > 0;
}

/* is_tagged reports whether be is the replica a frame's tag (+ 1) names, by
 * what this node (me) knows: only where tags tell every replica apart. */
static __always_inline int is_tagged(const struct backend *be, __u32 tag, const struct self_addr *me)
{
	return tag && me && me->tags && addr_tag(be->addr) + 1 == tag;
}

/* from_here reports whether be is the edge that walked a frame here (from: its
 * source MAC; zero for a frame a director steered, or a client's): it asked its
 * own stack already. */
static __always_inline int from_here(const struct backend *be, const __u8 *from)
{
	return (*(const __u32 *)from || *(const __u16 *)(from + 4)) && mac_eq(be->mac, from);
}

/* chain_next is where a node that does not have a flow's connection sends its
 * packet along the built chain, as an index into c->id (-1 if none is left):
 * the replica after this node in the order every chain is walked, (class,
 * address), never this node's own, nor the director's (tag: the frame's tag +
 * 1, 0 for none), nor the edge that walked it here (c->from). after is where this node stands: its class + 1 as the sender
 * saw it (the frame's mark), this node's address (self_addr); 0 (or an earlier
 * version's LB_MARK_PROBE) for the very start. Each hop goes up that order,
 * which is the same on every edge whatever the rings each holds (each applies a
 * change at its own moment, learns a verdict late, restarts and replays, or
 * guessed a history, Options.Arrival): a packet never comes back to an edge,
 * and reaches every replica above it that the edges it passes know. The
 * hand-offs are counted too (LB_MAX_HOPS). A global function. */
__attribute__((noinline)) int chain_next(struct chain *c, __u32 after, __u32 tag)
{
	__u32 zero = 0, bcls = 0;
	struct self_addr *me = bpf_map_lookup_elem(&self_addr, &zero);
	struct backend *be, *best = 0;
	int pick = -1;

	if (!c)
		return -1;
	if (after > LB_CLASSES)
		after = 0;
	for (int j = 0; j < LB_CHAIN; j++) {
		__u32 cl;

		if (j >= c->n)
			break;
		be = active_backend(c->id[j]);
		if (!be || (be->flags & BACKEND_F_LOCAL) || is_tagged(be, tag, me) || from_here(be, c->from))
			continue;
		cl = c->cls[j];
		if (after && !above(cl, be, after, me))
			continue;
		if (best && (cl > bcls || (cl == bcls && addr_cmp(be->addr, best->addr) >= 0)))
			continue;
		best = be;
		bcls = cl;
		pick = j;
	}
	return pick;
}

/* first_held is where a director sends a TCP packet of a flow along its built
 * chain: this node's own replica if its stack has the connection (v4: an IPv4
 * flow), else the first other replica in the order chains are walked, which
 * walks on from there if it does not have it. 0 if the chain names only this
 * node; c->pick is the index of the one picked. A global function, like
 * build_chain. */
__attribute__((noinline)) int first_held(struct xdp_md *ctx, struct chain *c, struct flow_key *f, int v4, __u64 ack)
{
	int j;

	if (!c || !f)
		return 0;
	c->pick = 0;
	for (int i = 0; i < LB_CHAIN; i++) {
		struct backend *be;

		if (i >= c->n)
			break;
		be = active_backend(c->id[i]);
		if (!be || !(be->flags & BACKEND_F_LOCAL))
			continue;
		if (has_connection(ctx, v4, f, ack)) {
			c->pick = i;
			return c->id[i];
		}
	}
	j = chain_next(c, 0, 0);
	if (j < 0)
		return 0;
	c->pick = j;
	return c->id[j & (LB_CHAIN - 1)];
}

/* hand_on sends a frame this node does not serve to be: another site's edge
 * through a tunnel, or another edge of this site marked with mark. */
static __always_inline int hand_on(struct xdp_md *ctx, struct ethhdr *eth, __u8 *th, const struct backend *be,
				   __u32 mark, const struct lb_config *cfg)
{
	int rc;

	if (be->flags & BACKEND_F_REMOTE) {
		rc = to_site(ctx, be, cfg);
		return rc < 0 ? count(REASON_HANDOFF_END, XDP_PASS) : count(REASON_SITE_OUT, rc);
	}
	/* A segment with URG carries no class: the next replica serves it. */
	put_mark(th, can_mark(th) ? mark : LB_MARK_FINAL);
	__builtin_memcpy(eth->h_dest, be->mac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, cfg->mac, ETH_ALEN);
	return count(REASON_HANDOFF, XDP_TX);
}

/* settling reports whether the VIP's rings changed within LB_SETTLE_MS: another
 * edge may not have applied the change yet. */
static __always_inline int settling(__u32 vip_id, __u64 *now)
{
	__u64 *changed = bpf_map_lookup_elem(&ring_changed, &vip_id);

	return changed && (__s64)(clock(now) - *changed) < (__s64)LB_SETTLE_MS * 1000000;
}

/* stale_pin says whether a director's pin of a TCP flow to be outlived its
 * connection, by what this node's own stack says: PIN_ENDED for a pin to this
 * node's replica whose stack has no connection of the 5-tuple, PIN_HERE for a
 * pin to another replica while this node's stack has one (served here: the
 * connection lives here, wherever the rings placed it), PIN_HOLDS otherwise. A
 * client reuses the port of a connection that ended, and the ring places the
 * new one where it places it; a director that pinned the old one never saw it
 * end (another director did). It costs a socket lookup per packet of a pinned
 * flow, and pins exist only around ring changes. */
enum { PIN_HOLDS, PIN_ENDED, PIN_HERE };

static __always_inline int stale_pin(struct xdp_md *ctx, const struct ethhdr *eth, const struct parsed *p,
				     const struct backend *be)
{
	if (p->flow.proto != IPPROTO_TCP || p->syn || p->icmp_error || (be->flags & BACKEND_F_REMOTE))
		return PIN_HOLDS;
	int local = (be->flags & BACKEND_F_LOCAL) != 0, has;

	has = has_connection(ctx, eth->h_proto == bpf_htons(ETH_P_IP), &p->flow,
			     pkt_ack(tcp_hdr((void *)eth, (void *)(long)ctx->data_end, p)));
	if (local == has)
		return PIN_HOLDS;
	return local ? PIN_ENDED : PIN_HERE;
}

/* serve_here passes a frame to this node's stack, without the mark bits a
 * client may have set (reserved bits, which a stack ignores). */
static __always_inline int serve_here(void *data, void *data_end, const struct parsed *p)
{
	__u8 *th = tcp_hdr(data, data_end, p);

	if (th && marked(th))
		put_mark(th, 0);
	return count(REASON_LOCAL, XDP_PASS);
}

/* onwards reports whether a hand-off pin to be (its class + 1: hop) lies above
 * where a frame marked after (this node's class + 1 as its sender saw it; 0: a
 * frame steered by a ring, not walked) stands in the order chains are walked,
 * and names neither the frame's director (tag) nor the edge that walked it here
 * (from, 0 for a frame not walked): only then may the frame follow the pin, so
 * that it never comes back. */
static __always_inline int onwards(__u32 hop, const struct backend *be, __u32 after, __u32 tag, const __u8 *from)
{
	__u32 zero = 0;
	struct self_addr *me = bpf_map_lookup_elem(&self_addr, &zero);

	if (is_tagged(be, tag, me) || (from && mac_eq(be->mac, from)))
		return 0;
	if (!after || after > LB_CLASSES)
		return 1;
	return above(hop - 1, be, after, me) && (hop != after || (me && me->set));
}

/* from_director handles a frame another edge sent here: a director that chose
 * this node, or an edge handing on a packet it did not have (marked). This node
 * serves it, unless it is a packet of a TCP connection its stack does not have.
 * Such a packet goes on along the flow's chain (chain_next): to where this node
 * sent the flow before once the transition is over (a hand-off pin), or, in a
 * transition, to the next replica of the chain, marked with that replica's class
 * and one hand-off more; at LB_MAX_HOPS it goes no further. What no replica of
 * its chain has is dropped within LB_SETTLE_MS of a change (another edge may not
 * have applied it; TCP sends the packet again), and served after that (the stack
 * resets it). */
static __always_inline int from_director(struct xdp_md *ctx, struct ethhdr *eth, void *data_end,
					 const struct parsed *p, const struct lb_config *cfg, int stranger)
{
	__u32 vip_id, hash, m = 0, zero = 0, hops, tag;
	__u8 *th = tcp_hdr(eth, data_end, p);
	struct chain *ch;
	struct backend *be;
	struct flow_val *fv;
	__u64 now = 0;
	int relays, j;

	if (th && (m = get_mark(th)))
		put_mark(th, 0);
	if (m == LB_MARK_FINAL)
		return count(REASON_HANDOFF_IN, XDP_PASS);
	hops = mark_hops(m);
	/* A mark from no peer edge: a new peer's, which this node has not
	 * learned yet, or reserved bits a stranger set. Either way it buys one
	 * hand-off at most: a spoofed frame is sent on once, never walked along
	 * a chain (and a new peer's frame is rarely walked further). */
	if (stranger && m != LB_MARK_FINAL && hops < LB_MAX_HOPS - 1) {
		hops = LB_MAX_HOPS - 1;
		count(REASON_STRANGER_MARK, 0);
	}
	tag = get_tag(eth, data_end, m);
	if (!th || lookup_vip(&p->flow, cfg, &vip_id) != 1)
		return count(REASON_FROM_PEER, XDP_PASS);
	/* A director sends a frame by its pin without its tag (a tag there made
	 * another site's spill misroute: bpf/README.md); its sender is that
	 * director, so a walk on from here carries the sender's tag, and no edge
	 * along it sends the frame back to the director, which would send it on
	 * a second time. */
	if (!tag && (m & 0xff) == LB_MARK_PINNED)
		tag = sender_tag(eth, &m);
	relays = live(&relay_clock, &now);
	if (p->syn) {
		/* A new connection is served here; an old pin of its 5-tuple goes. */
		if (relays)
			bpf_map_delete_elem(&flows, &p->flow);
		return count(REASON_FROM_PEER, XDP_PASS);
	}
	/* A director's pin names a replica called down, and this node is the
	 * ring's: it serves what its stack has (a client reused the port of a
	 * connection that ended on the pinned replica, maybe dead now), and hands
	 * the rest to the pinned replica, by its tag, to be served there (one
	 * called down wrongly keeps its connections). */
	if ((m & 0xff) == LB_MARK_DOWNPIN) {
		__u32 key = tag - 1;
		struct tag_mac *tm;

		if (has_connection(ctx, eth->h_proto == bpf_htons(ETH_P_IP), &p->flow, pkt_ack(th)))
			return count(REASON_HANDOFF_IN, XDP_PASS);
		tm = tag ? bpf_map_lookup_elem(&tag_macs, &key) : 0;
		if (!tm || mac_eq(tm->mac, cfg->mac))
			return count(REASON_HANDOFF_END, XDP_PASS);
		put_mark(th, LB_MARK_FINAL);
		__builtin_memcpy(eth->h_dest, tm->mac, ETH_ALEN);
		__builtin_memcpy(eth->h_source, cfg->mac, ETH_ALEN);
		return count(REASON_HANDOFF, XDP_TX);
	}
	if (!prev_live(vip_id, &now)) {
		/* Once the transition is over, what this node sent on keeps
		 * going there (a SYN of its 5-tuple took the pin away, so the
		 * stack is not asked); only onwards (a pin's mark above the
		 * frame's). Nothing else costs more than the flag checks. */
		if (relays && hops < LB_MAX_HOPS && (fv = bpf_map_lookup_elem(&flows, &p->flow)) &&
		    fv->hop >= 1 && fv->hop <= LB_CLASSES && (be = active_backend(fv->backend_id)) &&
		    !(be->flags & BACKEND_F_LOCAL) && onwards(fv->hop, be, m & 0xff, tag, m ? eth->h_source : 0)) {
			if (now - fv->last_seen_ns > NSEC_PER_SEC) {
				fv->last_seen_ns = now;
				seen(&relay_clock, now);
			}
			if (tag)
				put_tag(eth, data_end, tag - 1);
			return hand_on(ctx, eth, th, be, (m & LB_MARK_TAG) | (hops + 1) << 8 | fv->hop, cfg);
		}
		/* A frame a director steered here by a pin, of a connection this
		 * node does not have: the pin is stale (the connection ended here,
		 * and the client reused its port for a new one, which the ring
		 * placed), so the current ring's replica gets it, to be served there
		 * (one hop, never on). */
		if ((m & 0xff) == LB_MARK_PINNED && !has_connection(ctx, eth->h_proto == bpf_htons(ETH_P_IP), &p->flow, pkt_ack(th))) {
			__u32 rid = pick_from_ring(&rings, vip_id, flow_hash(&p->flow, cfg->seed), cfg);

			be = rid ? active_backend(rid) : 0;
			if (be && !(be->flags & (BACKEND_F_LOCAL | BACKEND_F_REMOTE)))
				return hand_on(ctx, eth, th, be, LB_MARK_FINAL, cfg);
		}
		/* A frame another edge walked along a chain this node's rings do
		 * not give (it has not applied the change yet, or its transition
		 * ended first): served if the stack has it; else, right after a
		 * change, dropped, to be sent again once the rings agree. */
		if (m && settling(vip_id, &now) && !has_connection(ctx, eth->h_proto == bpf_htons(ETH_P_IP), &p->flow, pkt_ack(th)))
			return count(REASON_HANDOFF_WAIT, XDP_DROP);
		return count(m ? REASON_HANDOFF_IN : REASON_FROM_PEER, XDP_PASS);
	}
	if (has_connection(ctx, eth->h_proto == bpf_htons(ETH_P_IP), &p->flow, pkt_ack(th)))
		return count(m ? REASON_HANDOFF_IN : REASON_FROM_PEER, XDP_PASS);
	/* In the transition, along the chain its rings give now (a pin made
	 * under other rings may name a replica they no longer give). */
	ch = bpf_map_lookup_elem(&chains, &zero);
	if (!ch)
		return count(REASON_FROM_PEER, XDP_PASS);
	hash = flow_hash(&p->flow, cfg->seed);
	ch->h[0] = pick_from_ring(&prev_rings, vip_id, hash, cfg);
	ch->h[1] = pick_from_ring(&rings, vip_id, hash, cfg);
	ch->sites = 1;
	/* An edge that walked the frame here asked its own stack; a director
	 * that steered it unmarked did not, and may have it. */
	if (m)
		__builtin_memcpy(ch->from, eth->h_source, ETH_ALEN);
	else
		__builtin_memset(ch->from, 0, sizeof(ch->from));
	fill_history(ch, vip_id, hash);
	build_chain(ch);
	j = hops < LB_MAX_HOPS ? chain_next(ch, m & 0xff, tag) : -1;
	if (j >= 0) {
		__u32 k = (__u32)j & (LB_CHAIN - 1), id = ch->id[k], cls = ch->cls[k] + 1;
		struct flow_val nv = { .backend_id = id, .hop = cls, .last_seen_ns = clock(&now) };

		if ((be = active_backend(id))) {
			bpf_map_update_elem(&flows, &p->flow, &nv, BPF_ANY);
			seen(&relay_clock, now);
			if (tag)
				put_tag(eth, data_end, tag - 1);
			return hand_on(ctx, eth, th, be, (m & LB_MARK_TAG) | (hops + 1) << 8 | cls, cfg);
		}
	}
	/* No later replica: the connection is nowhere this node can see. Right
	 * after a change that may be because another edge's rings are not yet
	 * this node's (a retransmission finds them settled); later it is gone. */
	if (settling(vip_id, &now))
		return count(REASON_HANDOFF_WAIT, XDP_DROP);
	return count(m ? REASON_HANDOFF_END : REASON_FROM_PEER, XDP_PASS);
}

SEC("xdp")
int xdp_lb(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct parsed p __attribute__((aligned(8))) = {};
	__u32 zero = 0, bid = 0, pbid, cur, vip_id, hash, slot;
	struct chain *ch = 0;
	__u32 pin = CACHE_UNPINNED, write = CACHE_UNPINNED;
	struct flow_cache_entry *ce;
	struct lb_config *cfg;
	struct backend *be = 0;
	struct flow_val *fv = 0;
	struct vip_counters *vs;
	struct backend_counters *bs;
	__u64 now = 0, len = data_end - data;
	int rc, pins, mv = 0, guess = 0, tunneled = 0, sp = PIN_HOLDS;
	__u32 fmark = 0, ftag = 0;
	__u8 *th;

	if ((void *)(eth + 1) > data_end)
		return count(REASON_MALFORMED, XDP_PASS);
	if (eth->h_proto == bpf_htons(ETH_P_IP))
		rc = parse_ipv4(eth + 1, data_end, &p);
	else if (eth->h_proto == bpf_htons(ETH_P_IPV6))
		rc = parse_ipv6(eth + 1, data_end, &p);
	else
		return count(REASON_NOT_IP, XDP_PASS);
	cfg = bpf_map_lookup_elem(&lb_cfg, &zero);
	if (!cfg)
		return count(REASON_NO_BACKEND, XDP_PASS);
	if (rc != PARSE_OK) {
		/* Another site's edge sent here, in a tunnel, a packet of a connection
		 * this site holds: steered here as if it came from a router, but
		 * never sent on to another site (one hop at most). */
		int site = rc == REASON_NOT_VIP && mac_eq(eth->h_dest, cfg->mac) ? from_site(ctx, &p, cfg) : 0;

		if (site < 0)
			return count(REASON_SITE_STRANGER, XDP_DROP);
		if (!site)
			return count(rc, XDP_PASS);
		data = (void *)(long)ctx->data;
		data_end = (void *)(long)ctx->data_end;
		eth = data;
		if ((void *)(eth + 1) > data_end)
			return count(REASON_MALFORMED, XDP_PASS);
		len = data_end - data;
		tunneled = 1;
		count(REASON_SITE_IN, 0);
	} else {
		/* Only frames sent to this NIC are steered. A switch floods frames for
		 * a MAC it no longer knows (the old VIP owner's, after its link
		 * failed): if every edge steered its copy, backends would see each
		 * packet twice. */
		if (!mac_eq(eth->h_dest, cfg->mac))
			return count(REASON_OTHER_HOST, XDP_PASS);
		/* Another edge steered it here, or handed it on (marked: an edge
		 * that does not know the sender as a peer yet, its changes applied
		 * a moment later than the others', must not steer it again):
		 * never steered again, but along its chain. A SYN is a client's
		 * (edges mark no SYN): it follows the ring. */
		if (from_peer(eth, cfg))
			return from_director(ctx, eth, data_end, &p, cfg, 0);
		th = tcp_hdr(data, data_end, &p);
		if (th && !p.syn && marked(th))
			return from_director(ctx, eth, data_end, &p, cfg, 1);
	}
	/* Fast path: this CPU saw the flow since the maps last changed. A SYN opens
	 * a new connection: it always follows the ring, never an old entry of the
	 * same 5-tuple (a reused port), so every director agrees where it goes; it
	 * does not even read the cache (a random, likely cold, line) unless an old
	 * entry could answer otherwise (see below). */
	slot = cache_slot(&p.flow);
	ce = p.syn ? 0 : bpf_map_lookup_elem(&flow_cache, &slot);
	/* A pinned entry counts only while pins do: a SYN that reuses its 5-tuple
	 * after they lapsed did not retire it. */
	if (ce && ce->generation == cfg->generation && flow_key_eq(&ce->key, &p.flow) &&
	    (ce->pin == CACHE_UNPINNED || pins_live(&now))) {
		bid = ce->backend_id;
		be = active_backend(bid);
		/* A pin holds while its connection does (stale_pin). */
		if (be && ce->pin == CACHE_PINNED && (sp = stale_pin(ctx, eth, &p, be))) {
			if (sp == PIN_HERE)
				return serve_here(data, data_end, &p);
			be = 0;
		}
		if (be) {
			vip_id = ce->vip_id;
			fmark = ce->mark;
			vs = bpf_map_lookup_elem(&vip_stats, &vip_id);
			if (vs) {
				vs->packets++;
				vs->bytes += len;
				vs->flow_hits++;
			}
			/* Keep a pinned flow's entry fresh every 64 packets; the
			 * client's FIN or RST ends it (see the slow path). */
			if (ce->pin == CACHE_PINNED) {
				th = tcp_hdr(data, data_end, &p);
				if (th && (th[13] & (TCP_FIN | TCP_RST))) {
					bpf_map_delete_elem(&flows, &p.flow);
					ce->generation = 0; /* and this entry */
				} else if ((++ce->hits & 63) == 0)
					touch_flow(&p.flow, bid, clock(&now));
			}
			goto forward;
		}
	}

	switch (lookup_vip(&p.flow, cfg, &vip_id)) {
	case 1:
		break;
	case 2:
		/* No listener of the node answers on a VIP: only what a Service
		 * or the group serves (an ICMP error about such a flow passes). */
		if (!p.icmp_error)
			return count(REASON_VIP_CLOSED, XDP_DROP);
		return count(REASON_ICMP_OTHER, XDP_PASS);
	default:
		return count(p.icmp_error ? REASON_ICMP_OTHER : REASON_NOT_VIP, XDP_PASS);
	}
	vs = bpf_map_lookup_elem(&vip_stats, &vip_id);
	if (vs) {
		vs->packets++;
		vs->bytes += len;
	}

	/* The rings' answer: the current ring, and the others of a transition while
	 * it lasts. Every director holds the same rings, so where they agree no
	 * state is needed, and where they differ every director makes the same
	 * choice. */
	hash = flow_hash(&p.flow, cfg->seed);
	bid = ring_slot(&rings, vip_id, hash, cfg);
	mv = (bid & LB_SLOT_MOVED) && prev_live(vip_id, &now);
	bid &= ~(__u32)LB_SLOT_MOVED;
	cur = bid;
	pbid = bid;
	/* Only a packet of a flow in a slot the transition moved reads its other
	 * rings; a SYN needs no more than the flag (it follows the current ring). */
	if (mv && !p.syn) {
		ch = bpf_map_lookup_elem(&chains, &zero);
		if (ch) {
			pbid = pick_from_ring(&prev_rings, vip_id, hash, cfg);
			ch->h[0] = pbid;
			ch->h[1] = bid;
			fill_history(ch, vip_id, hash);
		}
		mv = ch != 0;
	}
	pins = pins_live(&now);
	if (p.syn) {
		/* A new connection follows the current ring. Where the transition moved
		 * its slot it is remembered, or its next packets would be taken for an
		 * older flow's. An old pin of a reused 5-tuple is dropped, with this
		 * CPU's cache entry of it: only a pin makes an entry differ from the
		 * rings, so without pins neither is looked at. */
		if (pins) {
			bpf_map_delete_elem(&flows, &p.flow);
			ce = bpf_map_lookup_elem(&flow_cache, &slot);
			if (ce && ce->generation == cfg->generation && flow_key_eq(&ce->key, &p.flow))
				ce->generation = 0;
		}
		if (mv)
			write = CACHE_NEW; /* a SYN is never cached: pin stays unused */
	} else {
		/* A packet of a flow: remembered as new in the transition, pinned, or
		 * found along its chain (older than a change), or the current ring's. */
		fv = mv ? bpf_map_lookup_elem(&new_pins, &p.flow) : 0;
		if (fv && active_backend(fv->backend_id)) {
			/* Its first packet after the SYN (the handshake's ACK): a real
			 * connection, pinned for good. A spoofed SYN never gets here, so a
			 * flood that churns new_pins evicts only connections still in their
			 * handshake. */
			bid = fv->backend_id;
			pin = CACHE_PINNED;
			write = CACHE_PINNED;
			bpf_map_delete_elem(&new_pins, &p.flow);
			fv = 0;
		} else if ((fv = pins ? bpf_map_lookup_elem(&flows, &p.flow) : 0) &&
			   (be = active_backend(fv->backend_id)) && kept(be, &p.flow) &&
			   !(mv && fv->hop) && !(mv && (be->flags & BACKEND_F_DOWN) && in_history(ch, fv->backend_id)) &&
			   !(sp = stale_pin(ctx, eth, &p, be))) {
			/* A pin counts, but for a guess (or where this node handed
			 * the flow on) while the flow's chain is known: the chain is
			 * walked again, from its start (a replica along it takes a
			 * frame from a director for one whose earlier ones were
			 * asked, and one called down since is asked last). So is
			 * a pin to a replica called down that the chain names: the
			 * pin may be stale, made for an ended connection on the same
			 * 5-tuple, its replica dead, and the walk asks the serving
			 * replicas first and the pinned one in its turn. */
			bid = fv->backend_id;
			pin = CACHE_PINNED;
			/* Its replica learns the frame came by a pin: one without the
			 * connection knows the pin is stale (from_director). (In a
			 * transition it walks the flow's chain from there, with this
			 * director's tag, which it knows by the sender's MAC.) */
			if (!(be->flags & BACKEND_F_LOCAL) && p.flow.proto == IPPROTO_TCP)
				fmark = 1 << 8 | LB_MARK_PINNED;
			/* A pin to a replica called down, outside a moved slot: the
			 * ring's replica is asked first (LB_MARK_DOWNPIN), which
			 * serves what it has and hands on the rest. The pin may be
			 * stale, its replica dead: a client reused the port of a
			 * connection that ended there, through another director,
			 * and the ring placed the new one. In a moved slot whose
			 * chain does not name it (the others are walked, above) the
			 * pinned replica walks the chain itself where it lacks the
			 * connection (the ring's replica, not the walk's director,
			 * could be walked through twice). Not cached: each packet
			 * asks again. */
			if ((be->flags & BACKEND_F_DOWN) && fmark && !mv && cur != bid && self_tag()) {
				struct backend *cb = active_backend(cur);

				if (cb && !(cb->flags & (BACKEND_F_DOWN | BACKEND_F_REMOTE | BACKEND_F_LOCAL))) {
					ftag = addr_tag(be->addr) + 1;
					bid = cur;
					fmark = LB_MARK_TAG | 1 << 8 | LB_MARK_DOWNPIN;
					ce = 0;
				}
			}
			if (vs)
				vs->flow_hits++;
			if (now - fv->last_seen_ns > NSEC_PER_SEC) {
				fv->last_seen_ns = now;
				pin_seen(now);
			}
			/* The client ends the connection (FIN or RST): the pin goes,
			 * and no cache entry keeps it, so that a new connection on the
			 * same port is not sent after it (a replica's verdict that does
			 * not change the maps leaves cache entries standing). */
			th = tcp_hdr(data, data_end, &p);
			if (th && (th[13] & (TCP_FIN | TCP_RST))) {
				bpf_map_delete_elem(&flows, &p.flow);
				ce = 0;
			}
		} else {
			if (sp == PIN_HERE)
				return serve_here(data, data_end, &p);
			if (fv)
				count(REASON_FLOW_REPICK, 0);
			be = mv ? active_backend(pbid) : 0;
			if (be && pbid != bid && (be->flags & BACKEND_F_SPILL)) {
				/* The slot spilled to another site before the change
				 * (and does no longer, or to another edge): a TCP flow
				 * here started there (older ones were pinned when the
				 * slot began to spill), and stays. */
				if (!tunneled && p.flow.proto == IPPROTO_TCP) {
					bid = pbid;
					pin = CACHE_PINNED;
					write = CACHE_PINNED;
				}
			} else if (mv && ch && p.flow.proto == IPPROTO_TCP) {
				/* Along its chain: this node's stack settles its own
				 * replica; the first other one is asked (its node
				 * hands on what it does not have, from_director). A
				 * site's edge comes last, never for what a site sent. */
				__u32 found;

				ch->sites = !tunneled;
				__builtin_memset(ch->from, 0, sizeof(ch->from));
				build_chain(ch);
				struct backend *fb;

				found = first_held(ctx, ch, &p.flow, eth->h_proto == bpf_htons(ETH_P_IP), pkt_ack(tcp_hdr(data, data_end, &p)));
				fb = found ? active_backend(found) : 0;
				/* Another replica gets it with its class: it walks on
				 * from there, and one whose rings are not yet (or no
				 * longer) in this transition knows the frame was
				 * walked, not steered. */
				if (fb && !(fb->flags & BACKEND_F_LOCAL) && ch->n > 1)
					fmark = LB_MARK_TAG | 1 << 8 | (ch->cls[ch->pick & (LB_CHAIN - 1)] + 1);
				if (fb && found != cur) {
					bid = found;
					pin = CACHE_PINNED;
					write = CACHE_PINNED;
					guess = !(fb->flags & BACKEND_F_LOCAL);
				}
			} else if (be && pbid != bid && kept(be, &p.flow) && !(be->flags & BACKEND_F_REMOTE)) {
				/* A UDP flow cannot be told from a new one: in a moved
				 * slot it is taken for an older one (never another
				 * site's: only TCP is handed over). */
				bid = pbid;
				pin = CACHE_PINNED;
				write = CACHE_PINNED;
			}
		}
	}
	be = bid ? active_backend(bid) : 0;
	if (!be)
		return count(REASON_NO_BACKEND, XDP_PASS);
	if (p.syn && vs)
		vs->new_flows++;
	/* While the VIP is in a transition, a TCP packet this node steers by its
	 * rings alone (a slot that did not move here, a new connection's pin) may
	 * meet an edge whose rings moved it, and be walked from there, back here
	 * too. So this node asks its own stack first (it serves what it has), and
	 * the frame says where a walk starts (from the chain's start, never back
	 * here: LB_MARK_PROBE and this node's tag). One socket lookup per flow
	 * and CPU (the flow cache keeps the mark), only in a transition. */
	if (!fmark && !p.syn && !p.icmp_error && !tunneled && p.flow.proto == IPPROTO_TCP &&
	    !(be->flags & (BACKEND_F_LOCAL | BACKEND_F_REMOTE)) && prev_live(vip_id, &now)) {
		if (has_connection(ctx, eth->h_proto == bpf_htons(ETH_P_IP), &p.flow, pkt_ack(tcp_hdr(data, data_end, &p))))
			return serve_here(data, data_end, &p);
		fmark = LB_MARK_TAG | 1 << 8 | LB_MARK_PROBE;
	}
	/* An ICMP error never creates state: it only follows a flow. */
	if (write != CACHE_UNPINNED && !p.icmp_error) {
		struct flow_val nv = { .backend_id = bid, .hop = guess ? LB_PIN_GUESS : 0, .last_seen_ns = clock(&now) };

		if (write == CACHE_NEW) {
			bpf_map_update_elem(&new_pins, &p.flow, &nv, BPF_ANY);
			count(REASON_NEW_PINNED, 0);
		} else {
			bpf_map_update_elem(&flows, &p.flow, &nv, BPF_ANY);
			pin_seen(now);
			count(REASON_PINNED, 0);
		}
	}
	/* A SYN is not cached: its next packet fills the cache, so a SYN flood
	 * evicts no established flow from it (and costs less). */
	if (ce && !p.icmp_error && !p.syn) {
		__builtin_memcpy(&ce->key, &p.flow, sizeof(ce->key));
		ce->backend_id = bid;
		ce->vip_id = vip_id;
		ce->generation = cfg->generation;
		ce->hits = 0;
		ce->pin = pin;
		ce->mark = fmark;
	}

forward:
	if (be->flags & BACKEND_F_REMOTE) {
		if (!tunneled) {
			rc = to_site(ctx, be, cfg);
			if (rc >= 0)
				return count(REASON_SITE_OUT, rc);
			/* No tunnel: the packet is as it was, but the verifier
			 * wants its pointers anew after bpf_xdp_adjust_head. */
			data = (void *)(long)ctx->data;
			data_end = (void *)(long)ctx->data_end;
			eth = data;
			if ((void *)(eth + 1) > data_end)
				return count(REASON_MALFORMED, XDP_PASS);
		}
		/* Never on to a second site, nor without a tunnel: a slot of the
		 * ring that is this site's (this site may spill too: the next
		 * slots, at the same place on every director, are tried). */
		hash = flow_hash(&p.flow, cfg->seed);
		be = 0;
#pragma unroll
		for (int i = 0; i < LB_SPILL_PROBES; i++) {
			bid = pick_from_ring(&rings, vip_id, hash + i * 0x9e3779b9, cfg);
			be = bid ? active_backend(bid) : 0;
			if (be && !(be->flags & BACKEND_F_REMOTE))
				break;
			be = 0;
		}
		if (!be)
			return count(REASON_NO_BACKEND, XDP_PASS);
	}
	if (p.ip_options)
		count(REASON_IP_OPTIONS, 0);
	if (p.icmp_error)
		count(REASON_ICMP_STEERED, 0);
	bs = bpf_map_lookup_elem(&backend_stats, &bid);
	if (bs) {
		bs->packets++;
		bs->bytes += len;
	}
	/* What a client set in the mark's bits is no mark (reserved bits, which
	 * a stack ignores), and what another site sent is served where it goes,
	 * not handed on. */
	if (be->flags & BACKEND_F_LOCAL)
		return serve_here(data, data_end, &p);
	th = tcp_hdr(data, data_end, &p);
	/* The parser's reads proved at least an Ethernet header is there. */
	__builtin_memcpy(eth->h_dest, be->mac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, cfg->mac, ETH_ALEN);
	/* A walk carries this node's tag (walkers skip it), where tags are on;
	 * LB_MARK_DOWNPIN the pinned replica's. */
	if (fmark & LB_MARK_TAG && !ftag && !(ftag = self_tag()))
		fmark &= ~LB_MARK_TAG;
	if (th && (tunneled || (fmark && can_mark(th)) || marked(th))) {
		int walked = !tunneled && fmark && can_mark(th);

		put_mark(th, tunneled ? LB_MARK_FINAL : walked ? fmark : 0);
		if (walked && (fmark & LB_MARK_TAG))
			put_tag(data, data_end, ftag - 1);
	}
	return count(REASON_TX, XDP_TX);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
