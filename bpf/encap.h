/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * What xdp_lb writes into a frame it sends on, and reads back from one another
 * node sent: the hand-off mark in the TCP header and the director's tag in the IP
 * header (between the edges of a site), and the IPv4 tunnel between sites. Each
 * helper changes the packet, or reads what one of them wrote; which frame gets
 * what is lb.bpf.c's choice.
 */
#ifndef PORTICO_ENCAP_H
#define PORTICO_ENCAP_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include "bpf_helpers.h"
#include "bpf_endian.h"
#include "lb_types.h"
#include "lb_maps.h"
#include "parse.h"
#include "csum.h"

/* The hand-off mark, in the TCP header so that IPv4 and IPv6 are marked alike and
 * a frame keeps its size: three reserved bits (RFC 9293: sent as zero, ignored on
 * receipt; not the fourth, which AccECN took) say a frame is handed on (1) or is
 * to be served (7), and a handed-on frame's urgent pointer (which a segment
 * without URG does not use, and every stack sends as zero) the receiver's class
 * in the flow's chain plus one, and the hand-offs so far. Only a segment without URG and with a zero
 * urgent pointer is handed on, so clearing the mark gives back the frame the
 * client sent; the receiving edge clears it before its stack sees the frame. */
#define TCP_MARK_BITS 0x0e00 /* in the 16-bit word at offset 12 */
#define TCP_MARK_HOP 0x0200
#define TCP_MARK_TAGGED 0x0600 /* handed on, the director's tag in the IP header */
#define LB_MARK_TAG (1U << 16) /* in a mark: TCP_MARK_TAGGED */
#define TCP_URG 0x20

/* tcp_hdr is the TCP header of a parsed TCP packet (no ICMP error), or 0. */
static __always_inline __u8 *tcp_hdr(void *data, void *data_end, const struct parsed *p)
{
	__u8 *th = data + (p->l4_off & 0xff);

	if (p->flow.proto != IPPROTO_TCP || p->icmp_error || !p->l4_off || (void *)(th + 20) > data_end)
		return 0;
	return th;
}

/* marked reports whether a TCP header carries mark bits, whatever they say. */
static __always_inline int marked(const __u8 *th) { return th[12] & (TCP_MARK_BITS >> 8); }

/* get_mark is a frame's mark: 0 (none), the receiver's class + 1 (1 to
 * LB_CLASSES), LB_MARK_PROBE, LB_MARK_PINNED, LB_MARK_DOWNPIN, LB_MARK_RESCUE or
 * LB_MARK_RESCUE_WAIT, with the hand-offs so far in the next 4 bits, the walk's
 * downs in the 4 above them (LB_MARK_DOWNS) and LB_MARK_TAG if the director's
 * tag is in the IP header, or LB_MARK_FINAL (also for a mark that names no
 * class, or more hand-offs than LB_MAX_HOPS). */
static __always_inline __u32 get_mark(const __u8 *th)
{
	__u32 bits = th[12] & (TCP_MARK_BITS >> 8), hops = th[18] & 0x0f, cls = th[19];

	if (!bits)
		return 0;
	if ((bits != TCP_MARK_HOP >> 8 && bits != TCP_MARK_TAGGED >> 8) || cls == 0 || cls > LB_MARK_RESCUE_WAIT ||
	    hops > LB_MAX_HOPS)
		return LB_MARK_FINAL;
	return (bits == TCP_MARK_TAGGED >> 8 ? LB_MARK_TAG : 0) | (__u32)th[18] << 8 | cls;
}

/* mark_hops is the hand-offs a mark counts. */
static __always_inline __u32 mark_hops(__u32 m) { return (m >> 8) & 0x0f; }

/* The walk's downs: a 4-bit filter of the replicas the edges a frame passed
 * call down (down_bit of each), in a mark's bits 12-15 (the urgent pointer's
 * high nibble). An edge whose own verdicts differ finds there the replicas
 * those edges placed last in the walk's order, and it placed below itself
 * (bpf/README.md, "Verdicts that differ"). */
#define LB_MARK_DOWNS 0xf000U

static __always_inline __u32 mark_downs(__u32 m) { return (m & LB_MARK_DOWNS) >> 12; }

