package main

// registerAll registers every subcommand. Each subcommand's file adds one line here.
func registerAll() {
	register("agent", "run the edge agent: control plane, XDP data plane, VRRP and nginx for one group", runAgent)
	register("controller", "run the control plane that makes the cluster-wide writes (allocations, statuses, Events, IngressClaims), off the edges; takes the agent's flags", runController)
	register("status", "each VIP's owner, replicas, ring shares and every node's table digest (reads the agents' Leases)", runStatus)
	register("vips", "show VIPs, their backends and ring shares from the pinned maps", runVIPs)
	register("flows", "show flow table entries from the pinned maps", runFlows)
	register("trace", "show where this node's maps send one flow: its slot in every ring of a transition, and its pins", runTrace)
	register("counters", "show xdp_lb's verdict counters by reason", runCounters)
	register("maglev", "build a Maglev table for given replicas and print shares and digest", runMaglev)
	register("bench", "benchmarks: 'bench xdp' measures xdp_lb's per-packet cost", runBench)
	register("uninstall", "undo what agents did to this node: detach xdp_lb, remove its pinned maps, the VIPs on lo, restore the sysctls (an agent does it when its DaemonSet is deleted)", runUninstall)
	register("federation", "run the FederatedIngress controller in a host cluster (propagate, aggregate status), or with dns a site's DNS server", runFederation)
	register("vrrp", "run the VRRP announcer alone (VIP failover, keepalived-compatible)", runVRRP)
	register("version", "print which Portico this is: the release (git tag), commit and Go it was built from", runVersion)
}
