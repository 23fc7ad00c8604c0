/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * What every part of xdp_lb uses: the verdict counter by reason (reason_stats)
 * and the frame's sender, another edge of the group or not.
 */
#ifndef PORTICO_COMMON_H
#define PORTICO_COMMON_H

#define NSEC_PER_SEC 1000000000ULL

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

#endif /* PORTICO_COMMON_H */
