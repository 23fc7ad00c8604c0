// Package agent is the node end of Portico's flow: it takes the control plane's
// snapshots on one edge node and turns them into that node's state (the XDP maps,
// nginx, VRRP ownership of the group's VIPs, and the host settings direct server
// return needs), and reports the node back: health as VRRP priority and /readyz,
// and its view of every VIP in a status Lease that `portico status` reads.
//
// cmd/portico parses the flags into a Config and calls Run. The agent wires
// controlplane, dataplane, nginx and vrrp; none of them imports it.
package agent