/* can_mark reports whether a frame may carry a class: no URG, no urgent pointer. */
static __always_inline int can_mark(const __u8 *th)
{
	return !(th[13] & TCP_URG) && !th[18] && !th[19];
}

/* put_mark writes mark (0 clears it; LB_MARK_FINAL; a class + 1 with the
 * hand-offs in the next byte and LB_MARK_TAG, which only a frame can_mark may
 * carry) into a TCP header, keeping its checksum right. */
static __always_inline void put_mark(__u8 *th, __u32 mark)
{
	__u16 old = (__u16)th[12] << 8 | th[13], new = old & ~TCP_MARK_BITS;
	__u16 ourg = (__u16)th[18] << 8 | th[19], nurg = ourg;
	__u16 check = (__u16)th[16] << 8 | th[17];

	if (mark == LB_MARK_FINAL) {
		new |= TCP_MARK_BITS;
	} else if (mark) {
		new |= mark & LB_MARK_TAG ? TCP_MARK_TAGGED : TCP_MARK_HOP;
		nurg = mark & 0xffff;
	} else if (((old & TCP_MARK_BITS) == TCP_MARK_HOP || (old & TCP_MARK_BITS) == TCP_MARK_TAGGED) &&
		   !(th[13] & TCP_URG)) {
		nurg = 0; /* a class this header carried */
	}
	if (old == new && ourg == nurg)
		return;
	check = csum16(csum16(check, old, new), ourg, nurg);
	th[12] = new >> 8;
	th[18] = nurg >> 8;
	th[19] = nurg & 0xff;
	th[16] = check >> 8;
	th[17] = check & 0xff;
}

/* The director's tag. A walked frame must not come back to the edge that
 * directed it (it checked its own stack, and would send the frame on a second
 * time), and that edge is in the chains of others wherever its replica is. So
 * the director writes its tag, the last 16 bits of its address (addr_tag), into
 * the IP header, and every edge along the walk skips the replica that has it:
 * the IPv4 identification of a datagram that is no fragment (RFC 6864: only
 * reassembly reads it), or the low 16 bits of the IPv6 flow label (which only
 * ECMP hashes and a reflecting stack read, and the frame is past both). It is
 * not given back (no room to keep the client's value): the serving stack sees
 * the tag there. Only where a node's addresses differ in their last 16 bits
 * (self_addr.tags, Go's check) is a tag written or read. */
static __always_inline __u16 addr_tag(const __u8 *a) { return (__u16)a[14] << 8 | a[15]; }

/* self_tag is this node's tag + 1, 0 if tags are off here. */
static __always_inline __u32 self_tag(void)
{
	__u32 zero = 0;
	struct self_addr *me = bpf_map_lookup_elem(&self_addr, &zero);

	return me && me->set && me->tags ? addr_tag(me->addr) + 1 : 0;
}

/* pin_new reports whether a new connection is pinned in any slot, moved or
 * not (self_addr.differ): while this node's verdicts differ from another
 * edge's, its ring and theirs differ where no ring of its transition does. */
static __always_inline int pin_new(void)
{
	__u32 zero = 0;
	struct self_addr *me = bpf_map_lookup_elem(&self_addr, &zero);

	return me && me->differ;
}

/* udp_tags reports whether a UDP frame of this node's carries its tag: where
 * tags of that width tell every replica apart (self_addr.tags; v4: an IPv4
 * frame, whose tag is 12 bits). */
static __always_inline int udp_tags(int v4)
{
	__u32 zero = 0;
	struct self_addr *me = bpf_map_lookup_elem(&self_addr, &zero);

	return me && me->set && (me->tags & (v4 ? SELF_TAGS_SHORT : SELF_TAGS));
}

/* tag_word is the 16-bit word of the IP header that carries a tag, 0 if none. */
static __always_inline __u8 *tag_word(void *data, void *data_end)
{
	struct ethhdr *eth = data;
	__u8 *ip = (__u8 *)(eth + 1);

	if (eth->h_proto == bpf_htons(ETH_P_IP))
		return (void *)(ip + 20) <= data_end ? ip + 4 : 0; /* identification */
	if (eth->h_proto == bpf_htons(ETH_P_IPV6))
		return (void *)(ip + 40) <= data_end ? ip + 2 : 0; /* the flow label's low 16 bits */
	return 0;
}

