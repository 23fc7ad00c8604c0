// Package liveness decides, within a few hundred milliseconds, which of a
// group's replicas can serve right now; the agent's data-plane sink gives the
// dead ones no new flows (their place in the Maglev rings goes to the others)
// and lets them keep their established flows while their MAC is known: a
// verdict that was wrong, a replica too slow for a moment on a loaded node,
// then breaks no connection (the loaded cluster lab saw such verdicts reset up to
// 40 of 60 held connections when a dead replica's flows were picked again).
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
//     Interval (20 ms): 50 requests a second per replica per node.
//   - Time-based, not count-based: a replica is dead once it has given no good
//     answer for DeadAfter (200 ms). Slow answers on a loaded node are not
//     failures, and detection is bounded: at most Interval + DeadAfter + Tick
//     (~230 ms) after the last good answer, which leaves the data plane's rings
//     (~30 ms to rebuild) inside the 300 ms budget. A stall of the checker's
//     own loop (an agent starved of CPU) is not held against the replicas.
//     150 ms was tried first: in the loaded lab a live nginx now and then left
//     one probe connection unanswered that long.
//   - A reload is not a death: it ends every kept-alive connection, and the
//     connections that queue on the listening socket meanwhile wait for the
//     new workers, which on the loaded lab took 250–400 ms to run — every edge
//     called every replica dead at every reload (every new L4 port). So after
//     a replica ends the probe's connection itself (a close, a reset, or an
//     answer with Connection: close), a new connection its kernel accepts is
//     waited on for ReloadGrace (1 s) from that close, and the verdict is
//     held meanwhile (portico_liveness_reload_holds_total). A refused
//     connection (nothing listens: nginx stopped), a handshake that does not
//     complete (node or link down) and silence on an open connection (a
//     wedged nginx closes nothing) are judged as before.
//   - Damped: a dead replica comes back after Rise (5) consecutive good answers
//     (100 ms);
//     one that dies again within FlapWindow (10 s) of coming back needs twice as
//     many each time (up to 64×), so a flapping replica stays out instead of
//     churning the rings.
//   - Fail-safe: the checker's own failures (out of sockets or file descriptors,
//     a panic, a stalled loop) never take a replica out. A replica the checker
//     cannot probe, or all of them when its loop stalls, fall back to
//     Kubernetes' view, with an error log, portico_liveness_checker_faults_total
//     and portico_liveness_fallback. The agent also never empties a group's ring
//     on the checker's word.
//   - Shared with the replica itself: each agent tells its nginx which
//     replicas it calls down, and the liveness server answers them to every
//     probe ("down <addr>" lines after "live"). A replica that a strict
//     majority of the edges it hears (the ones it calls live) call down calls
//     itself down too, though its own checks find it serving: a network fault
//     that cuts the others' probes leaves its local checks alone, and without
//     this its rings would keep its slots while every other edge gives them
//     away, and connections opened meanwhile would be lost later (their
//     chains differ: bpf/README.md). It learns within about a probe interval
//     of their decision. An edge it cannot hear has no say, and an nginx of an
//     older version answers "live" alone, which calls nobody down.
//
// Why not a membership library. hashicorp/memberlist (MetalLB's choice)
// answers a different question — does the peer's agent process answer UDP
// pings — so an agent crash with nginx still serving would take a healthy
// replica out, and a wedged nginx under a healthy agent would stay in. It is
// also not reliable at this speed. Measured here (memberlist v0.7.0, loopback,
// a member's Shutdown without Leave, 10 trials, 2 loaded cores; detection until
// every survivor saw it, min/median/max):
//
//	defaults (1 s probe, suspicion 4)        N=3: 5.2 / 5.6 / 6.9 s    N=10: 5.4 / 6.3 / 9.2 s
//	50 ms probe, 25 ms timeout, suspicion 1  N=3: 102 / 133 / 172 ms   N=10: 121 / 146 / 254 ms, 27 false deaths
//	50 ms / 25 ms, suspicion 2               N=3: 155 / 174 / 230 ms   N=10: 169 / 187 / 310 ms, 118 false deaths
//	75 ms / 40 ms, suspicion 2               N=3: 225 / 274 / 427 ms   N=10: 243 / 310 / 517 ms
//
// In 20 s idle runs under CPU load, the settings fast enough for 300 ms declared
// 109–302 live members dead in 10-member clusters (cluster-wide flapping), at
// ~40 packets/s and ~1 % of a core per member. Suspicion adds
// SuspicionMult·max(1, log10 N)·ProbeInterval before a death, and memberlist
// stretches its timeouts on a loaded node (awareness), which is right for a
// membership protocol and wrong for a 300 ms budget. A director needs exactly
// one answer per replica, from the nginx that serves, so a direct probe with a
// time-based verdict is both simpler and faster.
//
// Measured for this checker (loopback, the package tests, DeadAfter 150 ms): a
// stopped nginx (connection refused) was out ~125 ms after its last answer, a
// hung one (no answer) after ~155 ms, a recovered one back after ~125 ms. The
// lab's end-to-end numbers come from make bench-lab.
package liveness
