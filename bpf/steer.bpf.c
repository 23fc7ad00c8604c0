// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * sk_steer: the sk_lookup program that gives every TCP connection to an L4
 * Service's VIP and port to one of nginx's few fixed stream listeners, so that
 * a new, changed or removed L4 Service is a map update, never a new listen
 * socket and an nginx reload (whose old workers would have to drain); and
 * every connection to a Gateway's listener on a port nginx does not listen on
 * to nginx's HTTP or HTTPS listener, likewise.
 *
 * The agent attaches it to the network namespace nginx listens in, keeps
 * steer_routes (VIP:port -> listener class) equal to the L4 Services that have
 * endpoints, and puts nginx's listening sockets in steer_socks. The accepted
 * socket keeps the client's destination as its local address, so nginx's
 * $server_addr and $server_port name the Service's VIP and port.
 *
 * Anything else is left to the kernel's own lookup (SK_PASS), except a
 * connection straight to a stream listener's port: those are reachable only
 * through a route, never on the node's own addresses (the HTTP and HTTPS
 * listeners are nginx's own, on every address).
 */
#include <linux/bpf.h>
#include <linux/in.h>
#include "bpf_helpers.h"
#include "steer_types.h"

/* Address families (linux/socket.h is not for BPF targets). */
#define STEER_AF_INET 2
#define STEER_AF_INET6 10

/* VIP:port of an L4 Service with endpoints -> its listener class. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, STEER_MAX_ROUTES);
	__type(key, struct steer_key);
	__type(value, enum steer_class);
} steer_routes SEC(".maps");

/* nginx's listening sockets, at steer_slot(class, family). */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKMAP);
	__uint(max_entries, STEER_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} steer_socks SEC(".maps");

/* The listeners' ports (steer_cfg.ports[class]), refused when asked directly. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct steer_cfg);
} steer_config SEC(".maps");

/* Counters by steer_reason. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STEER_REASONS);
	__type(key, __u32);
	__type(value, __u64);
} steer_stats SEC(".maps");

/* For bpf2go's -type: Go sees the reasons too. */
const enum steer_reason *steer_unused_reason __attribute__((unused));

static __always_inline void count(__u32 reason)
{
	__u64 *n = bpf_map_lookup_elem(&steer_stats, &reason);

	if (n)
		*n += 1;
}

SEC("sk_lookup")
int sk_steer(struct bpf_sk_lookup *ctx)
{
	struct steer_key key = {};
	__u32 zero = 0, slot, c;
	struct steer_cfg *cfg;
	struct bpf_sock *sk;
	enum steer_class *class;
	long err;

	if (ctx->protocol != IPPROTO_TCP)
		return SK_PASS;
	key.port = (__u16)ctx->local_port;
	key.proto = IPPROTO_TCP;
	if (ctx->family == STEER_AF_INET) {
		key.addr[10] = 0xff;
		key.addr[11] = 0xff;
		__builtin_memcpy(&key.addr[12], &ctx->local_ip4, 4);
	} else if (ctx->family == STEER_AF_INET6) {
		__builtin_memcpy(&key.addr[0], &ctx->local_ip6[0], 4);
		__builtin_memcpy(&key.addr[4], &ctx->local_ip6[1], 4);
		__builtin_memcpy(&key.addr[8], &ctx->local_ip6[2], 4);
		__builtin_memcpy(&key.addr[12], &ctx->local_ip6[3], 4);
	} else {
		return SK_PASS;
	}
	class = bpf_map_lookup_elem(&steer_routes, &key);
	if (!class) {
		cfg = bpf_map_lookup_elem(&steer_config, &zero);
		if (!cfg)
			return SK_PASS;
		for (c = 0; c < STEER_FIXED; c++) {
			if (cfg->ports[c] && cfg->ports[c] == key.port) {
				count(STEER_DIRECT);
				return SK_DROP;
			}
		}
		return SK_PASS;
	}
	if (*class >= STEER_CLASSES) {
		count(STEER_NO_LISTENER);
		return SK_PASS;
	}
	slot = *class * 2 + (ctx->family == STEER_AF_INET6);
	sk = bpf_map_lookup_elem(&steer_socks, &slot);
	if (!sk) {
		/* nginx's listener is not (yet, or no longer) known: the kernel's own
		 * lookup finds nothing on VIP:port and answers with a reset. */
		count(STEER_NO_LISTENER);
		return SK_PASS;
	}
	err = bpf_sk_assign(ctx, sk, 0);
	bpf_sk_release(sk);
	count(err ? STEER_ASSIGN_FAILED : STEER_STEERED);
	return SK_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