/* put_tag writes tag (a tag, not + 1) into a frame's IP header (the IPv4
 * header checksum kept right). */
static __always_inline void put_tag(void *data, void *data_end, __u16 tag)
{
	struct ethhdr *eth = data;
	__u8 *w = tag_word(data, data_end), *ip = (__u8 *)(eth + 1);
	__u16 old;

	if (!w)
		return;
	old = (__u16)w[0] << 8 | w[1];
	if (old == tag)
		return;
	if (eth->h_proto == bpf_htons(ETH_P_IP) && (void *)(ip + 20) <= data_end) {
		__u16 check = csum16((__u16)ip[10] << 8 | ip[11], old, tag);

		ip[10] = check >> 8;
		ip[11] = check & 0xff;
	}
	w[0] = tag >> 8;
	w[1] = tag & 0xff;
}

/* get_tag is the tag + 1 a frame marked with m carries, 0 for none. */
static __always_inline __u32 get_tag(void *data, void *data_end, __u32 m)
{
	__u8 *w;

	if (!(m & LB_MARK_TAG) || !(w = tag_word(data, data_end)))
		return 0;
	return ((__u16)w[0] << 8 | w[1]) + 1;
}

/* sender_tag is the tag + 1 of the edge that sent a frame (mac_tags), 0 when
 * tags are off here or the sender is none of this site's edges; with one, the
 * mark m says the frame is tagged, and the frame carries it from here on. */
static __always_inline __u32 sender_tag(struct ethhdr *eth, __u32 *m)
{
	struct peer_key pk = {};
	__u32 *t;

	if (!self_tag())
		return 0;
	__builtin_memcpy(pk.mac, eth->h_source, ETH_ALEN);
	t = bpf_map_lookup_elem(&mac_tags, &pk);
	if (!t)
		return 0;
	*m |= LB_MARK_TAG;
	return *t + 1;
}

/* The UDP walk's mark (bpf/README.md, "UDP"). UDP has no bits a stack ignores,
 * so 4 bits ride in the IP header, between the edges of a site only, beside the
 * director's tag: in IPv4 the reserved flag (RFC 791: zero) says the frame is
 * marked, and the identification carries the mark in its top 4 bits and the
 * tag's last 12 (a shorter tag: UDP_TAG_SHORT); in IPv6 the flow label's top
 * 4 bits (its low 16 are the tag; only ECMP hashes and a reflecting stack read
 * it). A director writes them on every UDP frame it sends another edge (0, or
 * no reserved flag, for none), so a client's label or flag is never taken for
 * a mark, and the receiving edge clears them before its stack sees the frame.
 * An edge of an earlier version reads none of it: it serves the frame. 0: none
 * (a director chose the receiver: it serves it); 1 to UDP_MAX_HOPS: walked, the
 * hand-offs so far, with UDP_MARK_TAGGED if the director's tag is there;
 * UDP_MARK_FINAL: serve it (a new flow: nobody along its chain had it). */
#define UDP_MARK_TAGGED 8
#define UDP_MARK_FINAL 15
#define UDP_MAX_HOPS 6
#define IPV4_RESERVED 0x8000
#define UDP_TAG_SHORT (1U << 20) /* in a tag + 1: it names the last 12 bits */

/* udp_mark_word is the 16-bit word of the IP header a UDP frame's mark is in
 * (the IPv4 identification, the IPv6 header's first), or 0 if the frame is no
 * UDP datagram of IPv4 or IPv6 (v4: an IPv4 one). */
static __always_inline __u8 *udp_mark_word(void *data, void *data_end, int *v4)
{
	struct ethhdr *eth = data;
	__u8 *ip = (__u8 *)(eth + 1);

	*v4 = 0;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		*v4 = 1;
		return (void *)(ip + 20) <= data_end && ip[9] == IPPROTO_UDP ? ip + 4 : 0;
	}
	if (eth->h_proto == bpf_htons(ETH_P_IPV6))
		return (void *)(ip + 40) <= data_end && ip[6] == IPPROTO_UDP ? ip : 0; /* the label's top bits: ip[1] */
	return 0;
}

/* udp_mark reads a UDP frame's mark (0 for none, or a frame that cannot carry
 * one). */
