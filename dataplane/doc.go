// Package dataplane is the node-local end of Portico's L4 path: it loads the xdp_lb
// program, pins its maps under /sys/fs/bpf/portico, attaches it to the edge NIC and
// reconciles a plain-data description of VIPs and replicas (Desired) into those
// maps, with Maglev rings that are byte-identical on every node.
//
// The C side lives in bpf/; bpf2go generates the Go mirror of its types (lb_bpfel.go)
// and the object files embedded here. Nothing in this package imports client-go, the
// VRRP announcer or nginx.
//
// # State only around ring changes
//
// Every director (the VIP owner; in BPF mode every edge) builds the same Maglev ring
// from the same replicas, so a flow needs no per-flow state while its ring choice
// does not change: xdp_lb keeps none. A new connection costs what an established
// packet that misses the flow cache does (a VIP lookup, memoized per CPU; the flow
// hash; one ring slot), and a flood of spoofed SYNs writes nothing that another
// flow depends on. The ring is packed (16-bit backend ids) and small (4099 slots
// by default, 8 KB), so the slot a new flow reads is likely in cache; in the steady
// state no packet reads the clock (Expire clears ended transitions).
//
// State appears only around a change of a VIP's ring (a replica added, draining,
// down or removed). Apply keeps the ring it replaces as the previous ring
// (prev_rings), which counts for a transition (Options.Transition, default 2 min)
// after the change; a burst of changes is one transition whose previous ring is the
// one from before its first change. During it, where the two rings agree nothing is
// kept; where they differ:
//
//   - A non-SYN packet (or UDP datagram) of a flow that has no entry started before
//     the change: it goes to the previous ring's replica, if that replica still
//     exists (ready or draining), and is pinned there (flows, an LRU table) for good.
//   - A SYN opens a connection after the change: it follows the current ring and is
//     remembered (new_pins, a table of its own), or its next packets would be taken
//     for an older flow's; its next packet, which a spoofed SYN never sends, pins it
//     in flows.
//   - An ICMP error follows the same rules and writes nothing.
//
// Every director holds the same two rings, so a director that never saw a flow (a
// new VIP owner after a failover) makes the same choice for flows older than the
// change, including the ones on a draining replica, which a per-node flow table
// could not. A connection opened during the transition in a moved slot is known only
// to the director that saw its SYN; a new owner sends it to the previous ring's
// replica, whose xdp_lb finds no socket for it (bpf_skc_lookup_tcp) and hands it
// on, once and marked (the IPv4 reserved flag bit), to the other ring's choice;
// IPv6 has no spare bit and is not handed off. Limits, by design:
// a connection older than the change that sends nothing during the transition goes
// where the current ring says afterwards (nginx's idle limits, 60-75 s, close such
// connections anyway); a UDP flow has no SYN, so a new UDP flow in a moved slot is
// taken for an older one and goes to the previous replica, draining or not, until
// the transition ends; spoofed non-SYN packets in moved slots during a transition
// create pins (bounded by the LRU, as any per-flow table is).
//
// The per-CPU flow cache (flow_cache) answers repeated packets of a flow without
// any of this; a SYN is never cached (its next packet fills the entry), so a SYN
// flood evicts nothing from it. VIP lookups and the peer check are memoized per CPU
// too (vip_memos, src_macs). Pinned flows are only looked at while some pin was
// made or used within LB_PIN_IDLE_SEC (pin_clock), so in the steady state a packet
// that misses the cache costs no hash-table lookup at all. bpf/README.md has the
// measurements.
package dataplane
