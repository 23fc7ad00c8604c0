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
// one from before its first change, and the rings replaced in between are kept too
// (mid_rings, up to 14, none twice). The current ring marks the slots where the
// transition's rings differ (LB_SLOT_MOVED); elsewhere nothing changes. In a moved
// slot:
//
//   - A SYN follows the current ring and is remembered (new_pins) until its next
//     packet, which a spoofed SYN never sends, pins it in flows.
//   - A packet of a flow nobody pinned goes along the flow's chain: the replicas
//     the transition's rings name for it, walked in one order every edge shares
//     (those that serve, then those called down, each by address). A director
//     asks its own stack (bpf_skc_lookup_tcp), else sends it to the first other
//     replica in that order; a node that does not have the connection hands it
//     on to the first replica above itself in that order, marked with that one's
//     class (in the TCP header: reserved bits and the urgent pointer, IPv4 and
//     IPv6 alike), and pins where it sent it. Each hop goes up the order, so a
//     packet never circles whatever rings each edge holds, and the mark counts
//     hand-offs: at most 8. The frame carries its director's tag (the last 16
//     bits of its address, in the IPv4 identification or the IPv6 flow label),
//     and no edge walks it back to the director or to the edge it came from: no
//     edge sends one packet on twice.
//   - A UDP datagram goes to the previous ring's replica while it serves; an ICMP
//     error follows the same rules and writes nothing.
//
// Every edge holds the same rings, so a director that never saw a flow (a new VIP
// owner, another ECMP edge) finds connections opened at any moment of the
// transition, which a per-director flow table could not. bpf/README.md has the
// reasoning, the measurements and the limits (a burst of more changes than the
// history holds; UDP; an edge that has not applied a change yet). A flow silent
// through a whole transition is carried afterwards by its holder's report
// (OffRing there, PinHeld on every edge: the agents' held reports).
//
// The per-CPU flow cache (flow_cache) answers repeated packets of a flow without
// any of this; a SYN is never cached (its next packet fills the entry), so a SYN
// flood evicts nothing from it. VIP lookups and the peer check are memoized per CPU
// too (vip_memos, src_macs). Pinned flows are only looked at while some pin was
// made or used within LB_PIN_IDLE_SEC (pin_clock), or a held connection pinned
// (held_clock; not for SYNs), so in the steady state a packet that misses the
// cache costs no hash-table lookup at all. bpf/README.md has the
// measurements.
package dataplane
