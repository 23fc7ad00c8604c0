/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Internet checksums (RFC 1071) for the headers xdp_lb writes: updated in place for
 * a changed word (RFC 1624), or computed for an IPv4 header it builds.
 */
#ifndef PORTICO_CSUM_H
#define PORTICO_CSUM_H

#include <linux/ip.h>
#include "bpf_helpers.h"

/* csum_fold folds a 32-bit sum of 16-bit words into its one's complement
 * 16-bit checksum. */
static __always_inline __u16 csum_fold(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* csum16 updates a 16-bit checksum for a 16-bit word changed from old to new
 * (RFC 1624). */
static __always_inline __u16 csum16(__u16 check, __u16 old, __u16 new)
{
	return csum_fold((__u16)~check + (__u16)~old + new);
}

/* ipv4_csum is the checksum of a 20-byte IPv4 header (no options) whose check
 * field is zero. */
static __always_inline __u16 ipv4_csum(const struct iphdr *ip)
{
	const __u16 *w = (const __u16 *)ip;
	__u32 sum = 0;

#pragma unroll
	for (int i = 0; i < 10; i++)
		sum += w[i];
	return csum_fold(sum);
}

#endif
