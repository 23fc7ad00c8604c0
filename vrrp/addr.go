package vrrp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// hostPrefix is vip as a /32 or /128, the form a VIP takes on the interface.
func hostPrefix(vip netip.Addr) *net.IPNet {
	bits := 32
	if vip.Is6() {
		bits = 128
	}
	return &net.IPNet{IP: vip.AsSlice(), Mask: net.CIDRMask(bits, bits)}
}

// addVIP puts vip on link. IPv6 VIPs skip duplicate address detection, which
// would otherwise hold the address tentative for a second. Adding an address that
// is already there is not an error.
func addVIP(h *netlink.Handle, link netlink.Link, vip netip.Addr) error {
	a := &netlink.Addr{IPNet: hostPrefix(vip)}
	if vip.Is6() {
		a.Flags = unix.IFA_F_NODAD
	}
	if err := h.AddrAdd(link, a); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add vip %v to %s: %w", vip, link.Attrs().Name, err)
	}
	return nil
}

// delVIP removes vip from link; removing an absent address is not an error.
func delVIP(h *netlink.Handle, link netlink.Link, vip netip.Addr) error {
	err := h.AddrDel(link, &netlink.Addr{IPNet: hostPrefix(vip)})
	if err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove vip %v from %s: %w", vip, link.Attrs().Name, err)
	}
	return nil
}

// hasVIP reports whether vip is on link, with any prefix length.
func hasVIP(h *netlink.Handle, link netlink.Link, vip netip.Addr) (bool, error) {
	bits, err := vipBits(h, link, vip)
	return bits >= 0, err
}

// vipBits returns the prefix length vip has on link, or -1 if it is not there.
func vipBits(h *netlink.Handle, link netlink.Link, vip netip.Addr) (int, error) {
	fam := netlink.FAMILY_V4
	if vip.Is6() {
		fam = netlink.FAMILY_V6
	}
	addrs, err := h.AddrList(link, fam)
	if err != nil {
		return -1, fmt.Errorf("list addresses of %s: %w", link.Attrs().Name, err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == vip {
			bits, _ := a.Mask.Size()
			return bits, nil
		}
	}
	return -1, nil
}

// primaryAddr returns the address adverts are sent from: for IPv4 the first
// address on link that is not a VIP, for IPv6 the link-local address
// (RFC 5798 §5.1.2.1).
func primaryAddr(h *netlink.Handle, link netlink.Link, is4 bool, vips map[netip.Addr]bool) (netip.Addr, error) {
	fam := netlink.FAMILY_V6
	if is4 {
		fam = netlink.FAMILY_V4
	}
	addrs, err := h.AddrList(link, fam)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("list addresses of %s: %w", link.Attrs().Name, err)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if vips[ip] {
			continue
		}
		if is4 || ip.IsLinkLocalUnicast() {
			return ip, nil
		}
	}
	if is4 {
		return netip.Addr{}, fmt.Errorf("interface %s has no ipv4 address to send adverts from", link.Attrs().Name)
	}
	return netip.Addr{}, fmt.Errorf("interface %s has no ipv6 link-local address to send adverts from", link.Attrs().Name)
}

// SourceAddrs returns the addresses an announcer for vips on iface sends its
// adverts from (as New picks them): the first IPv4 address that is not one of
// vips, and the IPv6 link-local address, each when iface has one. Peers list
// them as this node's (Peers, unicast mode).
func SourceAddrs(iface string, vips []netip.Addr) ([]netip.Addr, error) {
	link, err := netlink.LinkByName(iface)
	if err != nil {
		return nil, fmt.Errorf("find interface %s: %w", iface, err)
	}
	h, err := netlink.NewHandle()
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	skip := map[netip.Addr]bool{}
	for _, v := range vips {
		skip[v.Unmap()] = true
	}
	var out []netip.Addr
	for _, is4 := range []bool{true, false} {
		a, err := primaryAddr(h, link, is4, skip)
		if err == nil {
			out = append(out, a)
		}
	}
	return out, nil
}
