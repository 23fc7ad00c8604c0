/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The hand-off walk: a packet of a connection the chosen replica does not have
 * goes on along the chain of the replicas earlier rings named (build_chain),
 * each step marked so that no packet is forwarded twice, until the replica
 * that has it (bpf/README.md, "A flow's chain").
 */
#ifndef PORTICO_WALK_H
#define PORTICO_WALK_H

/* down_bit is a replica's bit in a mark's downs (LB_MARK_DOWNS): by the last
 * two bits of its address, which tell a segment's neighbours apart. */
static __always_inline __u32 down_bit(const struct backend *be) { return 1U << (be->addr[15] & 3); }

/* build_chain collects c->h into c->id, each replica once, with its class in
 * c->cls. A global function, verified once and not at every place that calls
 * it. It returns c->n. */
__attribute__((noinline)) int build_chain(struct chain *c)
{
	__u32 cls[LB_CHAIN];

	if (!c)
		return 0;
	c->n = 0;
	c->downs = 0;
	for (int i = 0; i < LB_CHAIN; i++) {
		struct backend *be = c->h[i] ? active_backend(c->h[i]) : 0;

		cls[i] = LB_CLASSES; /* none */
		if (!be)
			continue;
		cls[i] = (be->flags & BACKEND_F_REMOTE) ? 2 : (be->flags & BACKEND_F_DOWN) ? 1 : 0;
		if (cls[i] == 1)
			c->downs |= down_bit(be);
		if (cls[i] >= c->upto && !(be->flags & BACKEND_F_LOCAL))
			cls[i] = LB_CLASSES; /* (this node's own is asked of its stack) */
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
	if (tag & UDP_TAG_SHORT) /* an IPv4 UDP walk's: its last 12 bits */
		return me && (me->tags & SELF_TAGS_SHORT) && (addr_tag(be->addr) & 0x0fff) + 1 == (tag & ~UDP_TAG_SHORT);
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

/* first_held is where a director sends a packet of a flow along its built
 * chain: this node's own replica if its stack has the connection (v4: an IPv4
 * flow; a UDP flow: if it served it, udp_seen), else the first other replica in the order chains are walked, which
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
		if (f->proto == IPPROTO_UDP ? bpf_map_lookup_elem(&udp_seen, f) != 0 : has_connection(ctx, v4, f, ack)) {
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

/* rescuable: a replica a frame at its chain's end may be rescued to (rescue):
 * one of this site that the walk's edges (downs) may call down, that this node
 * calls serving (or pinned the flow to: pinned), and that is neither this
 * node, the director (tag), nor the edge that walked the frame here. */
static __always_inline int rescuable(const struct backend *be, __u32 downs, __u32 tag, const __u8 *from,
				     const struct self_addr *me, int pinned)
{
	return be && !(be->flags & (BACKEND_F_LOCAL | BACKEND_F_REMOTE)) && (pinned || !(be->flags & BACKEND_F_DOWN)) &&
	       (downs & down_bit(be)) && !is_tagged(be, tag, me) && !from_here(be, from);
}

/* rescue_pick is where a frame walked to its chain's end at this node goes
 * when an edge before it called down (downs) a replica that another edge,
 * calling it serving, placed below itself in the walk's order: one placed it
 * last, the other had passed it, so nobody asked it. This node's pin of the
 * flow (pin: a director's, a holder's report, or where this node handed it
 * on before; whatever this node calls it) first, then the current ring's
 * replica (cur), then the lowest replica of the built chain (c->n of them)
 * that this node calls serving. A backend id, 0 for none. A global
 * function. */
__attribute__((noinline)) int rescue_pick(struct chain *c, __u32 downs, __u32 tag, __u32 pin, __u32 cur)
{
	__u32 zero = 0, id = 0;
	struct self_addr *me = bpf_map_lookup_elem(&self_addr, &zero);
	struct backend *be, *best = 0;

	if (!c || !downs)
		return 0;
	if (pin && rescuable(active_backend(pin), downs, tag, c->from, me, 1))
		return pin;
	if (cur && rescuable(active_backend(cur), downs, tag, c->from, me, 0))
		return cur;
	for (int j = 0; j < LB_CHAIN; j++) {
		if (j >= c->n)
			break;
		be = active_backend(c->id[j]);
		if (c->cls[j] || !rescuable(be, downs, tag, c->from, me, 0))
			continue;
		if (best && addr_cmp(be->addr, best->addr) >= 0)
			continue;
		best = be;
		id = c->id[j];
	}
	return id;
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

/* saw_udp records a UDP datagram of a VIP flow that this node's stack serves
 * (udp_seen), for its holder's report: one lookup, and a write at most once a
 * second per flow. */
static __always_inline void saw_udp(const struct parsed *p, __u64 *now)
{
	struct udp_seen_val *v;

	if (p->flow.proto != IPPROTO_UDP || p->icmp_error)
		return;
	v = bpf_map_lookup_elem(&udp_seen, &p->flow);
	if (!v) {
		struct udp_seen_val nv = { .first_ns = clock(now), .last_ns = clock(now) };

		bpf_map_update_elem(&udp_seen, &p->flow, &nv, BPF_NOEXIST);
	} else if (clock(now) - v->last_ns > NSEC_PER_SEC) {
		v->last_ns = *now;
	}
}

/* serve_here passes a frame to this node's stack, without the mark bits a
 * client may have set (reserved bits, which a stack ignores), or an edge this
 * node does not know as a peer yet (an IPv4 UDP walk's reserved flag). */
static __always_inline int serve_here(void *data, void *data_end, const struct parsed *p)
{
	__u8 *th = tcp_hdr(data, data_end, p);
	struct ethhdr *eth = data;

	if (th && marked(th))
		put_mark(th, 0);
	else if (!th && p->flow.proto == IPPROTO_UDP && eth->h_proto == bpf_htons(ETH_P_IP))
		put_udp_mark(data, data_end, 0, 0);
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

/* rescue sends a frame that reached its chain's end here, no connection here,
 * to a replica this node calls serving that the walk's edges may call down
 * (rescue_pick), marked to be served there and never sent on
 * (LB_MARK_RESCUE; LB_MARK_RESCUE_WAIT within LB_SETTLE_MS of a change here:
 * dropped there if not had, as here). Per-edge verdicts differ for as long as
 * their probes' answers do: an edge that calls a live replica down places it
 * last in the walk's order, and an edge that calls it serving places it by
 * its address, below itself; neither asks it. ch is the built chain (ch->n 0
 * outside a transition), ch->from set, ch->h[1] the current ring's replica;
 * pin this node's pin of the flow (0: none); hops the hand-offs so far (the
 * budget's last for a stranger's frame). The XDP verdict, or -1: none to send
 * it to. */
static __always_inline int rescue(struct xdp_md *ctx, struct ethhdr *eth, __u8 *th, const struct lb_config *cfg,
				  struct chain *ch, __u32 vip_id, __u32 m, __u32 hops, __u32 tag, __u32 pin, __u64 *now)
{
	struct backend *be;
	__u32 id;

	if (!ch || !mark_downs(m) || hops >= LB_MAX_HOPS || (m & 0xff) > LB_CLASSES)
		return -1;
	id = rescue_pick(ch, mark_downs(m), tag, pin, ch->h[1]);
	be = id ? active_backend(id) : 0;
	if (!be)
		return -1;
	count(REASON_HANDOFF_RESCUE, 0);
	return hand_on(ctx, eth, th, be, settling(vip_id, now) ? LB_MARK_RESCUE_WAIT : LB_MARK_RESCUE, cfg);
}

/* chain_here builds in ch the chain of a flow another edge sent here, as this
 * node's rings give it: the transition's rings (inside), else its one ring's
 * replica; the classes it may hold: upto (chain.upto); from the edge that walked it here
 * (0: a director steered it, unmarked). This node's pin of the flow (its
 * director's, a holder's report, or where it handed the flow on before) is in
 * the chain too, where there is room: its rings may never have named where the
 * connection lives (its verdicts differed then, or its transition ended), and
 * the walk goes there in its turn. It returns that pin (0: none), its entry in
 * *pv. */
static __always_inline __u32 chain_here(struct chain *ch, const struct flow_key *flow, __u32 vip_id,
					const struct lb_config *cfg, int inside, __u32 upto, const __u8 *from,
					struct flow_val **pv)
{
	__u32 hash = flow_hash(flow, cfg->seed), pin;
	struct flow_val *fv;

	ch->h[0] = inside ? pick_from_ring(&prev_rings, vip_id, hash, cfg) : 0;
	ch->h[1] = pick_from_ring(&rings, vip_id, hash, cfg);
	ch->upto = upto;
	if (from)
		__builtin_memcpy(ch->from, from, ETH_ALEN);
	else
		__builtin_memset(ch->from, 0, sizeof(ch->from));
	if (inside)
		fill_history(ch, vip_id, hash);
	else
		__builtin_memset(&ch->h[2], 0, sizeof(ch->h) - 2 * sizeof(ch->h[0]));
	fv = bpf_map_lookup_elem(&flows, flow);
	*pv = fv;
	pin = fv ? fv->backend_id : 0;
	if (pin) {
		if (!inside)
			ch->h[0] = pin;
		else if (!ch->h[LB_CHAIN - 1])
			ch->h[LB_CHAIN - 1] = pin;
	}
	build_chain(ch);
	return pin;
}

/* udp_walk handles a UDP datagram of a VIP flow another edge sent here, its
 * mark (udp_mark) taken off. UDP leaves no socket per flow, so udp_seen (the
 * flows this node's stack served) stands for one. Served here if it is not
 * walked (a director chose this node: a new flow, or one it holds), is to be
 * served (UDP_MARK_FINAL), or was seen here; else on along the chain its rings
 * give (chain_here), from where this node stands in it (its own class) upwards,
 * never to the director (the tag) nor the edge that walked it here, one
 * hand-off more (UDP_MAX_HOPS at most; a stranger's mark, udp_stranger_mark:
 * none, as at the chain's end). At the chain's end nobody had it: a new
 * flow (or one whose holder is gone), sent to the current ring's replica to be
 * served there, where every director sends it once the transition is over.
 * Never dropped: a new flow's first datagram (a DNS query) is not sent again
 * soon. */
static __always_inline int udp_walk(struct ethhdr *eth, void *data_end, const struct parsed *p,
				    const struct lb_config *cfg, __u32 vip_id, int stranger)
{
	__u32 zero = 0, m = udp_mark(eth, data_end), hops = m & (UDP_MARK_TAGGED - 1), tag, after = 1;
	struct flow_val *fv;
	struct chain *ch;
	struct backend *be;
	__u64 now = 0;
	int j;

	tag = udp_tag(eth, data_end, m);
	if (!m || m == UDP_MARK_FINAL || !hops || hops > UDP_MAX_HOPS ||
	    bpf_map_lookup_elem(&udp_seen, &p->flow) || !(ch = bpf_map_lookup_elem(&chains, &zero))) {
		put_udp_mark(eth, data_end, 0, 0);
		saw_udp(p, &now);
		return count(m ? REASON_HANDOFF_IN : REASON_FROM_PEER, XDP_PASS);
	}
	/* A mark from no peer edge: to the current ring's replica at most. */
	if (stranger) {
		hops = UDP_MAX_HOPS;
		count(REASON_STRANGER_MARK, 0);
	}
	chain_here(ch, &p->flow, vip_id, cfg, prev_live(vip_id, &now), 1, eth->h_source, &fv);
	for (int i = 0; i < LB_CHAIN; i++) {
		if (i >= ch->n)
			break;
		be = active_backend(ch->id[i]);
		if (be && (be->flags & BACKEND_F_LOCAL))
			after = ch->cls[i] + 1;
	}
	j = hops < UDP_MAX_HOPS ? chain_next(ch, after, tag) : -1;
	be = j >= 0 ? active_backend(ch->id[(__u32)j & (LB_CHAIN - 1)]) : 0;
	if (be) {
		put_udp_mark(eth, data_end, (m & UDP_MARK_TAGGED) | (hops + 1), tag);
		count(REASON_HANDOFF, 0);
	} else {
		be = ch->h[1] ? active_backend(ch->h[1]) : 0;
		if (!be || (be->flags & (BACKEND_F_LOCAL | BACKEND_F_REMOTE | BACKEND_F_DOWN))) {
			put_udp_mark(eth, data_end, 0, 0);
			saw_udp(p, &now);
			return count(REASON_HANDOFF_END, XDP_PASS);
		}
		/* It names its receiver, so that one that does not know this
		 * node as a peer yet still serves it (udp_stranger_mark). */
		put_udp_mark(eth, data_end, UDP_MARK_FINAL, self_tag() ? addr_tag(be->addr) + 1 : 0);
		count(REASON_UDP_NEW, 0);
	}
	__builtin_memcpy(eth->h_dest, be->mac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, cfg->mac, ETH_ALEN);
	return count(REASON_TX, XDP_TX);
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
	__u32 vip_id, m = 0, zero = 0, hops, tag, pin;
	__u8 *th = tcp_hdr(eth, data_end, p);
	struct chain *ch;
	struct backend *be;
	struct flow_val *fv;
	__u64 now = 0;
	int relays, j, inside = 1;

	if (!th && !p->icmp_error && p->flow.proto == IPPROTO_UDP && lookup_vip(&p->flow, cfg, &vip_id) == 1)
		return udp_walk(eth, data_end, p, cfg, vip_id, stranger);
	if (th && (m = get_mark(th)))
		put_mark(th, 0);
	if (m == LB_MARK_FINAL)
		return count(REASON_HANDOFF_IN, XDP_PASS);
	/* A walk's last chance (rescue): served if this node has it; else as at
	 * a chain's end, never sent on. */
	if (th && ((m & 0xff) == LB_MARK_RESCUE || (m & 0xff) == LB_MARK_RESCUE_WAIT)) {
		if (has_connection(ctx, eth->h_proto == bpf_htons(ETH_P_IP), &p->flow, pkt_ack(th)))
			return count(REASON_HANDOFF_IN, XDP_PASS);
		if ((m & 0xff) == LB_MARK_RESCUE_WAIT ||
		    (lookup_vip(&p->flow, cfg, &vip_id) == 1 && settling(vip_id, &now)))
			return count(REASON_HANDOFF_WAIT, XDP_DROP);
		return count(REASON_HANDOFF_END, XDP_PASS);
	}
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
			return hand_on(ctx, eth, th, be, (m & (LB_MARK_TAG | LB_MARK_DOWNS)) | (hops + 1) << 8 | fv->hop, cfg);
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
		/* A director steered it here by its ring: served. */
		if (!m)
			return count(REASON_FROM_PEER, XDP_PASS);
		/* A frame another edge walked along a chain this node's rings do
		 * not give (it has not applied the change yet, or its transition
		 * ended first, or its verdicts differ): on along the chain of
		 * this node's one ring, below. */
		inside = 0;
	}
	if (has_connection(ctx, eth->h_proto == bpf_htons(ETH_P_IP), &p->flow, pkt_ack(th)))
		return count(m ? REASON_HANDOFF_IN : REASON_FROM_PEER, XDP_PASS);
	/* In the transition, along the chain its rings give now (a pin made
	 * under other rings may name a replica they no longer give); outside
	 * one, its one ring's replica, if that is above this node. */
	ch = bpf_map_lookup_elem(&chains, &zero);
	if (!ch)
		return count(REASON_FROM_PEER, XDP_PASS);
	/* An edge that walked the frame here asked its own stack; a director
	 * that steered it unmarked did not, and may have it. */
	pin = chain_here(ch, &p->flow, vip_id, cfg, inside, LB_CLASSES, m ? eth->h_source : 0, &fv);
	j = hops < LB_MAX_HOPS ? chain_next(ch, m & 0xff, tag) : -1;
	if (j >= 0) {
		__u32 k = (__u32)j & (LB_CHAIN - 1), id = ch->id[k], cls = ch->cls[k] + 1;
		struct flow_val nv = { .backend_id = id, .hop = cls, .last_seen_ns = clock(&now) };

		if ((be = active_backend(id))) {
			/* A pin without a hop (a holder's report, or this
			 * node's own as a director) says where the connection
			 * is, more than where a walk went on: it stays. */
			if (!fv || fv->hop)
				bpf_map_update_elem(&flows, &p->flow, &nv, BPF_ANY);
			seen(&relay_clock, now);
			if (tag)
				put_tag(eth, data_end, tag - 1);
			return hand_on(ctx, eth, th, be,
				       (m & (LB_MARK_TAG | LB_MARK_DOWNS)) | ch->downs << 12 | (hops + 1) << 8 | cls, cfg);
		}
	}
	/* No later replica: the connection is nowhere this node can see, but
	 * maybe at a replica the edges before it call down and it does not
	 * (rescue). Right after a change it may be that another edge's rings
	 * are not yet this node's (a retransmission finds them settled); later
	 * it is gone. */
	if (m && (j = rescue(ctx, eth, th, cfg, ch, vip_id, m, hops, tag, pin, &now)) >= 0)
		return j;
	if (settling(vip_id, &now))
		return count(REASON_HANDOFF_WAIT, XDP_DROP);
	return count(m ? REASON_HANDOFF_END : REASON_FROM_PEER, XDP_PASS);
}

#endif /* PORTICO_WALK_H */