static __always_inline __u32 udp_mark(void *data, void *data_end)
{
	int v4;
	__u8 *w = udp_mark_word(data, data_end, &v4);

	if (!w)
		return 0;
	if (v4)
		return w[2] & (IPV4_RESERVED >> 8) ? w[0] >> 4 : 0;
	return w[1] & 0x0f;
}

/* udp_stranger_mark reports whether a UDP frame from no peer edge carries a
 * walk's mark: a new peer's, which this node has not learned yet (a client
 * sets no reserved flag; in IPv6 the label must name the tag of an edge this
 * node knows, tag_macs, or for UDP_MARK_FINAL this node's own, which a
 * client's does by chance once in 65,536 at most). Such a frame buys one
 * hand-off at most, as a TCP one does (one to be served: none). */
static __always_inline int udp_stranger_mark(void *data, void *data_end)
{
	__u32 m = udp_mark(data, data_end), key;
	struct ethhdr *eth = data;
	__u8 *w;

	if (!m || (m != UDP_MARK_FINAL && (m & (UDP_MARK_TAGGED - 1)) > UDP_MAX_HOPS))
		return 0;
	if (eth->h_proto == bpf_htons(ETH_P_IP))
		return 1;
	if (!(m & UDP_MARK_TAGGED) || !(w = tag_word(data, data_end)))
		return 0;
	key = (__u32)w[0] << 8 | w[1];
	if (m == UDP_MARK_FINAL) /* it names its receiver: this node */
		return key + 1 == self_tag();
	return bpf_map_lookup_elem(&tag_macs, &key) != 0;
}

/* udp_tag is the director's tag + 1 a UDP frame marked m carries (IPv4: its
 * last 12 bits, with UDP_TAG_SHORT), 0 for none. */
static __always_inline __u32 udp_tag(void *data, void *data_end, __u32 m)
{
	int v4;
	__u8 *w = udp_mark_word(data, data_end, &v4);

	if (!w || !(m & UDP_MARK_TAGGED) || m == UDP_MARK_FINAL)
		return 0;
	if (v4)
		return ((((__u32)w[0] & 0x0f) << 8 | w[1]) + 1) | UDP_TAG_SHORT;
	return get_tag(data, data_end, LB_MARK_TAG);
}

/* put_udp_mark writes mark (0 clears it) and, with mark & UDP_MARK_TAGGED,
 * tag (a tag + 1, 0 for none: the director's, or for UDP_MARK_FINAL its
 * receiver's) into a UDP frame's IP header, the IPv4 header checksum kept
 * right. An IPv4 frame without a mark is left as it came but for
 * the reserved flag. */
static __always_inline void put_udp_mark(void *data, void *data_end, __u32 mark, __u32 tag)
{
	struct ethhdr *eth = data;
	__u8 *ip = (__u8 *)(eth + 1);
	int v4;
	__u8 *w = udp_mark_word(data, data_end, &v4);
	__u16 oid, nid, oflags, nflags, check;

	if (!w)
		return;
	if (!v4) {
		w[1] = (w[1] & 0xf0) | (mark & 0x0f);
		if ((mark & UDP_MARK_TAGGED) && tag)
			put_tag(data, data_end, tag - 1);
		return;
	}
	if ((void *)(ip + 20) > data_end)
		return;
	oid = (__u16)ip[4] << 8 | ip[5];
	oflags = (__u16)ip[6] << 8 | ip[7];
	nid = oid;
	nflags = oflags & ~IPV4_RESERVED;
	if (mark) {
		nflags |= IPV4_RESERVED;
		nid = (mark & 0x0f) << 12 | (nid & 0x0fff);
		if ((mark & UDP_MARK_TAGGED) && tag)
			nid = (nid & 0xf000) | ((tag - 1) & 0x0fff);
	}
	if (oid == nid && oflags == nflags)
		return;
	check = csum16(csum16((__u16)ip[10] << 8 | ip[11], oid, nid), oflags, nflags);
	ip[4] = nid >> 8;
	ip[5] = nid & 0xff;
	ip[6] = nflags >> 8;
	ip[7] = nflags & 0xff;
	ip[10] = check >> 8;
	ip[11] = check & 0xff;
}

