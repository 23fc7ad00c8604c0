package vrrp

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"golang.org/x/net/ipv6"
)

// Kinds of announcement, the label of the gratuitous-ARP counter.
const (
	kindARPRequest = "arp_request"
	kindARPReply   = "arp_reply"
	kindNA         = "na"
)

var allNodes = netip.MustParseAddr("ff02::1")

// arpAnnouncer sends gratuitous ARP for IPv4 VIPs and watches ARP traffic for
// someone else claiming them.
type arpAnnouncer struct {
	c   *arp.Client
	mac net.HardwareAddr
}

func dialARP(ifi *net.Interface) (*arpAnnouncer, error) {
	c, err := arp.Dial(ifi)
	if err != nil {
		return nil, fmt.Errorf("open arp socket on %s: %w", ifi.Name, err)
	}
	return &arpAnnouncer{c: c, mac: ifi.HardwareAddr}, nil
}

// announce broadcasts vip → our MAC in both forms: an ARP request for the VIP
// from the VIP (RFC 5227 announcement) and an unsolicited ARP reply, since hosts
// differ in which one updates their cache. count is called once per packet sent.
func (a *arpAnnouncer) announce(vip netip.Addr, count func(kind string)) error {
	zero := make(net.HardwareAddr, len(a.mac))
	req, err := arp.NewPacket(arp.OperationRequest, a.mac, vip, zero, vip)
	if err != nil {
		return fmt.Errorf("build gratuitous arp request for %v: %w", vip, err)
	}
	if err := a.c.WriteTo(req, ethernet.Broadcast); err != nil {
		return fmt.Errorf("send gratuitous arp request for %v: %w", vip, err)
	}
	count(kindARPRequest)
	rep, err := arp.NewPacket(arp.OperationReply, a.mac, vip, ethernet.Broadcast, vip)
	if err != nil {
		return fmt.Errorf("build gratuitous arp reply for %v: %w", vip, err)
	}
	if err := a.c.WriteTo(rep, ethernet.Broadcast); err != nil {
		return fmt.Errorf("send gratuitous arp reply for %v: %w", vip, err)
	}
	count(kindARPReply)
	return nil
}

// claim is a packet in which another station says it owns an address.
type claim struct {
	vip netip.Addr
	mac net.HardwareAddr
}

// readClaim waits until deadline for one ARP packet and reports it as a claim if
// its sender is a foreign MAC (a reply, or a gratuitous request).
func (a *arpAnnouncer) readClaim(deadline time.Time) (claim, bool, error) {
	if err := a.c.SetReadDeadline(deadline); err != nil {
		return claim{}, false, err
	}
	p, _, err := a.c.Read()
	if err != nil {
		return claim{}, false, err
	}
	if bytes.Equal(p.SenderHardwareAddr, a.mac) {
		return claim{}, false, nil
	}
	gratuitous := p.Operation == arp.OperationRequest && p.SenderIP == p.TargetIP
	if p.Operation != arp.OperationReply && !gratuitous {
		return claim{}, false, nil
	}
	return claim{vip: p.SenderIP.Unmap(), mac: p.SenderHardwareAddr}, true, nil
}

func (a *arpAnnouncer) close() error { return a.c.Close() }

// ndpAnnouncer sends unsolicited neighbour advertisements for IPv6 VIPs and
// watches advertisements from others for them.
type ndpAnnouncer struct {
	c   *ndp.Conn
	mac net.HardwareAddr
}

func dialNDP(ifi *net.Interface) (*ndpAnnouncer, error) {
	c, _, err := ndp.Listen(ifi, ndp.LinkLocal)
	if err != nil {
		return nil, fmt.Errorf("open ndp socket on %s: %w", ifi.Name, err)
	}
	var f ipv6.ICMPFilter
	f.SetAll(true)
	f.Accept(ipv6.ICMPTypeNeighborAdvertisement)
	if err := c.SetICMPFilter(&f); err != nil {
		c.Close()
		return nil, fmt.Errorf("filter ndp socket on %s: %w", ifi.Name, err)
	}
	return &ndpAnnouncer{c: c, mac: ifi.HardwareAddr}, nil
}

// announce sends an unsolicited, overriding neighbour advertisement for vip to
// all nodes (RFC 4861 §7.2.6).
func (n *ndpAnnouncer) announce(vip netip.Addr, count func(kind string)) error {
	na := &ndp.NeighborAdvertisement{
		Override:      true,
		TargetAddress: vip,
		Options:       []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: n.mac}},
	}
	if err := n.c.WriteTo(na, nil, allNodes); err != nil {
		return fmt.Errorf("send neighbour advertisement for %v: %w", vip, err)
	}
	count(kindNA)
	return nil
}

// readClaim waits until deadline for one neighbour advertisement and reports it
// as a claim if it names a foreign link-layer address.
func (n *ndpAnnouncer) readClaim(deadline time.Time) (claim, bool, error) {
	if err := n.c.SetReadDeadline(deadline); err != nil {
		return claim{}, false, err
	}
	m, _, _, err := n.c.ReadFrom()
	if err != nil {
		return claim{}, false, err
	}
	na, ok := m.(*ndp.NeighborAdvertisement)
	if !ok {
		return claim{}, false, nil
	}
	for _, o := range na.Options {
		if ll, ok := o.(*ndp.LinkLayerAddress); ok && ll.Direction == ndp.Target && !bytes.Equal(ll.Addr, n.mac) {
			return claim{vip: na.TargetAddress, mac: ll.Addr}, true, nil
		}
	}
	return claim{}, false, nil
}

func (n *ndpAnnouncer) close() error { return n.c.Close() }
