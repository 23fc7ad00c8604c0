// Package vrrp decides which edge node owns each virtual IP: it sits between the
// network segment and the node's interfaces, exchanging VRRP adverts (version 3,
// RFC 5798, for IPv4 and IPv6; version 2, RFC 3768, for keepalived interop) with the
// other edge nodes, and on becoming Master it adds the VIPs to the interface and
// announces them with gratuitous ARP or unsolicited neighbour advertisements.
//
// The package is split by concern so each part is tested on its own:
//   - codec.go: the wire format (encode, decode, checksums, validation);
//   - fsm.go: the RFC 5798 §6.4 state machine, pure, driven by events and an
//     injected clock;
//   - conn.go, announce.go, addr.go: raw IP protocol 112 sockets, gratuitous ARP /
//     unsolicited NA, VIP add/remove via netlink;
//   - instance.go, announcer.go: the driver that wires the state machine to the
//     sockets, one goroutine per virtual router.
//
// Kubernetes is never on this path: VIP ownership is node-local runtime state.
package vrrp