/* to_site sends a packet to another site's edge (a BACKEND_F_REMOTE backend) in
 * an IPv4 tunnel: a 20-byte IPv4 header goes in front of the IP packet (IPIP, or
 * protocol 41 for IPv6), from this node's tunnel address (tunnel) to be->addr,
 * in a frame to be->mac, the next hop's. DF is set: the path between the sites
 * must carry 20 bytes more than the clients' MTU. It returns the verdict, or -1
 * (the packet untouched) when this node has no tunnel address. */
static __always_inline int to_site(struct xdp_md *ctx, const struct backend *be, const struct lb_config *cfg)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct tunnel_cfg *tc;
	struct iphdr *ip;
	__u32 zero = 0;
	__be16 proto;

	tc = bpf_map_lookup_elem(&tunnel, &zero);
	if (!tc || !*(__u32 *)tc->src4 || (void *)(eth + 1) > data_end)
		return -1;
	proto = eth->h_proto;
	if (bpf_xdp_adjust_head(ctx, -(int)sizeof(struct iphdr)))
		return -1;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	eth = data;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end)
		return XDP_DROP; /* unreachable: adjust_head made the room */
	__builtin_memcpy(eth->h_dest, be->mac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, cfg->mac, ETH_ALEN);
	eth->h_proto = bpf_htons(ETH_P_IP);
	ip->version = 4;
	ip->ihl = 5;
	ip->tos = 0;
	ip->tot_len = bpf_htons((__u16)(data_end - (void *)ip));
	ip->id = 0;
	ip->frag_off = bpf_htons(0x4000); /* DF */
	ip->ttl = 64;
	ip->protocol = proto == bpf_htons(ETH_P_IP) ? IPPROTO_IPIP : IPPROTO_IPV6;
	ip->check = 0;
	ip->saddr = *(__u32 *)tc->src4;
	ip->daddr = ((const __u32 *)be->addr)[3];
	ip->check = ipv4_csum(ip);
	return XDP_TX;
}

/* tunnel_inner reports whether a frame is a packet in a tunnel (IPIP, or
 * protocol 41 for IPv6) to this node's tunnel address (tunnel) whose inner
 * packet parses: 1, with p describing that packet and proto its EtherType,
 * or 0. It never changes the packet. */
static __always_inline int tunnel_inner(struct ethhdr *eth, void *data_end, struct parsed *p, __be16 *proto)
{
	struct iphdr *ip = (void *)(eth + 1);
	struct tunnel_cfg *tc;
	__u32 zero = 0;

	if ((void *)(ip + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP) || ip->ihl != 5 ||
	    (ip->protocol != IPPROTO_IPIP && ip->protocol != IPPROTO_IPV6) ||
	    (ip->frag_off & bpf_htons(IPV4_FRAG_MASK)))
		return 0;
	tc = bpf_map_lookup_elem(&tunnel, &zero);
	if (!tc || !ip->daddr || ip->daddr != *(__u32 *)tc->src4)
		return 0;
	__builtin_memset(p, 0, sizeof(*p));
	if (ip->protocol == IPPROTO_IPIP) {
		*proto = bpf_htons(ETH_P_IP);
		return parse_ipv4(ip + 1, data_end, p) == PARSE_OK;
	}
	*proto = bpf_htons(ETH_P_IPV6);
	return parse_ipv6(ip + 1, data_end, p) == PARSE_OK;
}

/* decap takes a packet tunnel_inner found out of its tunnel: the outer IPv4
 * header goes, and the frame keeps its MAC addresses and takes proto, the inner
 * packet's EtherType. It returns 1, or 0 when the header could not go. */
static __always_inline int decap(struct xdp_md *ctx, struct ethhdr *eth, __be16 proto)
{
	__u8 dst[ETH_ALEN], src[ETH_ALEN];
	void *data_end;

	__builtin_memcpy(dst, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(src, eth->h_source, ETH_ALEN);
	if (bpf_xdp_adjust_head(ctx, (int)sizeof(struct iphdr)))
		return 0;
	eth = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	if ((void *)(eth + 1) > data_end)
		return 0; /* unreachable: the inner packet was parsed */
	__builtin_memcpy(eth->h_dest, dst, ETH_ALEN);
	__builtin_memcpy(eth->h_source, src, ETH_ALEN);
	eth->h_proto = proto;
	return 1;
}

#endif
