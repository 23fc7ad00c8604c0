/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Every struct and enum that Go also sees. This header is the single source of
 * truth: the Go types are generated from it by bpf2go (-type ...), never copied.
 * Rules: fixed-width fields, explicit padding, no bitfields or unions, addresses as
 * 16 bytes (IPv4 as IPv4-mapped IPv6), ports in network byte order.
 */
#ifndef PORTICO_LB_TYPES_H
#define PORTICO_LB_TYPES_H

#include <linux/types.h>

/* Map sizes and limits Go needs too. */
enum lb_limits {
	LB_MAX_VIPS = 256,       /* VIP addresses: entries of rings and vip_stats */
	LB_MAX_VIP_KEYS = 1024,  /* (address, port, protocol) entries in vips */
	LB_MAX_BACKENDS = 4096,  /* backends (one per VIP address and replica) */
	LB_DEFAULT_FLOWS = 262144,  /* pinned flows (flows) */
	LB_NEW_PINS = 65536,        /* new connections remembered in a ring transition */
	LB_UDP_SEEN = 65536,        /* UDP flows this node's stack served (udp_seen) */
	LB_DEFAULT_RING = 4099,   /* Maglev ring slots (a prime): dataplane.DefaultRingSize */
	LB_RING_CHUNK = 32,       /* ring slots per element of a ring map */
	LB_RING_LAYOUT = 3,       /* lb_config.ring_layout of this version's rings (2: a slot
				   * carries LB_SLOT_MOVED; 3: mid rings in a circle) */
	LB_FLOW_CACHE = 4096,     /* per-CPU flow cache slots (a power of two) */
	LB_MAX_PEERS = 1024,      /* MACs of the other edges in peers */
	LB_MAC_MEMO = 16,         /* per-CPU src_macs slots (a power of two) */
	LB_VIP_MEMO = 64,         /* per-CPU vip_memos slots (a power of two) */
	LB_PIN_IDLE_SEC = 3600,   /* a pinned flow silent this long is forgotten */
	LB_MAX_REASONS = 32,      /* reason_stats slots: room for new reasons, so pinned
				   * maps stay compatible across upgrades */
	LB_SPILL_PROBES = 8,      /* slots a packet from another site tries for one
				   * that is not a spill (never on to a third site) */
	LB_MID_RINGS = 14,        /* rings of a transition kept besides the previous
				   * and the current one (mid_rings): the newest ones */
	LB_CHAIN = 16,            /* replicas a flow's chain can name: one per ring
				   * of the transition (previous, current, mids) */
	LB_SLOT_MOVED = 0x8000,   /* in a slot of the current ring: some ring of the
				   * transition names another replica there (ids
				   * stay below LB_MAX_BACKENDS) */
	LB_MARK_FINAL = 255,      /* a hand-off mark: serve the frame, never send it
				   * on (other marks: the receiver's class in the
				   * flow's chain + 1, and the hand-offs so far << 8) */
	LB_CLASSES = 3,           /* classes of a chain's replicas, in the order a
				   * chain is walked: serving, down, another site's
				   * edge */
	LB_MARK_PROBE = 4,        /* a mark's class an earlier version's director
				   * gave its likeliest guess: the receiver walks
				   * the chain from its start */
	LB_MARK_PINNED = 5,       /* a mark's class for a frame a director steered by
				   * a pin: a receiver without its connection knows
				   * the pin is stale */
	LB_MARK_DOWNPIN = 6,      /* a mark's class for a frame of a flow a director
				   * pinned to a replica called down, sent to the
				   * current ring's replica first: one without its
				   * connection sends it to the pinned one, whose
				   * tag the frame carries (tag_macs) */
	LB_MARK_RESCUE = 7,       /* a mark's class for a frame that reached the end
				   * of its chain at an edge whose verdicts differ
				   * from its director's (the mark's downs): sent to
				   * one replica that director calls down and this
				   * edge does not, served there if its stack has
				   * the connection, never sent on */
	LB_MARK_RESCUE_WAIT = 8,  /* the same, from an edge within LB_SETTLE_MS of a
				   * change: dropped there if its stack does not
				   * have it (TCP sends it again) */
	LB_SOCK_LIVE = 1,         /* sock_model (the model test's sockets): a connection */
	LB_SOCK_ENDED = 2,        /* sock_model: a connection that ended (TIME_WAIT) */
	LB_MAX_HOPS = 8,          /* hand-offs a packet may take in all */
	LB_SETTLE_MS = 500,       /* after a VIP's ring changed, a packet no replica
				   * of its chain has is dropped, not served, this
				   * long: the edges' rings may differ for a moment,
				   * and TCP sends it again */
	LB_PIN_GUESS = 254,       /* flow_val.hop of a director's pin that is a guess
				   * (the first other replica of a flow's chain) */
};

