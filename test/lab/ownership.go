package lab

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/portico-edge/portico/test/netlab"
)

// Owner returns the edge whose eth0 holds the VIP (the VRRP master), if exactly
// one does.
func (l *Lab) Owner() (*Node, error) { return ownerAmong(l.Edges) }

// newOwner is Owner among the edges other than old.
func (l *Lab) newOwner(old *Node) (*Node, error) {
	return ownerAmong(slices.DeleteFunc(slices.Clone(l.Edges), func(e *Node) bool { return e == old }))
}

func ownerAmong(edges []*Node) (*Node, error) {
	var owners []*Node
	for _, e := range edges {
		held, err := e.holdsVIP()
		if err != nil {
			return nil, err
		}
		if held {
			owners = append(owners, e)
		}
	}
	if len(owners) != 1 {
		return nil, fmt.Errorf("%d of %d edges own %s", len(owners), len(edges), VIP)
	}
	return owners[0], nil
}

// holdsVIP reports whether n's eth0 holds the VIP.
func (n *Node) holdsVIP() (bool, error) { return n.holds(VIP) }

// holds reports whether the node's edge interface has vip (the VRRP master's).
func (n *Node) holds(vip netip.Addr) (bool, error) {
	out, err := netlab.Exec(n.NS, "ip", "-o", "addr", "show", "dev", "eth0")
	if err != nil {
		return false, err
	}
	for _, f := range strings.Fields(out) {
		if p, err := netip.ParsePrefix(f); err == nil && p.Addr() == vip {
			return true, nil
		}
	}
	return false, nil
}
