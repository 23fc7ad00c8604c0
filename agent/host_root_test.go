package agent

import (
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/portico-edge/portico/test/netlab"
	"github.com/portico-edge/portico/test/testenv"
)

// twoNodes builds a lab of two node namespaces on one segment, a (10.215.0.1)
// and b (10.215.0.2), removed when the test ends.
func twoNodes(t *testing.T, prefix string) (a, b *netlab.Node) {
	t.Helper()
	testenv.RequireRoot(t, "network namespaces")
	lab, err := netlab.New(prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Errorf("clean up lab: %v", err)
		}
	})
	macA, _ := net.ParseMAC("02:00:0a:d7:00:01")
	macB, _ := net.ParseMAC("02:00:0a:d7:00:02")
	if a, err = lab.AddNode("a", netip.MustParsePrefix("10.215.0.1/24"), macA); err != nil {
		t.Fatal(err)
	}
	if b, err = lab.AddNode("b", netip.MustParsePrefix("10.215.0.2/24"), macB); err != nil {
		t.Fatal(err)
	}
	return a, b
}

// TestHostSetupInNamespace: the agent's direct-server-return settings and VIPs on
// lo, recorded and undone, on a node namespace.
func TestHostSetupInNamespace(t *testing.T) {
	a, _ := twoNodes(t, "pa")
	vip4, vip6 := netip.MustParseAddr("10.215.0.100"), netip.MustParseAddr("fd00:215::100")
	host := hostState{dir: t.TempDir() + "/state"}
	err := netlab.Do(a.NS, func() error {
		before := map[string]string{}
		for k := range dsrSysctls("eth0") {
			v, err := os.ReadFile("/proc/sys/" + k)
			if err != nil {
				return err
			}
			before[k] = strings.TrimSpace(string(v))
		}
		if err := host.setupDSR("eth0"); err != nil {
			return err
		}
		for k, want := range dsrSysctls("eth0") {
			got, err := os.ReadFile("/proc/sys/" + k)
			if err != nil {
				return err
			}
			if strings.TrimSpace(string(got)) != want {
				t.Errorf("%s = %s, want %s", k, got, want)
			}
		}

		if err := host.setLoVIPs([]netip.Addr{vip4, vip6}, host.managedVIPs()); err != nil {
			return err
		}
		if got := loAddrs(t); !got[vip4] || !got[vip6] {
			t.Errorf("lo holds %v, want both VIPs", got)
		}
		// Applying again is a no-op; dropping a VIP removes only that one.
		if err := host.setLoVIPs([]netip.Addr{vip4, vip6}, host.managedVIPs()); err != nil {
			return err
		}
		if err := host.setLoVIPs([]netip.Addr{vip6}, host.managedVIPs()); err != nil {
			return err
		}
		if got := loAddrs(t); got[vip4] || !got[vip6] {
			t.Errorf("lo holds %v, want only %s", got, vip6)
		}
		if m := host.managedVIPs(); len(m) != 1 || m[0] != vip6 {
			t.Errorf("recorded VIPs %v, want [%s]", m, vip6)
		}
		// A second agent start must not overwrite the recorded originals.
		if err := host.setupDSR("eth0"); err != nil {
			return err
		}
		// portico uninstall: VIPs gone from lo, sysctls as they were.
		if err := UndoHost(host.dir); err != nil {
			return err
		}
		if got := loAddrs(t); got[vip6] {
			t.Errorf("after undo lo still holds %s", vip6)
		}
		for k, want := range before {
			got, err := os.ReadFile("/proc/sys/" + k)
			if err != nil {
				return err
			}
			if strings.TrimSpace(string(got)) != want {
				t.Errorf("after undo %s = %s, want %s", k, got, want)
			}
		}
		if _, err := os.Stat(host.dir); !os.IsNotExist(err) {
			t.Errorf("state directory left behind: %v", err)
		}

		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func loAddrs(t *testing.T) map[netip.Addr]bool {
	t.Helper()
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	list, err := netlink.AddrList(lo, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	out := map[netip.Addr]bool{}
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out[ip.Unmap()] = true
		}
	}
	return out
}