/* self_addr: this node's own replica address, set by Go: where it stands in the
 * order a chain is walked. */
enum self_tags {
	SELF_TAGS = 1,
	SELF_TAGS_SHORT = 2,
};

struct self_addr {
	__u8 addr[16];
	__u32 set;  /* 0 until Go knows it */
	enum self_tags tags; /* SELF_TAGS: the last 16 bits of an address tell apart every
		     * replica and edge this node knows (addr_tag): a walk carries
		     * its director's, and skips it; SELF_TAGS_SHORT: the last 12
		     * do too (an IPv4 UDP walk's tag) */
	__u32 differ; /* this node's liveness verdicts differ from another edge's
		       * (Go: Desired.Differ): its ring may give a replica's slots
		       * to others where theirs do not, and no transition of its
		       * own shows it; every new connection is pinned where it
		       * goes (new_pins), as in a moved slot (pin_new) */
};


/* tag_macs: tag (addr_tag) -> the MAC of the other edge of this site with that
 * tag. */
struct tag_mac {
	__u8 mac[6];
	__u16 pad;
};

/* vips: which (address, port, protocol) the program steers. port 0 = any port. */
struct vip_key {
	__u8 addr[16];
	__be16 port;
	__u8 proto; /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad;
};


struct vip_val {
	__u32 vip_id; /* index into rings and vip_stats, < LB_MAX_VIPS */
	__u32 flags;  /* vip_flags */
};

enum vip_flags {
	VIP_F_CLOSED = 1, /* (address, 0, protocol): the address is a VIP whose
			   * other ports of the protocol are served by nothing:
			   * dropped, not passed to the node's stack (its own
			   * listeners must not answer on a VIP) */
};

enum backend_flags {
	BACKEND_F_ACTIVE = 1,   /* the entry is in use; a cleared entry is a gone backend */
	BACKEND_F_LOCAL = 2,    /* the replica is this node: XDP_PASS */
	BACKEND_F_DRAINING = 4, /* keeps existing flows, not in the ring */
	BACKEND_F_DOWN = 8,     /* liveness says it cannot serve: only TCP flows are kept on it */
	BACKEND_F_REMOTE = 16,  /* an edge of another site (federation): addr is its
				 * tunnel address, mac the next hop's; without SPILL
				 * only ever in a previous ring (Dataplane.Handover) */
	BACKEND_F_SPILL = 32,   /* with REMOTE: where this site spills new connections
				 * above its capacity (Group.Spill), in its ring */
};

/* backends: backend id -> where to send. One backend per (VIP address, replica).
 * An array, so lookups are inlined; id 0 is never used. */
struct backend {
	__u8 addr[16];
	__u8 mac[6];
	__u16 flags;  /* enum backend_flags */
	__u32 vip_id; /* the VIP this backend serves (operator view, recovery) */
	__u32 weight;
};

/* site_peers: the tunnel address of every edge of the other sites (a
 * federation's Remotes), the only sources from_site takes VIP traffic from. */
struct site_peer_key {
	__u8 addr[4];
};

