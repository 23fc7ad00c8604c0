package bgp

import (
	"time"

	"github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"go.uber.org/zap"
)

// idleHoldAfterReset is how long GoBGP waits before reconnecting after a
// session reset (its default, 30 s, would leave a VIP without this edge that
// long after any BFD flap).
const idleHoldAfterReset = 1 // seconds

// peerTrack is what the event watch and the BFD poll last saw of a peer.
type peerTrack struct {
	session string    // "idle" … "established"
	since   time.Time // when session last changed
	bfd     string    // "" until the first poll, then "down", "init", "up", "admin-down"
	bfdOn   bool      // BFD is enabled in GoBGP (see bfdStartDelay)
	// bfdConf is the BFD configuration GoBGP runs while bfdOn: the peer's
	// when syncBFD started it, kept through Reconfigure until the session
	// ends (see Reconfigure).
	bfdConf *BFD
}

// apiPeer is GoBGP's configuration of p, with its BFD session if bfd.
func (s *Speaker) apiPeer(p Peer, bfd bool) *api.Peer {
	secs := func(d time.Duration) uint64 { return uint64(d / time.Second) }
	families := []*api.Family{{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}}
	if s.cfg.NextHop6.IsValid() {
		families = append(families, &api.Family{Afi: api.Family_AFI_IP6, Safi: api.Family_SAFI_UNICAST})
	}
	ap := &api.Peer{
		Conf: &api.PeerConf{
			NeighborAddress: p.Addr.String(),
			PeerAsn:         p.ASN,
			AuthPassword:    p.Password,
		},
		Timers: &api.Timers{Config: &api.TimersConfig{
			ConnectRetry:           secs(p.ConnectRetry),
			HoldTime:               secs(p.HoldTime),
			KeepaliveInterval:      secs(p.KeepaliveInterval),
			IdleHoldTimeAfterReset: idleHoldAfterReset,
		}},
		Transport: &api.Transport{RemotePort: uint32(p.Port), PassiveMode: p.Passive},
	}
	if p.EBGPMultiHop {
		ap.EbgpMultihop = &api.EbgpMultihop{Enabled: true, MultihopTtl: 255}
	}
	for _, f := range families {
		af := &api.AfiSafi{Config: &api.AfiSafiConfig{Family: f, Enabled: true}}
		if s.cfg.GracefulRestart {
			af.MpGracefulRestart = &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}}
		}
		ap.AfiSafis = append(ap.AfiSafis, af)
	}
	if s.cfg.GracefulRestart {
		ap.GracefulRestart = &api.GracefulRestart{Enabled: true, RestartTime: uint32(s.cfg.RestartTime / time.Second)}
	}
	if b := p.BFD; b != nil && bfd {
		us := func(d time.Duration) uint32 { return uint32(d / time.Microsecond) }
		ap.Bfd = &api.BfdPeerConfig{
			Enabled:                  true,
			DesiredMinimumTxInterval: us(b.MinTx),
			RequiredMinimumReceive:   us(b.MinRx),
			DetectionMultiplier:      uint32(b.Multiplier),
		}
	}
	return ap
}

// Session states, as Status and the metrics name them.
const (
	sessionIdle        = "idle"
	sessionEstablished = "established"
)

func sessionName(st bgp.FSMState) string {
	switch st {
	case bgp.BGP_FSM_IDLE:
		return sessionIdle
	case bgp.BGP_FSM_CONNECT:
		return "connect"
	case bgp.BGP_FSM_ACTIVE:
		return "active"
	case bgp.BGP_FSM_OPENSENT:
		return "opensent"
	case bgp.BGP_FSM_OPENCONFIRM:
		return "openconfirm"
	case bgp.BGP_FSM_ESTABLISHED:
		return sessionEstablished
	}
	return "unknown"
}

// onPeerEvent logs and counts each session state change.
func (s *Speaker) onPeerEvent(ev *apiutil.WatchEventMessage_PeerEvent, _ time.Time) {
	if ev.Type != apiutil.PEER_EVENT_STATE {
		return
	}
	addr := ev.Peer.State.NeighborAddress.Unmap()
	to := sessionName(ev.Peer.State.SessionState)
	s.peerMu.Lock()
	defer s.peerMu.Unlock()
	pt, ok := s.peers[addr]
	if s.quiet || !ok || pt.session == to {
		return
	}
	from := pt.session
	pt.session = to
	pt.since = time.Now()
	s.met.sessionTransitions.WithLabelValues(addr.String(), to).Inc()
	up := 0.0
	if to == sessionEstablished {
		up = 1
	}
	s.met.sessionUp.WithLabelValues(addr.String()).Set(up)
	n := 0
	for _, p := range s.peers {
		if p.session == sessionEstablished {
			n++
		}
	}
	s.met.established.Set(float64(n))
	switch {
	case to == sessionEstablished:
		s.log.Info("bgp session up", zap.Stringer("peer", addr), zap.String("from", from), zap.String("to", to))
	case from == sessionEstablished:
		s.log.Warn("bgp session down", zap.Stringer("peer", addr), zap.String("from", from), zap.String("to", to),
			zap.String("reason", ev.Peer.State.DisconnectReason.String()), zap.String("message", ev.Peer.State.DisconnectMessage))
	default:
		s.log.Debug("bgp session state changed", zap.Stringer("peer", addr), zap.String("from", from), zap.String("to", to))
	}
}
