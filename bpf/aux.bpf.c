// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Two one-line XDP programs that support xdp_lb without being part of it:
 *  - xdp_pass: attached to the bridge-side peer of a veth so frames that xdp_lb
 *    sends with XDP_TX are delivered (on Linux 6.x a veth only delivers an XDP_TX'd
 *    frame when its peer has an XDP program; GRO on the peer is not enough).
 *  - xdp_tx: the floor for benchmarks, the cheapest program that transmits.
 */
#include <linux/bpf.h>
#include "bpf_helpers.h"

SEC("xdp")
int xdp_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

SEC("xdp")
int xdp_tx(struct xdp_md *ctx)
{
	return XDP_TX;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
