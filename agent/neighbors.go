package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/mdlayher/arp"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
)

// neighbors finds replica MACs on the edge interface: from the kernel's
// neighbour table, and by asking (ARP for IPv4; for IPv6 a datagram to the
// discard port makes the kernel run neighbour discovery) when it has none.
type neighbors struct {
	ifc *net.Interface
	log *zap.Logger

	mu       sync.Mutex
	resolved map[netip.Addr]net.HardwareAddr // answers to our own ARP requests
}

func (n *neighbors) lookup(a netip.Addr) (net.HardwareAddr, bool) {
	family := netlink.FAMILY_V4
	if a.Is6() && !a.Is4In6() {
		family = netlink.FAMILY_V6
	}
	list, err := netlink.NeighList(n.ifc.Index, family)
	if err == nil {
		for _, e := range list {
			ip, ok := netip.AddrFromSlice(e.IP)
			if ok && ip.Unmap() == a && len(e.HardwareAddr) == 6 &&
				e.State&(netlink.NUD_REACHABLE|netlink.NUD_STALE|netlink.NUD_DELAY|netlink.NUD_PROBE|netlink.NUD_PERMANENT|netlink.NUD_NOARP) != 0 {
				return e.HardwareAddr, true
			}
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	m, ok := n.resolved[a]
	return m, ok
}

// resolve asks the segment for each address, with a deadline per address.
func (n *neighbors) resolve(addrs []netip.Addr) error {
	var errs []error
	for _, a := range addrs {
		if a.Is4() {
			m, err := n.arp(a)
			if err != nil {
				errs = append(errs, fmt.Errorf("arp %s: %w", a, err))
				continue
			}
			n.mu.Lock()
			n.resolved[a] = m
			n.mu.Unlock()
			continue
		}
		// The kernel resolves the address to send this; lookup then finds it.
		c, err := net.DialUDP("udp6", nil, &net.UDPAddr{IP: a.AsSlice(), Port: 9, Zone: n.ifc.Name})
		if err != nil {
			errs = append(errs, fmt.Errorf("probe %s: %w", a, err))
			continue
		}
		c.Write([]byte{0})
		c.Close()
	}
	return errors.Join(errs...)
}

// arpAttempts and arpWait: a request or its reply can be lost (a link still
// coming up, a busy node), so arp asks up to three times, as arping does,
// within about the second one answer would have been given.
const (
	arpAttempts = 3
	arpWait     = 400 * time.Millisecond
)

func (n *neighbors) arp(a netip.Addr) (net.HardwareAddr, error) {
	c, err := arp.Dial(n.ifc)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	var last error
	for range arpAttempts {
		if err := c.SetDeadline(time.Now().Add(arpWait)); err != nil {
			return nil, err
		}
		m, err := c.Resolve(a)
		if err == nil {
			return m, nil
		}
		last = err
	}
	return nil, fmt.Errorf("no answer to %d requests: %w", arpAttempts, last)
}

// watchNeighbours re-applies the last snapshot whenever the kernel's neighbour
// table changes an entry for a replica, so a replica that changed its MAC (a
// replaced NIC, a moved VM) is followed.
func (s *l4Sink) watchNeighbours(ctx context.Context) error {
	ch := make(chan netlink.NeighUpdate, 64)
	if err := netlink.NeighSubscribeWithOptions(ch, ctx.Done(), netlink.NeighSubscribeOptions{}); err != nil {
		return fmt.Errorf("subscribe to neighbour updates: %w", err)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case u, open := <-ch:
			if !open {
				return nil
			}
			if u.LinkIndex != s.neigh.ifc.Index || len(u.HardwareAddr) != 6 {
				continue
			}
			ip, ok := netip.AddrFromSlice(u.IP)
			if !ok {
				continue
			}
			s.mu.Lock()
			if s.macChanged(ip.Unmap(), u.HardwareAddr) {
				s.log.Info("replica MAC changed", zap.Stringer("backend", ip), zap.Stringer("to", u.HardwareAddr))
				if err := s.applyLocked(); err != nil {
					s.log.Warn("re-apply after neighbour change failed", zap.Error(err))
				}
			}
			s.mu.Unlock()
		}
	}
}

// macChanged reports whether a neighbour update concerns a replica of the group
// whose MAC differs from what the maps were given (or that was left out for want
// of a MAC). The caller holds s.mu.
func (s *l4Sink) macChanged(a netip.Addr, m net.HardwareAddr) bool {
	replica := false
	for _, g := range s.last.Groups {
		if g.Name == s.group {
			for _, r := range g.Replicas {
				replica = replica || r.Addr == a
			}
		}
	}
	if !replica {
		return false
	}
	for _, g := range s.given.Groups {
		for _, b := range g.Backends {
			if b.Addr == a {
				// A down replica gets only the flows it had, with the MAC it had
				// then: while it is probed every 20 ms its neighbour entry
				// churns, and re-applying for each change would rebuild the
				// rings for nothing. The Apply that brings it back looks it up.
				return !b.Local && !b.Down && b.MAC.String() != m.String()
			}
		}
	}
	return true
}
