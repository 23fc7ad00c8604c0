/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The flow hash: murmur3's 32-bit mixing over the 40-byte flow key, read as ten
 * little-endian words, seeded with the cluster-wide seed. dataplane/hash.go computes
 * the same function (a test checks both agree), so operator tools can tell which
 * backend a tuple maps to.
 */
#ifndef PORTICO_HASH_H
#define PORTICO_HASH_H

#include "bpf_helpers.h"
#include "lb_types.h"

static __always_inline __u32 rotl32(__u32 x, int r)
{
	return (x << r) | (x >> (32 - r));
}

static __always_inline __u32 hash_mix(__u32 h, __u32 k)
{
	k *= 0xcc9e2d51;
	k = rotl32(k, 15);
	k *= 0x1b873593;
	h ^= k;
	h = rotl32(h, 13);
	return h * 5 + 0xe6546b64;
}

static __always_inline __u32 flow_hash(const struct flow_key *key, __u32 seed)
{
	const __u32 *w = (const __u32 *)key;
	__u32 h = seed;

#pragma unroll
	for (int i = 0; i < (int)(sizeof(*key) / 4); i++)
		h = hash_mix(h, w[i]);
	h ^= sizeof(*key);
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

/* cache_slot picks a flow_cache slot: a cheap multiply-shift over the flow key
 * folded into one word. Node-local, so it need not match anything in Go. */
static __always_inline __u32 cache_slot(const struct flow_key *key)
{
	const __u64 *w = (const __u64 *)key;
	__u64 h = w[0] ^ w[1] ^ w[2] ^ w[3] ^ w[4];

	h ^= h >> 29;
	h *= 0x9e3779b97f4a7c15ULL;
	return (__u32)(h >> 52) & (LB_FLOW_CACHE - 1);
}

#endif
