package bgp

import (
	"context"
	"net/netip"
	"time"

	"github.com/osrg/gobgp/v4/api"
	"go.uber.org/zap"
)

const (
	// bfdPollInterval is how often BFD states are read: GoBGP has no BFD event.
	bfdPollInterval = 100 * time.Millisecond
	// bfdStartDelay is how long after a session comes up its BFD session
	// starts. FRR replaces its BFD session when BGP comes up (it deregisters
	// the old one, sending AdminDown), and GoBGP, against RFC 5882 section
	// 3.2, takes a received AdminDown for a failure and resets the BGP
	// session; a BFD session begun while the old one lived (bound to it) also
	// times out and resets BGP. Starting BFD once both ends are up, after
	// FRR's swap, gives one session that stays. BFD only guards an
	// established session, so nothing is lost before.
	bfdStartDelay = time.Second
)

// syncBFD runs each peer's BFD session while its BGP session has been
// established for bfdStartDelay, with the peer's BFD timers of that moment, and
// ends it when the session ends. It holds s.mu: a Reconfigure between its
// reading of a peer and its update would be undone.
func (s *Speaker) syncBFD(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != running {
		return
	}
	type change struct {
		p  Peer
		on bool
	}
	var changes []change
	s.peerMu.Lock()
	for _, p := range s.cfg.Peers {
		pt := s.peers[p.Addr]
		// A running BFD session stays as it is while its BGP session lasts,
		// whatever Reconfigure did to the peer's BFD since.
		want := (p.BFD != nil || pt.bfdOn) && pt.session == sessionEstablished && time.Since(pt.since) >= bfdStartDelay
		if want != pt.bfdOn {
			changes = append(changes, change{p, want})
		}
	}
	s.peerMu.Unlock()
	for _, c := range changes {
		if _, err := s.srv.UpdatePeer(ctx, &api.UpdatePeerRequest{Peer: s.apiPeer(c.p, c.on)}); err != nil {
			s.log.Error("bfd session not changed", zap.Stringer("peer", c.p.Addr), zap.Bool("enable", c.on), zap.Error(err))
			continue
		}
		s.peerMu.Lock()
		pt := s.peers[c.p.Addr]
		pt.bfdOn, pt.bfdConf = c.on, c.p.BFD
		if !c.on {
			pt.bfd, pt.bfdConf = "", nil // the next session starts down: not a change
		}
		s.peerMu.Unlock()
		s.log.Debug("bfd session", zap.Stringer("peer", c.p.Addr), zap.Bool("enabled", c.on))
	}
}

// pollBFD logs and counts each BFD state change.
func (s *Speaker) pollBFD(ctx context.Context) {
	states := map[netip.Addr]string{}
	s.srv.ListBfdPeer(ctx, func(addr string, st *api.BfdPeerState) {
		if a, err := netip.ParseAddr(addr); err == nil {
			states[a.Unmap()] = bfdName(st.GetSessionState())
		}
	})
	s.peerMu.Lock()
	defer s.peerMu.Unlock()
	for addr, to := range states {
		pt, ok := s.peers[addr]
		if !ok || pt.bfd == to {
			continue
		}
		from := pt.bfd
		pt.bfd = to
		if from == "" && to == "down" {
			continue // a new BFD session starts down: not a change
		}
		s.met.bfdTransitions.WithLabelValues(addr.String(), to).Inc()
		switch {
		case to == "up":
			s.log.Info("bfd session up", zap.Stringer("peer", addr), zap.String("from", from), zap.String("to", to))
		case from == "up":
			s.log.Warn("bfd session down", zap.Stringer("peer", addr), zap.String("from", from), zap.String("to", to))
		default:
			s.log.Debug("bfd state changed", zap.Stringer("peer", addr), zap.String("from", from), zap.String("to", to))
		}
	}
}

func bfdName(st api.BfdSessionState) string {
	switch st {
	case api.BfdSessionState_BFD_SESSION_STATE_UP:
		return "up"
	case api.BfdSessionState_BFD_SESSION_STATE_DOWN:
		return "down"
	case api.BfdSessionState_BFD_SESSION_STATE_INIT:
		return "init"
	case api.BfdSessionState_BFD_SESSION_STATE_ADMIN_DOWN:
		return "admin-down"
	}
	return "unknown"
}
