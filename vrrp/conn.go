package vrrp

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// advertConn is a raw IP protocol 112 socket bound to one interface for one
// address family. It has joined the VRRP group, sends with TTL / hop limit 255 and
// reports each packet's source, destination and TTL / hop limit.
type advertConn struct {
	ifi *net.Interface
	is4 bool
	c4  *ipv4.PacketConn
	c6  *ipv6.PacketConn
}

// received is one packet read from an advertConn.
type received struct {
	payload  []byte
	src, dst netip.Addr
	hopLimit int
}

func bindToDevice(name string) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptString(int(fd), unix.SOL_SOCKET, unix.SO_BINDTODEVICE, name)
		})
		if err != nil {
			return err
		}
		return serr
	}
}

// listenAdverts opens the raw socket for is4 (IPv4) or IPv6 on ifi.
func listenAdverts(ifi *net.Interface, is4 bool) (*advertConn, error) {
	lc := net.ListenConfig{Control: bindToDevice(ifi.Name)}
	ac := &advertConn{ifi: ifi, is4: is4}
	if is4 {
		pc, err := lc.ListenPacket(context.Background(), fmt.Sprintf("ip4:%d", IPProtocol), "0.0.0.0")
		if err != nil {
			return nil, fmt.Errorf("open ipv4 vrrp socket on %s: %w", ifi.Name, err)
		}
		c := ipv4.NewPacketConn(pc)
		ac.c4 = c
		for _, step := range []struct {
			what string
			err  func() error
		}{
			{"join 224.0.0.18", func() error { return c.JoinGroup(ifi, &net.IPAddr{IP: GroupIPv4.AsSlice()}) }},
			{"set multicast interface", func() error { return c.SetMulticastInterface(ifi) }},
			{"set multicast ttl", func() error { return c.SetMulticastTTL(requiredHopLimit) }},
			{"set ttl", func() error { return c.SetTTL(requiredHopLimit) }},
			{"disable multicast loopback", func() error { return c.SetMulticastLoopback(false) }},
			{"enable control messages", func() error {
				return c.SetControlMessage(ipv4.FlagTTL|ipv4.FlagDst|ipv4.FlagInterface, true)
			}},
		} {
			if err := step.err(); err != nil {
				pc.Close()
				return nil, fmt.Errorf("ipv4 vrrp socket on %s: %s: %w", ifi.Name, step.what, err)
			}
		}
		return ac, nil
	}
	pc, err := lc.ListenPacket(context.Background(), fmt.Sprintf("ip6:%d", IPProtocol), "::")
	if err != nil {
		return nil, fmt.Errorf("open ipv6 vrrp socket on %s: %w", ifi.Name, err)
	}
	c := ipv6.NewPacketConn(pc)
	ac.c6 = c
	for _, step := range []struct {
		what string
		err  func() error
	}{
		{"join ff02::12", func() error { return c.JoinGroup(ifi, &net.IPAddr{IP: GroupIPv6.AsSlice()}) }},
		{"set multicast interface", func() error { return c.SetMulticastInterface(ifi) }},
		{"set multicast hop limit", func() error { return c.SetMulticastHopLimit(requiredHopLimit) }},
		{"set hop limit", func() error { return c.SetHopLimit(requiredHopLimit) }},
		{"disable multicast loopback", func() error { return c.SetMulticastLoopback(false) }},
		{"enable control messages", func() error {
			return c.SetControlMessage(ipv6.FlagHopLimit|ipv6.FlagDst|ipv6.FlagInterface, true)
		}},
	} {
		if err := step.err(); err != nil {
			pc.Close()
			return nil, fmt.Errorf("ipv6 vrrp socket on %s: %s: %w", ifi.Name, step.what, err)
		}
	}
	return ac, nil
}

// send writes one VRRP payload from src to dst (the group or a unicast peer).
func (c *advertConn) send(payload []byte, src, dst netip.Addr) error {
	var err error
	if c.is4 {
		_, err = c.c4.WriteTo(payload, &ipv4.ControlMessage{Src: src.AsSlice(), IfIndex: c.ifi.Index}, &net.IPAddr{IP: dst.AsSlice()})
	} else {
		_, err = c.c6.WriteTo(payload, &ipv6.ControlMessage{Src: src.AsSlice(), IfIndex: c.ifi.Index, HopLimit: requiredHopLimit}, &net.IPAddr{IP: dst.AsSlice(), Zone: c.ifi.Name})
	}
	if err != nil {
		return fmt.Errorf("send advert to %v on %s: %w", dst, c.ifi.Name, err)
	}
	return nil
}

// recv reads the next packet into buf, waiting at most until deadline.
func (c *advertConn) recv(buf []byte, deadline time.Time) (received, error) {
	if c.is4 {
		if err := c.c4.SetReadDeadline(deadline); err != nil {
			return received{}, err
		}
		n, cm, src, err := c.c4.ReadFrom(buf)
		if err != nil {
			return received{}, err
		}
		r := received{payload: buf[:n], hopLimit: -1}
		if ia, ok := src.(*net.IPAddr); ok {
			r.src, _ = netip.AddrFromSlice(ia.IP)
		}
		if cm != nil {
			r.dst, _ = netip.AddrFromSlice(cm.Dst)
			r.hopLimit = cm.TTL
		}
		r.src, r.dst = r.src.Unmap(), r.dst.Unmap()
		return r, nil
	}
	if err := c.c6.SetReadDeadline(deadline); err != nil {
		return received{}, err
	}
	n, cm, src, err := c.c6.ReadFrom(buf)
	if err != nil {
		return received{}, err
	}
	r := received{payload: buf[:n], hopLimit: -1}
	if ia, ok := src.(*net.IPAddr); ok {
		r.src, _ = netip.AddrFromSlice(ia.IP)
	}
	if cm != nil {
		r.dst, _ = netip.AddrFromSlice(cm.Dst)
		r.hopLimit = cm.HopLimit
	}
	return r, nil
}

func (c *advertConn) close() error {
	if c.is4 {
		return c.c4.Close()
	}
	return c.c6.Close()
}
