// Package agentstatus is the schema of the status every agent publishes and the
// controllers and `portico status` read: a Lease of its own per node,
// portico-agent-<node>, labelled portico.io/agent=true, renewed every few seconds
// (as kubelets do with node Leases), with the node's State as JSON in the
// annotation portico.io/agent-state. The agent writes it (agent, agent/lease); the
// controller, the federation controller, the GSLB health check and `portico
// status` read it. A leaf: it imports nothing of Portico, so a reader never links
// the data plane.
package agentstatus
