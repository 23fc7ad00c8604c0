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
#include "common.h"
#include "ring.h"
#include "conn.h"
#include "site.h"
#include "walk.h"

/* Keep the enums Go needs in BTF for bpf2go. */
const enum lb_limits *unused_limits __attribute__((unused));
const enum backend_flags *unused_backend_flags __attribute__((unused));
const enum vip_flags *unused_vip_flags __attribute__((unused));
const enum cache_pin *unused_cache_pin __attribute__((unused));

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
	int rc, pins, mv = 0, guess = 0, tunneled = 0, sp = PIN_HOLDS, udp = 0;
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
		if ((th && !p.syn && marked(th)) || (!th && !p.icmp_error && udp_stranger_mark(data, data_end)))
			return from_director(ctx, eth, data_end, &p, cfg, 1);
	}
	/* Fast path: this CPU saw the flow since the maps last changed. A SYN opens
	 * a new connection: it always follows the ring, never an old entry of the
	 * same 5-tuple (a reused port), so every director agrees where it goes; it
	 * does not even read the cache (a random, likely cold, line) unless an old
	 * entry could answer otherwise (see below). */
	slot = cache_slot(&p.flow);
	ce = p.syn ? 0 : bpf_map_lookup_elem(&flow_cache, &slot);
	/* A pinned entry counts only while pins do (a director's, or a holder's
	 * report: held_clock): a SYN that reuses its 5-tuple after they lapsed
	 * did not retire it. */
	if (ce && ce->generation == cfg->generation && flow_key_eq(&ce->key, &p.flow) &&
	    (ce->pin == CACHE_UNPINNED || pins_live(&now) || held_live(&now))) {
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
		 * older flow's; so it is in every slot while this node's verdicts
		 * differ from another edge's (pin_new): its ring may name a replica
		 * theirs do not, and after its verdict changes back its chain and
		 * theirs may not meet there. An old pin of a reused 5-tuple is dropped, with this
		 * CPU's cache entry of it: only a pin makes an entry differ from the
		 * rings, so without pins neither is looked at. */
		if (pins) {
			bpf_map_delete_elem(&flows, &p.flow);
			ce = bpf_map_lookup_elem(&flow_cache, &slot);
			if (ce && ce->generation == cfg->generation && flow_key_eq(&ce->key, &p.flow))
				ce->generation = 0;
		}
		if (mv || pin_new())
			write = CACHE_NEW; /* a SYN is never cached: pin stays unused */
	} else {
		/* A packet of a flow: remembered as new in the transition, pinned, or
		 * found along its chain (older than a change), or the current ring's. */
		fv = mv || pin_new() ? bpf_map_lookup_elem(&new_pins, &p.flow) : 0;
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
		} else if ((fv = pins || held_live(&now) ? bpf_map_lookup_elem(&flows, &p.flow) : 0) &&
			   (be = active_backend(fv->backend_id)) && !(mv && fv->hop) &&
			   !(mv && (be->flags & BACKEND_F_DOWN) && p.flow.proto == IPPROTO_TCP && in_history(ch, fv->backend_id)) &&
			   !(sp = stale_pin(ctx, eth, &p, be))) {
			/* A pin counts, but for a guess (or where this node handed
			 * the flow on) while the flow's chain is known: the chain is
			 * walked again, from its start (a replica along it takes a
			 * frame from a director for one whose earlier ones were
			 * asked, and one called down since is asked last). So is
			 * a pin to a replica called down that the chain names: the
			 * pin may be stale, made for an ended connection on the same
			 * 5-tuple, its replica dead, and the walk asks the serving
			 * replicas first and the pinned one in its turn. A UDP
			 * flow's pin holds whatever its replica is called: only
			 * its holder's report makes one, and a UDP walk asks
			 * none called down (udp_walk). */
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
				pin_used(now);
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
			} else if (mv && ch && (p.flow.proto == IPPROTO_TCP || (udp = p.flow.proto == IPPROTO_UDP && !tunneled && !p.icmp_error))) {
				/* Along its chain: this node's stack settles its own
				 * replica; the first other one is asked (its node
				 * hands on what it does not have, from_director). A
				 * site's edge comes last, never for what a site sent,
				 * nor for UDP (udp_walk). */
				__u32 found;

				ch->upto = udp ? 1 : tunneled ? 2 : LB_CLASSES;
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
					fmark = LB_MARK_TAG | ch->downs << 12 | 1 << 8 | (ch->cls[ch->pick & (LB_CHAIN - 1)] + 1);
				if (fb && found != cur) {
					bid = found;
					pin = CACHE_PINNED;
					write = CACHE_PINNED;
					guess = !(fb->flags & BACKEND_F_LOCAL);
				}
				/* A walked UDP flow is walked at every datagram while
				 * the transition lasts (nothing tells where its walk
				 * ends): neither pinned nor cached. One that is not
				 * (no other replica of its chain to ask, or this
				 * node's stack served it) is pinned where it goes, as
				 * a new connection is: a chain that names others later
				 * (a replica back) must not walk it away. */
				if (udp && fmark) {
					write = CACHE_UNPINNED;
					ce = 0;
				} else if (udp) {
					pin = CACHE_PINNED;
					write = CACHE_PINNED;
				}
			} else if (be && pbid != bid && !(be->flags & (BACKEND_F_REMOTE | BACKEND_F_DOWN))) {
				/* A UDP datagram that is not walked (another site
				 * sent it, or it is an ICMP error): in a moved slot it
				 * is taken for an older flow's, if its replica serves
				 * (never another site's: only TCP is handed over). */
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
	if (be->flags & BACKEND_F_LOCAL) {
		saw_udp(&p, &now);
		return serve_here(data, data_end, &p);
	}
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
	} else if (!th && p.flow.proto == IPPROTO_UDP && !p.icmp_error && !tunneled) {
		/* Every UDP frame to another edge says whether it is walked
		 * (a client's flow label or reserved flag is no mark), with
		 * this node's tag where tags of its width are on (udp_tags). */
		int tagged = udp && (fmark & LB_MARK_TAG) && udp_tags(eth->h_proto == bpf_htons(ETH_P_IP));

		put_udp_mark(data, data_end, udp && fmark ? 1 | (tagged ? UDP_MARK_TAGGED : 0) : 0, tagged ? ftag : 0);
	}
	return count(REASON_TX, XDP_TX);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
