// Package gslb is the DNS variant of a federation (issue 13): each site runs an
// authoritative DNS server for the federated names that answers with the site a
// client should use, judged on the same health every site publishes of itself.
//
// A client goes to the first healthy site whose subnets hold its address (or the
// EDNS client subnet its resolver sends), else to the first healthy site in the
// configured order. An answer is never empty: with no site healthy it names them all.
// Answers carry a short TTL (5 s), so failover through caching resolvers takes the
// detection time (FailAfter probe rounds) plus the TTL.
//
// Health: every server serves GET /health, its own site's Report (healthy as its own
// cluster judges it, and which peers it reached in its last round), and probes every
// peer's. A reached peer is judged by what it says of itself. A peer that cannot be
// reached counts as down only when another peer, reached in the same round, cannot
// reach it either: a partition between two sites alone sends nobody elsewhere
// (k8gb's documented weakness), while a dead site is confirmed by the others. With
// two sites there is no third to ask and an unreachable peer counts as down.
//
// Like the rest of the federation it is fail-static: no host cluster is asked.
package gslb
