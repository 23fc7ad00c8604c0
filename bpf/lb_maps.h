/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The maps of xdp_lb. Go creates, pins and fills them; names stay <= 15 characters. */
#ifndef PORTICO_LB_MAPS_H
#define PORTICO_LB_MAPS_H

#include <linux/bpf.h>
#include "bpf_helpers.h"
#include "lb_types.h"

/* (VIP address, port or 0, protocol) -> VIP id. Port-specific entries win. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_MAX_VIP_KEYS);
	__type(key, struct vip_key);
	__type(value, struct vip_val);
} vips SEC(".maps");

/* One Maglev ring, packed: an element holds LB_RING_CHUNK consecutive slots, each
 * a 16-bit backend id (ids stay below LB_MAX_BACKENDS); slot s is entry s % 32 of
 * element s / 32. A new flow reads one random slot, and the smaller the ring the
 * likelier that slot is in cache: packed, the default ring is 8 KB (4-byte ids,
 * which an array map stores in 8 bytes each, took 4 times the room). Go sets
 * max_entries for the ring size and fills a new ring through mmap (one copy
 * instead of a syscall per element). */
struct ring {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, (LB_DEFAULT_RING + LB_RING_CHUNK - 1) / LB_RING_CHUNK);
	__type(key, __u32);
	__type(value, __u16[LB_RING_CHUNK]);
};

/* VIP id -> its ring. Go swaps a whole inner map, so no packet sees half a table. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, LB_MAX_VIPS);
	__type(key, __u32);
	__array(values, struct ring);
} rings SEC(".maps");

/* VIP id -> the ring before the last change (or before the first of a burst of
 * changes), consulted while rings_meta says so: a flow whose choice differs between
 * the two rings started before the change, unless new_pins says otherwise. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, LB_MAX_VIPS);
	__type(key, __u32);
	__array(values, struct ring);
} prev_rings SEC(".maps");

/* VIP id * LB_MID_RINGS + place -> a ring that was current before a change of
 * the VIP's transition, the k-th newest at place (mid_head + k) % LB_MID_RINGS
 * for k < mid_count (rings_meta): a connection opened between two changes lives
 * where that ring sent it. They count while prev_rings does. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, LB_MAX_VIPS * LB_MID_RINGS);
	__type(key, __u32);
	__array(values, struct ring);
} mid_rings SEC(".maps");

/* VIP id -> when its ring last changed (bpf_ktime_get_coarse_ns clock). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LB_MAX_VIPS);
	__type(key, __u32);
	__type(value, __u64);
} ring_changed SEC(".maps");

/* VIP id -> how long prev_rings[id] counts. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LB_MAX_VIPS);
	__type(key, __u32);
	__type(value, struct ring_meta);
} rings_meta SEC(".maps");

/* Backend id -> replica address, MAC and flags. An entry without
 * BACKEND_F_ACTIVE is a gone backend. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LB_MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct backend);
} backends SEC(".maps");

/* Pinned flows: connections older than a ring change whose replica the change
 * moved, pinned to it on their first packet after the change. Only such flows are
 * here: a flow the rings agree on needs no entry. Per-CPU LRU lists
 * (BPF_F_NO_COMMON_LRU) avoid a global lock; entries are shared by all CPUs. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LB_DEFAULT_FLOWS);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__type(key, struct flow_key);
	__type(value, struct flow_val);
} flows SEC(".maps");

/* New connections (SYNs) that arrived in a ring transition, in a slot the change
 * moved: their later packets must not be taken for older flows. The first of them
 * moves the connection to flows. A table of its own, so a SYN flood in a
 * transition can evict only its like (connections in their handshake), never a
 * pinned flow. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LB_NEW_PINS);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__type(key, struct flow_key);
	__type(value, struct flow_val);
} new_pins SEC(".maps");

/* UDP flows this node's stack served (struct udp_seen_val), for its holder's
 * report (agent/held.go): a table of its own, so a flood of spoofed datagrams
 * evicts only its like. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LB_UDP_SEEN);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__type(key, struct flow_key);
	__type(value, struct udp_seen_val);
} udp_seen SEC(".maps");

/* pin_clock[0]: when a flow was last pinned, or a pinned flow last seen (coarse
 * ns). While no pin was touched for LB_PIN_IDLE_SEC, flows is not even looked at. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} pin_clock SEC(".maps");

/* held_clock[0]: when Go last pinned (or kept pinned) a connection another
 * edge's stack holds off the current ring (its holder's report: Go's PinHeld).
 * While it is live, flows is looked at for packets of flows (not for SYNs: a
 * SYN drops a same-tuple pin only while pin_clock is), and a pin's use does not
 * move pin_clock: held connections live for days, and would keep it, and every
 * SYN's look at flows, going for good. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} held_clock SEC(".maps");

/* relay_clock[0]: when this node last made or used a hand-off pin (a flows entry
 * with a hop: where it sent on a connection it did not have). While none was
 * touched for LB_PIN_IDLE_SEC, frames from directors do not look at flows. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} relay_clock SEC(".maps");

/* Per-CPU direct-mapped cache of established flows (see struct flow_cache_entry). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_FLOW_CACHE);
	__type(key, __u32);
	__type(value, struct flow_cache_entry);
} flow_cache SEC(".maps");

/* Node-wide settings, one entry. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_config);
} lb_cfg SEC(".maps");

/* Per-VIP counters, indexed by VIP id. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_MAX_VIPS);
	__type(key, __u32);
	__type(value, struct vip_counters);
} vip_stats SEC(".maps");

/* Per-backend counters, indexed by backend id. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct backend_counters);
} backend_stats SEC(".maps");

/* The other edges' MACs (struct peer_key): a VIP frame from one of them was
 * steered here by a director and is never steered again. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_MAX_PEERS);
	__type(key, struct peer_key);
	__type(value, __u32);
} peers SEC(".maps");

/* The other sites' edges' tunnel addresses (struct site_peer_key). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_MAX_PEERS);
	__type(key, struct site_peer_key);
	__type(value, __u32);
} site_peers SEC(".maps");

/* This node's tunnel end (struct tunnel_cfg), one entry. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tunnel_cfg);
} tunnel SEC(".maps");

/* Per-CPU memo of vips lookups (struct vip_memo), not pinned. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_VIP_MEMO);
	__type(key, __u32);
	__type(value, struct vip_memo);
} vip_memos SEC(".maps");

/* Per-CPU memo of source MACs (struct mac_verdict), not pinned. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_MAC_MEMO);
	__type(key, __u32);
	__type(value, struct mac_verdict);
} src_macs SEC(".maps");

/* A model of this node's socket table, for the data-plane model test only: a
 * flow key present here with LB_SOCK_LIVE is a connection this node's stack has,
 * with LB_SOCK_ENDED one that ended here (TIME_WAIT). has_connection
 * reads it instead of the kernel's sockets only where lb_sock_model is set at
 * load (never by the agent); elsewhere the verifier removes the read, and the
 * map, one entry and unpinned, is never looked at. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, struct flow_key);
	__type(value, __u32);
} sock_model SEC(".maps");

/* A flow's chain: the replicas the rings of its VIP's transition name for it
 * (h: previous, current, mids newest first), each once, with its class: those
 * that serve, then the ones the liveness checks call down (a replica called dead
 * wrongly keeps its connections; one that is dead is asked last, so no
 * survivor's connection is ever sent to it), then another site's edge (a
 * hand-over; as upto says). A chain is walked in the order (class, address),
 * which needs no two edges to hold the same history: see chain_next. */
