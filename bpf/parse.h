/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Packet parsing for xdp_lb. Every read is bounds-checked against data_end; a
 * parser returns a reason (enum reason) or PARSE_OK, never touches the packet.
 */
#ifndef PORTICO_PARSE_H
#define PORTICO_PARSE_H

#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/icmpv6.h>
#include "bpf_endian.h"
#include "bpf_helpers.h"
#include "lb_types.h"

#define PARSE_OK (-1)
#define IPV4_FRAG_MASK 0x3fff /* MF flag and fragment offset */
#define IPV6_NEXTHDR_FRAGMENT 44
#define ICMP_DEST_UNREACH 3
#define ICMP_TIME_EXCEEDED 11

/* The first 8 bytes of every ICMPv4 message (linux/icmp.h pulls in libc headers). */
struct icmphdr {
	__u8 type;
	__u8 code;
	__sum16 checksum;
	__be32 rest;
};

/* What the parser found. flow is the 5-tuple as the client sent it; for an ICMP
 * error it is the flow the error is about, turned round to the client's view. */
struct parsed {
	struct flow_key flow;
	__u8 icmp_error; /* this is an ICMP error about flow */
	__u8 ip_options; /* IPv4 header longer than 20 bytes */
	__u8 syn;        /* a TCP SYN without ACK: a new connection */
	__u8 pad;
	__u16 l4_off;    /* the TCP or UDP header's offset from the frame's start
			  * (0 for an ICMP error) */
};

static __always_inline void addr_v4mapped(__u8 dst[16], __be32 v4)
{
	__u32 *w = (__u32 *)dst;
	w[0] = 0;
	w[1] = 0;
	w[2] = bpf_htonl(0x0000ffff);
	w[3] = v4;
}

static __always_inline void addr_v6(__u8 dst[16], const struct in6_addr *a)
{
	__u32 *w = (__u32 *)dst;
	w[0] = a->in6_u.u6_addr32[0];
	w[1] = a->in6_u.u6_addr32[1];
	w[2] = a->in6_u.u6_addr32[2];
	w[3] = a->in6_u.u6_addr32[3];
}

/* parse_ports reads source and destination port of a TCP or UDP header at l4,
 * and whether it opens a TCP connection (SYN without ACK). A full header must be
 * present (20 bytes for TCP, 8 for UDP). */
static __always_inline int parse_ports(void *l4, void *data_end, __u8 proto, __be16 *sport,
				       __be16 *dport, __u8 *syn)
{
	__u32 need = proto == IPPROTO_TCP ? 20 : 8;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return REASON_NOT_VIP;
	if (l4 + need > data_end)
		return REASON_MALFORMED;
	*sport = ((__be16 *)l4)[0];
	*dport = ((__be16 *)l4)[1];
	if (proto == IPPROTO_TCP)
		*syn = (((__u8 *)l4)[13] & 0x12) == 0x02; /* SYN set, ACK clear */
	return PARSE_OK;
}

/* parse_inner_ports reads the ports of the datagram quoted in an ICMP error: only
 * the first 8 bytes of its L4 header are guaranteed to be there. */
static __always_inline int parse_inner_ports(void *l4, void *data_end, __u8 proto,
					     __be16 *sport, __be16 *dport)
{
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return REASON_ICMP_OTHER;
	if (l4 + 8 > data_end)
		return REASON_MALFORMED;
	*sport = ((__be16 *)l4)[0];
	*dport = ((__be16 *)l4)[1];
	return PARSE_OK;
}

/* parse_icmp4_error: the quoted datagram was sent from the VIP to the client;
 * p->flow becomes the client's flow (source and destination swapped). */
static __always_inline int parse_icmp4_error(void *icmp, void *data_end, struct parsed *p)
{
	struct icmphdr *ih = icmp;
	struct iphdr *inner;
	__u32 hlen;
	__be16 sport, dport;
	int rc;

	if ((void *)(ih + 1) > data_end)
		return REASON_MALFORMED;
	if (ih->type != ICMP_DEST_UNREACH && ih->type != ICMP_TIME_EXCEEDED)
		return REASON_ICMP_OTHER;
	inner = (void *)(ih + 1);
	if ((void *)(inner + 1) > data_end)
		return REASON_MALFORMED;
	if (inner->version != 4 || inner->ihl < 5)
		return REASON_MALFORMED;
	hlen = inner->ihl * 4;
	rc = parse_inner_ports((void *)inner + hlen, data_end, inner->protocol, &sport, &dport);
	if (rc != PARSE_OK)
		return rc;
	addr_v4mapped(p->flow.src, inner->daddr);
	addr_v4mapped(p->flow.dst, inner->saddr);
	p->flow.sport = dport;
	p->flow.dport = sport;
	p->flow.proto = inner->protocol;
	p->icmp_error = 1;
	return PARSE_OK;
}

