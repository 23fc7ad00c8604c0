// Package liveness decides, within a few hundred milliseconds, which of a
// group's replicas can serve right now; the agent's data-plane sink leaves the
// dead ones out of the Maglev rings it gives every director.
//
// Kubernetes stays the authority on membership: which replicas exist, which
// drain, which are removed. Its view of liveness is slow (a dead node's
// endpoint stays ready until the node lifecycle controller gives up on the node,
// node-monitor-grace-period, ~40–50 s), so every agent — the VRRP owner and the
// backups alike, so that a takeover starts with a correct ring — probes every
// replica of its group itself:
//
//   - What is checked is what serves: an HTTP request to the replica's nginx on
//     its liveness port, on the replica's node address, sent through the edge
//     interface (SO_BINDTODEVICE), so it takes the L2 path and the neighbour
//     entry the steered frames take. A node whose agent crashed while its nginx
//     serves stays live; a stopped or wedged nginx, a cut link or a powered-off
//     node goes out.
//   - Cheap: one kept-alive connection per replica and a ~100-byte request every
//     Interval (25 ms): 40 requests a second per replica per node.
//   - Time-based, not count-based: a replica is dead once it has given no good
//     answer for DeadAfter (150 ms). Slow answers on a loaded node are not
//     failures, and detection is bounded: at most Interval + DeadAfter + Tick
//     (~185 ms) after the last good answer, which leaves the data plane's rings
//     (~30 ms to rebuild) inside the 300 ms budget.
//   - Damped: a dead replica comes back after Rise (5) consecutive good answers;
//     one that dies again within FlapWindow (10 s) of coming back needs twice as
//     many each time (up to 64×), so a flapping replica stays out instead of
//     churning the rings.
//   - Fail-safe: the checker's own failures (out of sockets or file descriptors,
//     a panic, a stalled loop) never take a replica out. A replica the checker
//     cannot probe, or all of them when its loop stalls, fall back to
//     Kubernetes' view, with an error log, portico_liveness_checker_faults_total
//     and portico_liveness_fallback. The agent also never empties a group's ring
//     on the checker's word.
//
// Why not a membership library. hashicorp/memberlist (MetalLB's choice)
// answers a different question — is the peer's agent process alive — so an
// agent crash with nginx still serving would take a healthy replica out, and a
// wedged nginx under a healthy agent would stay in. Its detection is also
// slower by design (see the numbers below): suspicion adds
// SuspicionMult·log10(N)·ProbeInterval before a member is declared dead.
// Directors need exactly one answer per replica, so a direct probe is simpler
// and faster.
//
// Measured (loopback, this project's 2-core machines): see the checker tests'
// logs (stopped nginx out after ~125 ms, hung nginx after ~155 ms, back after
// ~125 ms) and the lab's numbers in test/lab.
package liveness
