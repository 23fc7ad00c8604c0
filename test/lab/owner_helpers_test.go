package lab

import (
	"context"

	"syscall"
	"testing"
	"time"

	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/test/netlab"
	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

// vipOwner returns the edge that owns the VIP, alone, or fails t.
func vipOwner(t *testing.T, l *Lab) *Node {
	t.Helper()
	owner, err := l.Owner()
	if err != nil {
		t.Fatal(err)
	}
	return owner
}

// waitNewOwner waits up to d for an edge other than old to own the VIP, alone, and
// returns it, or fails t.
func waitNewOwner(t *testing.T, l *Lab, old *Node, d time.Duration) *Node {
	t.Helper()
	var n *Node
	if _, err := testenv.Poll(context.Background(), d, 100*time.Millisecond, func() (err error) { n, err = l.newOwner(old); return err }); err != nil {
		t.Fatalf("no new owner within %v: %v", d, err)
	}
	return n
}

// ownerUnderLoad brings the lab up, starts requests to echo.lab and lets them run
// for a second; it returns the lab, the load and the edge that owns the VIP.
func ownerUnderLoad(t *testing.T) (*Lab, *traffic.Load, *Node) {
	t.Helper()
	l := startLab(t)
	owner := vipOwner(t, l)
	load := l.StartLoad(context.Background(), "echo.lab", 4)
	time.Sleep(time.Second)
	return l, load, owner
}

// killOwner kills the VIP owner's agent (-9) and cuts its link, and waits for
// another edge to take the VIP: the new owner, and how long it took.
func (l *Lab) killOwner(t *testing.T, owner *Node) (*Node, time.Duration) {
	t.Helper()
	start := time.Now()
	l.killAndCut(t, owner)
	newOwner := waitNewOwner(t, l, owner, 5*time.Second)
	return newOwner, time.Since(start)
}

// killAndCut kills an edge's agent (-9) and cuts its link.
func (l *Lab) killAndCut(t *testing.T, n *Node) {
	t.Helper()
	if err := l.Agent(l.EdgeNo(n)).Kill(syscall.SIGKILL, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := netlab.Exec(n.NS, "ip", "link", "set", "eth0", "down"); err != nil {
		t.Fatal(err)
	}
}

// ownerMaps reads the owner's pinned maps: the replica states it steers with.
func (l *Lab) ownerBackends(owner *Node) (map[string]dataplane.BackendView, error) {
	in, err := dataplane.OpenPinned("/sys/fs/bpf/" + l.Net.Prefix + owner.Name)
	if err != nil {
		return nil, err
	}
	defer in.Close()
	vips, err := in.VIPs()
	if err != nil {
		return nil, err
	}
	out := map[string]dataplane.BackendView{}
	for _, v := range vips {
		if v.Addr == VIP {
			for _, b := range v.Backends {
				out[b.Addr.String()] = b
			}
		}
	}
	return out, nil
}
