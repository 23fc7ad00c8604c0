package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/portico-edge/portico/dataplane"
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
// agent changed on the host, so that it can be undone (UndoHost): the sysctls'
// values from before the first agent (sysctl.orig, written once) and the VIPs it
// keeps on lo (lo-vips). The chart mounts the directory from the host, so an agent
// in a new pod finds what the first one recorded; it is on tmpfs, as what it
// records is: a reboot clears both.
type hostState struct{ dir string }

const (
	sysctlOrigFile = "sysctl.orig"
	loVIPsFile     = "lo-vips"
	// lockFile is held (flock) by the agent that owns the node, from before it
	// changes anything until it has exited or undone everything.
	lockFile = "agent.lock"
)

// lockNode waits until no other agent (or portico uninstall) holds the node's
// lock in stateDir, takes it and returns it; closing the file gives it up. An
// agent whose DaemonSet was deleted may still be undoing the node when the pod
// of a DaemonSet made again with the same name starts: the new agent waits
// rather than load and attach what the old one is about to remove. The lock is
// the kernel's (flock), so an agent that dies gives it up.
func lockNode(ctx context.Context, stateDir string, log *zap.Logger) (*os.File, error) {
	waiting := false
	for {
		f, err := tryLockNode(stateDir)
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return f, err
		}
		if !waiting {
			waiting = true
			log.Info("waiting for the node's previous agent to stop", zap.String("lock", filepath.Join(stateDir, lockFile)))
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for the node's previous agent: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// lockOpened runs between opening the lock file and locking it (tests: the
// holder before may remove the file then).
var lockOpened = func() {}

// tryLockNode takes the node's lock, or fails with EWOULDBLOCK when another
// process holds it.
func tryLockNode(stateDir string) (*os.File, error) {
	path := filepath.Join(stateDir, lockFile)
	for {
		if err := os.MkdirAll(stateDir, 0o700); err != nil {
			return nil, fmt.Errorf("create state directory: %w", err)
		}
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", path, err)
		}
		lockOpened()
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, err
			}
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		// The holder before may have undone the node and removed the file
		// while this one waited: a lock on a removed file locks nothing.
		var held, now unix.Stat_t
		if unix.Fstat(int(f.Fd()), &held) == nil && unix.Stat(path, &now) == nil && held.Ino == now.Ino && held.Dev == now.Dev {
			return f, nil
		}
		f.Close()
	}
}

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

// UndoNode undoes everything agents did to this node (portico uninstall): it
// detaches xdp_lb and removes every pin under pinPath (sk_lookup steering's
// too), then undoes what they recorded in stateDir (UndoHost). It refuses while
// an agent runs on the node (it holds the node's lock).
func UndoNode(pinPath, stateDir string) error {
	lock, err := tryLockNode(stateDir)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return fmt.Errorf("an agent is running on this node (it holds %s): stop it first", filepath.Join(stateDir, lockFile))
	}
	if err != nil {
		return err
	}
	defer lock.Close()
	return undoNode(pinPath, stateDir)
}

// undoNode is UndoNode for the holder of the node's lock.
func undoNode(pinPath, stateDir string) error {
	return errors.Join(dataplane.Uninstall(pinPath), UndoHost(stateDir))
}

// UndoHost undoes what agents recorded in stateDir: it removes their VIPs from
// lo, restores the sysctls as they were before the first agent and removes the
// records and the directory (a directory that is a mount point, the chart's
// hostPath, stays, empty). Missing records are not an error.
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
	entries, err := os.ReadDir(h.dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, e := range entries {
		errs = append(errs, os.RemoveAll(filepath.Join(h.dir, e.Name())))
	}
	if err := os.Remove(h.dir); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.EBUSY) {
		errs = append(errs, err)
	}
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
