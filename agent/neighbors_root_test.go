package agent

import (
	"net"
	"net/netip"
	"testing"

	"go.uber.org/zap"

	"github.com/portico-edge/portico/test/netlab"
)

// TestNeighborsInNamespace: a replica's MAC is unknown until asked for, then
// found by ARP; an address nobody has is an error.
func TestNeighborsInNamespace(t *testing.T) {
	a, b := twoNodes(t, "pn")
	err := netlab.Do(a.NS, func() error {
		ifc, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		n := &neighbors{ifc: ifc, log: zap.NewNop(), resolved: map[netip.Addr]net.HardwareAddr{}}
		addr := b.Addr.Addr()
		if _, ok := n.lookup(addr); ok {
			t.Errorf("neighbour %s known before anyone asked", addr)
		}
		if err := n.resolve([]netip.Addr{addr}); err != nil {
			return err
		}
		if m, ok := n.lookup(addr); !ok || m.String() != b.MAC.String() {
			t.Errorf("resolved %s to %v (%v), want %s", addr, m, ok, b.MAC)
		}
		if err := n.resolve([]netip.Addr{netip.MustParseAddr("10.215.0.77")}); err == nil {
			t.Error("resolving an address nobody has succeeded")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