/* tunnel[0]: this node's end of the tunnels between sites (federation). A VIP
 * packet for another site's edge leaves in IPv4 (IPIP for IPv4, proto 41 for
 * IPv6) from src4; an IPIP or proto-41 packet to src4 whose inner packet is VIP
 * traffic is taken out and steered here. src4 zero: no tunnel. */
struct tunnel_cfg {
	__u8 src4[4];
	__u32 pad;
};

/* peers: the MAC of every other edge (replica) of this node's groups. A VIP
 * frame from one of them was steered here by a director already. */
struct peer_key {
	__u8 mac[6];
	__u16 pad;
};

/* vip_memos: a per-CPU, direct-mapped memo of vips lookups (found or not, with
 * the port-0 fallback), valid for one generation. Traffic goes to a few VIPs:
 * this spares one or two hash lookups per packet that misses the flow cache. */
struct vip_memo {
	struct vip_key key;
	__u32 vip_id;
	__u32 generation;
	__u32 found;
	__u32 pad;
};

/* src_macs: a per-CPU, direct-mapped memo of whether a source MAC is a peer's,
 * valid for one generation (Go bumps it when peers change). Client traffic comes
 * from a router's MAC or two: this spares a hash lookup per packet. */
struct mac_verdict {
	__u8 mac[6];
	__u8 peer;
	__u8 pad;
	__u32 generation;
};