static __always_inline int parse_icmp6_error(void *icmp, void *data_end, struct parsed *p)
{
	struct icmp6hdr *ih = icmp;
	struct ipv6hdr *inner;
	__be16 sport, dport;
	int rc;

	if ((void *)(ih + 1) > data_end)
		return REASON_MALFORMED;
	if (ih->icmp6_type != ICMPV6_DEST_UNREACH && ih->icmp6_type != ICMPV6_PKT_TOOBIG &&
	    ih->icmp6_type != ICMPV6_TIME_EXCEED)
		return REASON_ICMP_OTHER;
	inner = (void *)(ih + 1);
	if ((void *)(inner + 1) > data_end)
		return REASON_MALFORMED;
	rc = parse_inner_ports((void *)(inner + 1), data_end, inner->nexthdr, &sport, &dport);
	if (rc != PARSE_OK)
		return rc;
	addr_v6(p->flow.src, &inner->daddr);
	addr_v6(p->flow.dst, &inner->saddr);
	p->flow.sport = dport;
	p->flow.dport = sport;
	p->flow.proto = inner->nexthdr;
	p->icmp_error = 1;
	return PARSE_OK;
}

static __always_inline int parse_ipv4(void *l3, void *data_end, struct parsed *p)
{
	struct iphdr *ip = l3;
	__u32 hlen;

	if ((void *)(ip + 1) > data_end)
		return REASON_MALFORMED;
	if (ip->version != 4 || ip->ihl < 5)
		return REASON_MALFORMED;
	hlen = ip->ihl * 4;
	if (l3 + hlen > data_end)
		return REASON_MALFORMED;
	if (ip->frag_off & bpf_htons(IPV4_FRAG_MASK))
		return REASON_FRAGMENT;
	p->ip_options = hlen > sizeof(*ip);
	if (ip->protocol == IPPROTO_ICMP)
		return parse_icmp4_error(l3 + hlen, data_end, p);
	addr_v4mapped(p->flow.src, ip->saddr);
	addr_v4mapped(p->flow.dst, ip->daddr);
	p->flow.proto = ip->protocol;
	p->l4_off = sizeof(struct ethhdr) + hlen;
	return parse_ports(l3 + hlen, data_end, ip->protocol, &p->flow.sport, &p->flow.dport, &p->syn);
}

static __always_inline int parse_ipv6(void *l3, void *data_end, struct parsed *p)
{
	struct ipv6hdr *ip6 = l3;
	__u8 nh;

	if ((void *)(ip6 + 1) > data_end)
		return REASON_MALFORMED;
	if (ip6->version != 6)
		return REASON_MALFORMED;
	nh = ip6->nexthdr;
	if (nh == IPV6_NEXTHDR_FRAGMENT)
		return REASON_FRAGMENT;
	if (nh == IPPROTO_ICMPV6)
		return parse_icmp6_error((void *)(ip6 + 1), data_end, p);
	if (nh != IPPROTO_TCP && nh != IPPROTO_UDP) {
		/* Hop-by-hop, routing, destination options, ...: not steered. */
		if (nh == 0 || nh == 43 || nh == 60 || nh == 51 || nh == 50 || nh == 135)
			return REASON_IPV6_EXT;
		return REASON_NOT_VIP;
	}
	addr_v6(p->flow.src, &ip6->saddr);
	addr_v6(p->flow.dst, &ip6->daddr);
	p->flow.proto = nh;
	p->l4_off = sizeof(struct ethhdr) + sizeof(*ip6);
	return parse_ports((void *)(ip6 + 1), data_end, nh, &p->flow.sport, &p->flow.dport, &p->syn);
}

#endif
