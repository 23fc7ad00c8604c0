package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
)

// Direct server return needs every replica to accept packets for the VIP without
// claiming it on the segment: the VIP sits on lo, and the node neither answers
// ARP for it on other interfaces (arp_ignore=1) nor uses it as an ARP source
// (arp_announce=2). rp_filter is relaxed to loose on the edge interface because
// the VRRP master adds and removes the VIP there.

// dsrSysctls are the settings the agent makes, per interface name ("all" too).
func dsrSysctls(iface string) map[string]string {
	return map[string]string{
		"net/ipv4/conf/all/arp_ignore":             "1",
		"net/ipv4/conf/all/arp_announce":           "2",
		"net/ipv4/conf/" + iface + "/arp_ignore":   "1",
		"net/ipv4/conf/" + iface + "/arp_announce": "2",
		"net/ipv4/conf/" + iface + "/rp_filter":    "2",
	}
}

func writeSysctl(key, value string) error {
	p := filepath.Join("/proc/sys", key)
	if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
		return fmt.Errorf("set %s=%s: %w", strings.ReplaceAll(key, "/", "."), value, err)
	}
	return nil
}

// setupDSR applies the sysctls for iface.
func setupDSR(iface string) error {
	var errs []error
	for k, v := range dsrSysctls(iface) {
		errs = append(errs, writeSysctl(k, v))
	}
	return errors.Join(errs...)
}

// loVIPs keeps exactly the given VIPs on lo (host routes: /32, /128), adding
// what is missing and removing VIPs it added before that are gone (want holds
// every VIP this agent manages; others on lo are left alone unless listed in
// managed).
func loVIPs(want, managed []netip.Addr) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	keep := map[netip.Addr]bool{}
	var errs []error
	for _, v := range want {
		keep[v] = true
		if err := netlink.AddrReplace(lo, hostAddr(v)); err != nil {
			errs = append(errs, fmt.Errorf("add VIP %s to lo: %w", v, err))
		}
	}
	for _, v := range managed {
		if keep[v] {
			continue
		}
		if err := netlink.AddrDel(lo, hostAddr(v)); err != nil && !errors.Is(err, os.ErrNotExist) && !strings.Contains(err.Error(), "cannot assign") {
			errs = append(errs, fmt.Errorf("remove VIP %s from lo: %w", v, err))
		}
	}
	return errors.Join(errs...)
}

func hostAddr(v netip.Addr) *netlink.Addr {
	bits := 32
	if v.Is6() {
		bits = 128
	}
	return &netlink.Addr{IPNet: &net.IPNet{IP: v.AsSlice(), Mask: net.CIDRMask(bits, bits)}}
}
