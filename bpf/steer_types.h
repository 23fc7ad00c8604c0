/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The structs and enums of steer.bpf.c that Go also sees (package
 * dataplane/steer generates its types from them with bpf2go).
 */
#ifndef PORTICO_STEER_TYPES_H
#define PORTICO_STEER_TYPES_H

#include <linux/types.h>

enum steer_limits {
	STEER_MAX_ROUTES = 4096, /* VIP:port routes (L4 Service ports, Gateway listeners) */
	STEER_CLASSES = 4,       /* listener classes: steer_class */
	STEER_FIXED = 2,         /* the first classes, whose ports nobody asks directly */
	STEER_SLOTS = 8,         /* steer_socks: a listener per class and family */
};

/* What nginx does with a connection it accepts, by listener. */
enum steer_class {
	STEER_PLAIN = 0, /* proxies the bytes */
	STEER_PROXY = 1, /* sends a PROXY protocol header first */
	STEER_HTTP = 2,  /* serves HTTP: its HTTP listener (a Gateway's listener on another port) */
	STEER_HTTPS = 3, /* serves HTTPS: its HTTPS listener */
};

/* steer_stats slots. */
enum steer_reason {
	STEER_STEERED = 0,       /* given to nginx's listener */
	STEER_NO_LISTENER = 1,   /* a route without a known listener: the kernel's lookup */
	STEER_ASSIGN_FAILED = 2, /* bpf_sk_assign refused the listener */
	STEER_DIRECT = 3,        /* a connection straight to a listener's port: dropped */
	STEER_REASONS = 4,
};

/* A route: a VIP (IPv4 as IPv4-mapped IPv6) and port in host byte order. */
struct steer_key {
	__u8 addr[16];
	__u16 port;
	__u8 proto;
	__u8 pad;
};

/* The listeners' ports, by class, in host byte order (0: none); those of the
 * STEER_FIXED first classes are refused when asked directly. */
struct steer_cfg {
	__u16 ports[STEER_CLASSES];
};

#endif
