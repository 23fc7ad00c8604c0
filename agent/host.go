package agent

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

// hostState remembers, in a node-local directory (default /run/portico), what the
// agent changed on the host, so `portico uninstall` can undo it: the sysctls'
// values from before the first agent (sysctl.orig, written once) and the VIPs it
// keeps on lo (lo-vips).
type hostState struct{ dir string }

const (
	sysctlOrigFile = "sysctl.orig"
	loVIPsFile     = "lo-vips"
)

// setupDSR records the current values (unless a previous agent did) and applies
// the direct-server-return sysctls.
func (h hostState) setupDSR(iface string) error {
	if err := os.MkdirAll(h.dir, 0o700); err != nil {
		return fmt.Errorf("create state directory: %w", err)
	}
	orig := filepath.Join(h.dir, sysctlOrigFile)
	if _, err := os.Stat(orig); errors.Is(err, os.ErrNotExist) {
		var b strings.Builder
		for k := range dsrSysctls(iface) {
			v, err := os.ReadFile(filepath.Join("/proc/sys", k))
			if err != nil {
				return fmt.Errorf("read %s: %w", k, err)
			}
			fmt.Fprintf(&b, "%s %s\n", k, strings.TrimSpace(string(v)))
		}
		if err := writeAtomic(orig, b.String()); err != nil {
			return err
		}
	}
	return setupDSR(iface)
}

// managedVIPs returns the VIPs an earlier agent left on lo.
func (h hostState) managedVIPs() []netip.Addr {
	b, err := os.ReadFile(filepath.Join(h.dir, loVIPsFile))
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, f := range strings.Fields(string(b)) {
		if a, err := netip.ParseAddr(f); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// setLoVIPs is loVIPs that also records what lo now holds.
func (h hostState) setLoVIPs(want, managed []netip.Addr) error {
	if err := loVIPs(want, managed); err != nil {
		return err
	}
	var b strings.Builder
	for _, v := range want {
		b.WriteString(v.String() + "\n")
	}
	return writeAtomic(filepath.Join(h.dir, loVIPsFile), b.String())
}

// UndoHost undoes what agents recorded in stateDir (portico uninstall): it
// removes their VIPs from lo, restores the sysctls as they were before the first
// agent and removes the directory. Missing records are not an error.
func UndoHost(stateDir string) error {
	h := hostState{dir: stateDir}
	var errs []error
	errs = append(errs, loVIPs(nil, h.managedVIPs()))
	if b, err := os.ReadFile(filepath.Join(h.dir, sysctlOrigFile)); err == nil {
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if k, v, ok := strings.Cut(line, " "); ok {
				errs = append(errs, writeSysctl(k, v))
			}
		}
	}
	errs = append(errs, os.RemoveAll(h.dir))
	return errors.Join(errs...)
}

func writeAtomic(path, content string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
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
