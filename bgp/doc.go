// Package bgp announces the node's VIPs to upstream routers: it sits at the end of
// the agent's flow in --announce=bgp mode, where every edge node announces its
// group's VIPs as /32 and /128 routes over BGP, the routers spread flows over all
// edges by ECMP, and BFD takes a dead edge out within a fraction of a second.
//
// The speaker is GoBGP (github.com/osrg/gobgp/v4) embedded as a library, with its
// native BFD (RFC 5880/5881) and graceful restart; this package only turns
// Portico's configuration into GoBGP's, keeps the announced paths equal to the
// desired state (Announce), and reports sessions through logs, metrics and
// Status:
//   - config.go: Config, Peer, BFD, their defaults and validation;
//   - paths.go: the desired-versus-announced diff and the path attributes of
//     each Preference (pure, tested without sessions);
//   - speaker.go: the embedded server, its start and stop;
//   - peers.go: the peers' GoBGP configuration and the session event watch;
//   - bfd.go: each peer's BFD session, started once its BGP session is up;
//   - reconfigure.go: Reconfigure, changing the peers of a running speaker
//     (the agent's BGPPeer objects), touching only the sessions concerned;
//   - announce.go: Announce, keeping GoBGP's paths equal to the desired set;
//   - status.go: Status, the sessions and announced prefixes for portico status;
//   - metrics.go: the portico_bgp_* Prometheus series.
//
// Paths are shared by every session (GoBGP applies per-neighbour export policy
// only to route-server clients), so what varies by peer in the configuration and
// ends up in a path (communities, local preference) is combined: the union of the
// communities, the one local preference of the iBGP peers.
package bgp
