/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * A packet another site's edge sent through the tunnel (encap.h writes and
 * reads the tunnel; this is what xdp_lb does with what comes out of it).
 */
#ifndef PORTICO_SITE_H
#define PORTICO_SITE_H

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

#endif /* PORTICO_SITE_H */