struct chain {
	__u32 h[LB_CHAIN];   /* in: what each ring holds for the flow, 0 for none */
	__u32 upto;          /* in: the classes it may hold: LB_CLASSES (another
			      * site's edge too), 2 (this site's), 1 (replicas
			      * called serving only: a UDP walk's) */
	__u8 from[8];        /* in: the MAC of the edge that sent the frame on
			      * (zero for a client's): never walked back to */
	__u32 n;             /* out: replicas in id */
	__u32 pick;          /* out (first_held): the index of the replica picked */
	__u32 id[LB_CHAIN];  /* out: the chain's replicas */
	__u32 cls[LB_CHAIN]; /* out: each one's class (0 to LB_CLASSES - 1) */
	__u32 downs;         /* out: down_bit of each replica of class 1 (down) */
};

/* This node's own replica address (one entry, not pinned: Go sets it on every
 * Apply that names a local replica). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct self_addr);
} self_addr SEC(".maps");

/* The other edges of this site whose replicas are backends, by their tags
 * (addr_tag): where a frame marked LB_MARK_DOWNPIN goes on to. Written only
 * where tags are exact (self_addr.tags); not pinned: Go writes it on every
 * Apply. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_MAX_PEERS);
	__type(key, __u32);
	__type(value, struct tag_mac);
} tag_macs SEC(".maps");

/* mac_tags: tag_macs the other way round, each of those edges' tag (addr_tag)
 * by its MAC, for a frame a director sent by its pin, which carries no tag
 * (from_director). Written only where tags are exact; not pinned either. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_MAX_PEERS);
	__type(key, struct peer_key);
	__type(value, __u32);
} mac_tags SEC(".maps");

/* Per-CPU room for one flow's chain (struct chain: too big for the stack), not
 * pinned. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct chain);
} chains SEC(".maps");

/* Packets by the reason for their verdict. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_MAX_REASONS);
	__type(key, enum reason);
	__type(value, __u64);
} reason_stats SEC(".maps");

#endif
