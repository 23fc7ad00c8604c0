// Package vrrp decides which edge node owns each virtual IP: it sits between the
// network segment and the node's interfaces, exchanging VRRP adverts (version 3,
// RFC 5798, for IPv4 and IPv6; version 2, RFC 3768, for keepalived interop) with the
// other edge nodes, and on becoming Master it adds the VIPs to the interface and
// announces them with gratuitous ARP or unsolicited neighbour advertisements.
//
// The package is split by concern so each part is tested on its own:
//   - codec.go: the wire format (encode, decode, checksums, validation, and the
//     closed list of rejection reasons);
//   - fsm.go: the RFC 5798 §6.4 state machine, pure, driven by events and an
//     injected clock;
//   - conn.go, announce.go, addr.go: raw IP protocol 112 sockets, gratuitous ARP /
//     unsolicited NA and conflict watching, VIP add/remove via netlink;
//   - announcer.go, instance.go: the driver that validates received adverts
//     (accept) and runs one goroutine per virtual router, wiring its state
//     machine to the sockets;
//   - config.go, metrics.go: the JSON configuration `portico vrrp -config` reads,
//     and the portico_vrrp_* Prometheus series.
//
// Choices that differ from a literal reading of the RFCs, as keepalived does by
// default: the Master answers with the interface's own MAC address, not the
// virtual router MAC 00:00:5e:00:01:<VRID>; VIPs are host addresses (/32, /128)
// the announcer adds and removes, so Accept_Mode does not apply; version 2
// authentication is not supported (adverts with an auth type are rejected).
//
// Kubernetes is never on this path: VIP ownership is node-local runtime state.
package vrrp
