package cluster

import (
	"net"
	"net/netip"

	"github.com/portico-edge/portico/test/netlab"
)

// The lab's addresses. They live only inside the run's own namespaces, so parallel
// runs do not collide.
var (
	// APIAddr is the API server's address: the bridge's, in the switch namespace.
	APIAddr = netip.MustParseAddr("10.251.0.1")
	// ClientAddr is the client namespace's address on the bridge.
	ClientAddr = netip.MustParseAddr("10.251.0.100")
	// ClientAddr6 is the client's IPv6 address on the bridge (Prefix6).
	ClientAddr6 = netip.MustParseAddr("fd00:251::100")
	// Prefix6 is the bridge's IPv6 subnet: the client and every node have an
	// address on it, so IPv6 VIPs of the segment are reached on-link.
	Prefix6 = netip.MustParsePrefix("fd00:251::/64")
	// ServiceCIDR is the Service cluster-IP range; kube-proxy on each node makes
	// cluster IPs reachable from the node and its pods.
	ServiceCIDR = netip.MustParsePrefix("10.0.0.0/24")
	// PodRange holds every node's PodCIDR (kube-proxy's clusterCIDR).
	PodRange = netip.MustParsePrefix("10.252.0.0/16")
)

const (
	bridgeBits = 24
	apiPort    = 6443
)

// NodeAddr is the address of node i (1-based) on the bridge: 10.251.0.(10+i).
func NodeAddr(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 251, 0, byte(10 + i)}) }

// NodeAddr6 is node i's IPv6 address on the bridge: fd00:251::(10+i).
func NodeAddr6(i int) netip.Addr {
	a := Prefix6.Addr().As16()
	a[15] = byte(10 + i)
	return netip.AddrFrom16(a)
}

// addAddr6 gives a namespace's eth0 an IPv6 address of Prefix6 (no DAD: the lab
// knows its addresses unique, and a tentative address would delay the first
// connections).
func addAddr6(ns string, a netip.Addr) error {
	return netlab.IP("-n", ns, "addr", "add", netip.PrefixFrom(a, Prefix6.Bits()).String(), "dev", "eth0", "nodad")
}

// PodCIDR is the range node i (1-based) gives its pods (bridge CNI, host-local IPAM):
// 10.252.i.0/24. Every namespace of the lab routes it to the node.
func PodCIDR(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 252, byte(i), 0}), 24)
}

// mac returns the lab's MAC address number b (locally administered).
func mac(b byte) net.HardwareAddr { return net.HardwareAddr{0x02, 0x70, 0x63, 0, 0, b} }

// routePods routes each node's pod range to the node, in the switch, the client and
// the other nodes, so pods are reachable from every namespace of the lab; and the
// Service range out of each node's eth0, as a node's default route would (the
// nodes have none): kube-proxy rewrites a packet to a cluster IP in OUTPUT, after
// the route lookup, which must find one.
func (c *Cluster) routePods() error {
	for _, n := range c.Nodes {
		if err := netlab.IP("-n", n.Net.NS, "route", "add", ServiceCIDR.String(), "dev", "eth0"); err != nil {
			return err
		}
	}
	for _, n := range c.Nodes {
		via := n.IP.String()
		nss := []string{c.Net.Switch, c.Client.NS}
		for _, m := range c.Nodes {
			if m != n {
				nss = append(nss, m.Net.NS)
			}
		}
		for _, ns := range nss {
			if err := netlab.IP("-n", ns, "route", "add", n.PodCIDR.String(), "via", via); err != nil {
				return err
			}
		}
	}
	return nil
}