/* flows: the 5-tuple as the client sent it. */
struct flow_key {
	__u8 src[16];
	__u8 dst[16];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

struct flow_val {
	__u32 backend_id;
	__u32 hop; /* 0: a director's pin (known: a SYN, a socket of this node);
		    * LB_PIN_GUESS: a director's guess along the flow's chain;
		    * 1-LB_CLASSES: a hand-off pin, the class + 1 of the replica this
		    * node sent on to what it did not have (the mark its frames carry) */
	__u64 last_seen_ns; /* bpf_ktime_get_coarse_ns(): set at creation, refreshed on
			     * the slow path at most once a second and by the fast
			     * path every 64 packets */
};

/* udp_seen: a UDP flow this node's stack served, in the client's direction: when
 * its first and its last packet came (coarse ns; the last refreshed at most once
 * a second). UDP leaves no socket per flow to list (nginx's listeners are
 * unconnected), so this is what a holder's report lists for UDP. */
struct udp_seen_val {
	__u64 first_ns;
	__u64 last_ns;
};

/* rings_meta: per VIP id, the previous ring's lease. prev_rings[id] is consulted
 * while bpf_ktime_get_coarse_ns() < prev_until_ns (Go writes it with the ring).
 * The mid rings are a circle of LB_MID_RINGS places per VIP: the k-th newest
 * (k < mid_count) is at place (mid_head + k) % LB_MID_RINGS, so a change writes
 * one place and this entry, not the whole history (each write of a map of maps
 * waits for an RCU grace period). */
struct ring_meta {
	__u64 prev_until_ns;
	__u32 mid_head;
	__u32 mid_count;
};

enum cache_pin {
	CACHE_UNPINNED = 0, /* the rings' answer: nothing to keep alive */
	CACHE_PINNED = 1,   /* from flows: the fast path keeps the entry alive */
	CACHE_NEW = 2,      /* from new_pins: lives for the transition only */
};

/* flow_cache: a per-CPU, direct-mapped copy of hot flows, indexed by the flow
 * hash, so an established flow costs no hash-map lookup. Valid only while
 * generation equals lb_config.generation; flows stays the authoritative table. */
struct flow_cache_entry {
	struct flow_key key;
	__u32 backend_id;
	__u32 vip_id;
	__u32 generation;
	__u32 hits; /* fast-path packets; every 64th refreshes a pinned flow */
	__u32 pin;  /* enum cache_pin */
	__u32 mark; /* the hand-off mark its frames leave with (a place in the
		     * flow's chain + 1: a director's walk), 0 for none */
};

/* lb_cfg[0]: node-wide settings written by the loader. */
struct lb_config {
	__u32 seed;       /* cluster-wide hash seed: equal on every node */
	__u32 ring_size;  /* slots in every ring (prime) */
	__u32 generation; /* bumped by every change of vips, rings or backends */
	__u8 mac[6];      /* MAC of the NIC the program is attached to */
	__u16 ring_layout; /* LB_RING_LAYOUT once the pinned rings have this layout
			    * (0: the unpacked rings of earlier versions) */
};

struct vip_counters {
	__u64 packets;
	__u64 bytes;
	__u64 new_flows;
	__u64 flow_hits;
};

struct backend_counters {
	__u64 packets;
	__u64 bytes;
};

/* Why the program did what it did; reason_stats is indexed by this. */
enum reason {
	REASON_NOT_IP = 0,       /* not IPv4/IPv6 (ARP, LLDP, ...): pass */
	REASON_NOT_VIP,          /* IP but not a VIP address/port/protocol: pass */
	REASON_MALFORMED,        /* truncated or invalid header: pass, never abort */
	REASON_FRAGMENT,         /* IPv4 fragment or IPv6 fragment header: pass */
	REASON_IP_OPTIONS,       /* IPv4 with options to a VIP: steered as usual */
	REASON_IPV6_EXT,         /* IPv6 extension header before L4: pass */
	REASON_ICMP_STEERED,     /* ICMP error about a VIP flow sent to its backend */
	REASON_ICMP_OTHER,       /* ICMP that is no error about a VIP flow: pass */
	REASON_NO_BACKEND,       /* VIP with an empty ring: pass to the local stack */
	REASON_LOCAL,            /* backend is this node: pass */
	REASON_TX,               /* backend elsewhere: MAC rewrite + XDP_TX */
	REASON_FLOW_REPICK,      /* flow's backend gone: picked again from the ring */
	REASON_OTHER_HOST,       /* VIP frame addressed to another MAC (flooded): pass */
	REASON_FROM_PEER,        /* a director steered it here, and this node's choice
				  * differs (rings in transition): pass, never steer twice */
	REASON_PINNED,           /* a flow older than a ring change, whose replica the
				  * change moved: pinned to it (flows) */
	REASON_NEW_PINNED,       /* a new connection in a slot a ring change moved,
				  * remembered for the transition (new_pins) */
	REASON_HANDOFF,          /* a director sent here a packet of a connection this
				  * node does not have: sent on to the other ring's
				  * choice, marked, once */
	REASON_HANDOFF_IN,       /* a packet handed on by another edge: served here */
	REASON_SITE_OUT,         /* a packet of a connection another site holds (a site
				  * hand-over): sent in a tunnel to that site's edge */
	REASON_SITE_IN,          /* a packet another site sent in a tunnel: taken out
				  * and steered here, never on to a third site */
	REASON_HANDOFF_END,      /* a handed-off packet no later replica of its chain
				  * can have: served here (the stack resets it) */
	REASON_HANDOFF_WAIT,     /* the same within LB_SETTLE_MS of a ring change:
				  * dropped (sent again, it finds settled rings) */
	REASON_VIP_CLOSED,       /* a VIP address on a port (TCP, UDP) it does not
				  * serve: dropped */
	REASON_SITE_STRANGER,    /* VIP traffic in a tunnel to this node's tunnel
				  * address from no other site's edge: dropped */
	REASON_STRANGER_MARK,    /* a hand-off mark on a frame from no peer edge (a
				  * new peer not learned yet, or a stranger): one
				  * more hand-off at most */
	REASON_HANDOFF_RESCUE,   /* a packet no replica above this node has, sent to
				  * one the walk's edges call down and this node
				  * does not (their verdicts differ): served there
				  * if it has it, never sent on */
	REASON_UDP_NEW,          /* a UDP datagram no replica of its chain served
				  * before (a new flow, or its holder is gone): sent
				  * to the current ring's replica, served there */
	REASON_MAX,              /* <= LB_MAX_REASONS */
};

#endif
