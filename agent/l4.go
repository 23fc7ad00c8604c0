package agent

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/dataplane"
)

// desiredFor turns the snapshot's view of one group into what this node's data
// plane should say. local tells which replica addresses are this node; mac
// returns a replica's MAC from the neighbour table. A remote replica whose MAC is
// unknown is left out (it cannot be sent to) and returned in unresolved, so the
// caller can resolve it and try again.
func desiredFor(snap model.Snapshot, group string, seed uint32, local func(netip.Addr) bool,
	mac func(netip.Addr) (net.HardwareAddr, bool)) (want dataplane.Desired, unresolved []netip.Addr) {
	want.Seed = seed
	for _, g := range snap.Groups {
		if g.Name != group || len(g.VIPs) == 0 {
			continue
		}
		dg := dataplane.Group{Name: g.Name, VIPs: g.VIPs, Ports: g.Ports}
		for _, r := range g.Replicas {
			b := dataplane.Backend{Addr: r.Addr, Weight: r.Weight, Draining: r.State == model.Draining}
			if local(r.Addr) {
				b.Local = true
			} else if m, ok := mac(r.Addr); ok {
				b.MAC = m
			} else {
				unresolved = append(unresolved, r.Addr)
				continue
			}
			dg.Backends = append(dg.Backends, b)
		}
		want.Groups = append(want.Groups, dg)
	}
	return want, unresolved
}

// localAddrs reports whether an address is one of this node's.
func localAddrs() (func(netip.Addr) bool, error) {
	list, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	own := map[netip.Addr]bool{}
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && a.Scope == unix.RT_SCOPE_UNIVERSE {
			own[ip.Unmap()] = true
		}
	}
	return func(a netip.Addr) bool { return own[a.Unmap()] }, nil
}

// l4Sink applies each snapshot's group to the XDP data plane. It keeps the last
// snapshot so a changed neighbour (a replica's new MAC) can be re-applied.
type l4Sink struct {
	dp    *dataplane.Dataplane
	group string
	seed  uint32
	neigh *neighbors
	log   *zap.Logger

	mu    sync.Mutex
	last  model.Snapshot
	given dataplane.Desired // what the maps were last given
	ok    bool              // the last Apply reached the maps in full
}

func (s *l4Sink) Name() string { return "dataplane" }

// Apply implements controlplane.Sink. A replica whose MAC is still unknown after
// asking is left out of the maps and the error makes the controller retry.
func (s *l4Sink) Apply(ctx context.Context, snap model.Snapshot) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last, s.ok = snap, false
	return s.applyLocked()
}

func (s *l4Sink) applyLocked() error {
	local, err := localAddrs()
	if err != nil {
		return err
	}
	want, missing := desiredFor(s.last, s.group, s.seed, local, s.neigh.lookup)
	if len(missing) > 0 {
		rerr := s.neigh.resolve(missing)
		want, missing = desiredFor(s.last, s.group, s.seed, local, s.neigh.lookup)
		if len(missing) > 0 {
			s.log.Warn("replica MACs unresolved, left out of the ring", zap.Stringers("backend", missing), zap.Error(rerr))
		}
	}
	if _, err := s.dp.Apply(want); err != nil {
		return err
	}
	s.given = want
	if len(missing) > 0 {
		return fmt.Errorf("%d replica MACs unresolved", len(missing))
	}
	s.ok = true
	return nil
}

// applied reports whether the last snapshot is fully in the maps (readiness).
func (s *l4Sink) applied() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ok
}
