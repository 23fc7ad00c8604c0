package bgp

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"

	"github.com/osrg/gobgp/v4/api"
	"go.uber.org/zap"
)

// Reconfigure makes the speaker's peers equal to peers, live: a new peer is
// added, a peer no longer listed is deleted (its session closed with a Cease), a
// changed peer is updated, and a peer whose configuration did not change is not
// touched. An update keeps the session (GoBGP's UpdatePeer) unless it changes
// what the session's OPEN carried (the peer's ASN, the password, the port,
// passive mode, eBGP multihop): then GoBGP restarts that session. New BGP
// timers, and new BFD timers or the end of BFD, apply from the session's next
// start (see updatePeer); BFD for a session that runs none starts at once. The
// speaker-wide settings (ASN, router ID, graceful restart) stay as New set them.
//
// peers must pass Validate with the speaker's settings (each peer alone:
// Config.CheckPeer); otherwise nothing changes. A change GoBGP refuses is
// reported in the error and the peer stays as it was (or absent, for an add):
// calling Reconfigure again with the same peers retries it. Before Run the
// peers are only recorded; Run adds them.
func (s *Speaker) Reconfigure(ctx context.Context, peers []Peer) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := s.cfg
	next.Peers = slices.Clone(peers)
	for i := range next.Peers {
		next.Peers[i].setDefaults()
	}
	if err := next.Validate(); err != nil {
		return fmt.Errorf("bgp reconfigure: %w", err)
	}
	if s.state == stopped {
		return errors.New("bgp reconfigure: the speaker has stopped")
	}
	old := map[netip.Addr]Peer{}
	for _, p := range s.cfg.Peers {
		old[p.Addr] = p
	}
	want := map[netip.Addr]bool{}
	for _, p := range next.Peers {
		want[p.Addr] = true
	}
	running := s.state == running
	var errs []error
	var result []Peer // the peers the speaker has after this call, in next's order, then failed removals

	// Removed peers first: their tracking goes before GoBGP's Cease, so the
	// session's end is this call's, not a "session down".
	for _, p := range s.cfg.Peers {
		if want[p.Addr] {
			continue
		}
		if running {
			if err := s.srv.DeletePeer(ctx, &api.DeletePeerRequest{Address: p.Addr.String()}); err != nil {
				errs = append(errs, fmt.Errorf("delete bgp peer %v: %w", p.Addr, err))
				s.met.peerChanges.WithLabelValues(peerFailed).Inc()
				result = append(result, p)
				continue
			}
			s.met.peerChanges.WithLabelValues(peerRemoved).Inc()
		}
		s.untrack(p.Addr)
		s.log.Info("bgp peer removed", zap.Stringer("peer", p.Addr), zap.Uint32("asn", p.ASN))
	}
	kept := result
	result = nil
	for _, p := range next.Peers {
		o, had := old[p.Addr]
		switch {
		case had && o.Equal(p):
			result = append(result, o)
		case had:
			if err := s.updatePeer(ctx, o, p, running); err != nil {
				errs = append(errs, err)
				s.met.peerChanges.WithLabelValues(peerFailed).Inc()
				result = append(result, o)
				continue
			}
			result = append(result, p)
		default:
			if running {
				if err := s.srv.AddPeer(ctx, &api.AddPeerRequest{Peer: s.apiPeer(p, false)}); err != nil {
					errs = append(errs, fmt.Errorf("add bgp peer %v: %w", p.Addr, err))
					s.met.peerChanges.WithLabelValues(peerFailed).Inc()
					continue
				}
				s.met.peerChanges.WithLabelValues(peerAdded).Inc()
			}
			s.track(p.Addr)
			s.log.Info("bgp peer added", zap.Stringer("peer", p.Addr), zap.Uint32("asn", p.ASN), zap.Bool("bfd", p.BFD != nil))
			result = append(result, p)
		}
	}
	result = append(result, kept...)
	s.peerMu.Lock()
	s.cfg.Peers = result
	s.peerMu.Unlock()
	s.met.peers.Set(float64(len(result)))

	// Paths carry what the peers share (communities, local preference, whether
	// some peer is iBGP): when that changed, every announced path is replaced.
	if attrs := newPathAttrs(&s.cfg); !reflect.DeepEqual(attrs, s.attrs) {
		s.attrs = attrs
		if running {
			for _, a := range s.announcements() {
				if err := s.addPath(a); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}

// updatePeer replaces old's configuration with p's in GoBGP; s.mu is held.
//
// A running BFD session keeps its timers until its BGP session ends (syncBFD
// starts the next one with p's), also when p has no BFD any more: GoBGP changes
// BFD timers by ending its BFD session and starting another, which a router's
// BFD, still up, takes for a failure, and FRR then resets the BGP session
// (TestFRRReconfigure saw it do so 0.9 s after such a change, with BFD at
// 300 ms x 3). Adding BFD to a session that runs none waits for syncBFD too.
func (s *Speaker) updatePeer(ctx context.Context, old, p Peer, running bool) error {
	restarts := opensDiffer(old, p)
	s.peerMu.Lock()
	pt := s.peers[p.Addr]
	bfd := pt.bfdOn && !restarts // a restarting session gets BFD from syncBFD
	q := p
	if bfd {
		q.BFD = pt.bfdConf
	}
	deferred := bfd && !reflect.DeepEqual(q.BFD, p.BFD)
	s.peerMu.Unlock()
	if running {
		if _, err := s.srv.UpdatePeer(ctx, &api.UpdatePeerRequest{Peer: s.apiPeer(q, bfd)}); err != nil {
			return fmt.Errorf("update bgp peer %v: %w", p.Addr, err)
		}
		change := peerUpdated
		if restarts {
			change = peerRestarted
		}
		s.met.peerChanges.WithLabelValues(change).Inc()
	}
	s.peerMu.Lock()
	if pt.bfdOn != bfd {
		pt.bfdOn, pt.bfdConf = bfd, nil
		pt.bfd = "" // the next BFD session starts down: not a change
	}
	s.peerMu.Unlock()
	s.log.Info("bgp peer changed", zap.Stringer("peer", p.Addr), zap.Bool("session_restarts", restarts),
		zap.Bool("bfd", p.BFD != nil), zap.Bool("bfd_from_next_session", deferred), zap.Duration("hold_time", p.HoldTime))
	return nil
}

// track starts following addr's session; s.mu is held.
func (s *Speaker) track(addr netip.Addr) {
	s.peerMu.Lock()
	s.peers[addr] = &peerTrack{session: sessionIdle}
	s.peerMu.Unlock()
	s.met.sessionUp.WithLabelValues(addr.String()).Set(0)
}

// untrack stops following addr's session and drops its session_up series;
// s.mu is held.
func (s *Speaker) untrack(addr netip.Addr) {
	s.peerMu.Lock()
	delete(s.peers, addr)
	n := 0
	for _, p := range s.peers {
		if p.session == sessionEstablished {
			n++
		}
	}
	s.peerMu.Unlock()
	s.met.sessionUp.DeleteLabelValues(addr.String())
	s.met.established.Set(float64(n))
}

// Equal reports whether p and q configure a peer the same (an empty and a nil
// Communities alike).
func (p Peer) Equal(q Peer) bool {
	if (p.BFD == nil) != (q.BFD == nil) || p.BFD != nil && *p.BFD != *q.BFD {
		return false
	}
	return p.Addr == q.Addr && p.ASN == q.ASN && p.Port == q.Port && p.Password == q.Password &&
		p.HoldTime == q.HoldTime && p.KeepaliveInterval == q.KeepaliveInterval && p.ConnectRetry == q.ConnectRetry &&
		slices.Equal(p.Communities, q.Communities) && p.LocalPref == q.LocalPref && p.Passive == q.Passive &&
		p.EBGPMultiHop == q.EBGPMultiHop
}

// opensDiffer reports whether a and b differ in what GoBGP sends in, or
// needs before, the session's OPEN: changing it restarts the session.
func opensDiffer(a, b Peer) bool {
	return a.ASN != b.ASN || a.Password != b.Password || a.Port != b.Port || a.Passive != b.Passive ||
		a.EBGPMultiHop != b.EBGPMultiHop
}
