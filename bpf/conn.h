/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Which connections exist: the flows table of pinned flows, and the stack's
 * own sockets (has_connection), read from the running kernel's tcp_sock
 * (CO-RE), or from a model of them in the data-plane model test.
 */
#ifndef PORTICO_CONN_H
#define PORTICO_CONN_H

/* Set at load by the data-plane model test only (dataplane's Options.sockModel):
 * has_connection then reads the sock_model map, a model of the node's sockets,
 * so several simulated nodes share one kernel. The agent never sets it, and the
 * verifier drops the branch. */
volatile const __u32 lb_sock_model = 0;

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
	pin_used(now);
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

#endif /* PORTICO_CONN_H */
