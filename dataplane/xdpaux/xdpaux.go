// Package xdpaux holds the one-line XDP programs that support xdp_lb without
// being part of it (bpf/aux.bpf.c): xdp_pass, which labs attach to the peer of
// an edge node's veth so the frames xdp_lb sends with XDP_TX are delivered, and
// xdp_tx, the floor benchmarks measure xdp_lb against. The agent never loads
// them.
package xdpaux

import (
	"fmt"
	"io"
	"net"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// AttachPass attaches a one-line XDP_PASS program to iface in the calling
// thread's network namespace. A veth delivers frames that xdp_lb sends with
// XDP_TX only when its peer runs an XDP program (GRO on the peer is not enough), so labs attach this to
// the bridge-side end of an edge node's veth. Closing the result detaches it.
func AttachPass(iface string) (io.Closer, error) {
	ifc, err := net.InterfaceByName(iface)
	if err != nil {
		return nil, fmt.Errorf("find interface %s: %w", iface, err)
	}
	var objs auxObjects
	if err := loadAuxObjects(&objs, nil); err != nil {
		return nil, fmt.Errorf("load xdp_pass: %w", err)
	}
	defer objs.Close() // the link keeps the program alive
	l, err := link.AttachXDP(link.XDPOptions{Program: objs.XdpPass, Interface: ifc.Index})
	if err != nil {
		return nil, fmt.Errorf("attach xdp_pass to %s: %w", iface, err)
	}
	return l, nil
}

// LoadTX loads xdp_tx, the cheapest program that transmits. The caller closes it.
func LoadTX() (*ebpf.Program, error) {
	spec, err := loadAux()
	if err != nil {
		return nil, err
	}
	var objs struct {
		XdpTx *ebpf.Program `ebpf:"xdp_tx"`
	}
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return nil, fmt.Errorf("load xdp_tx: %w", err)
	}
	return objs.XdpTx, nil
}
