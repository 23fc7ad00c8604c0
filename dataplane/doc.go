// Package dataplane is the node-local end of Portico's L4 path: it loads the xdp_lb
// program, pins its maps under /sys/fs/bpf/portico, attaches it to the edge NIC and
// reconciles a plain-data description of VIPs and replicas (Desired) into those
// maps, with Maglev rings that are byte-identical on every node.
//
// The C side lives in bpf/; bpf2go generates the Go mirror of its types (lb_bpfel.go)
// and the object files embedded here. Nothing in this package imports client-go, the
// VRRP announcer or nginx.
package dataplane
