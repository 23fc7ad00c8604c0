package bgp

import (
	"context"
	"net/netip"
	"slices"
	"time"

	"github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"

	"github.com/portico-edge/portico/api/agentstatus"
)

// Status is the speaker's state, for `portico status`.
type Status struct {
	Peers     []PeerStatus   `json:"peers"`
	Announced []Announcement `json:"announced"`
}

// PeerStatus is one peer's session, as agents publish it (api/agentstatus: the
// wire format has one home).
type PeerStatus = agentstatus.BGPPeerStatus

// Status reports the sessions and the announced prefixes.
func (s *Speaker) Status() Status {
	var st Status
	s.mu.Lock()
	st.Announced = s.announcements()
	peers := slices.Clone(s.cfg.Peers)
	var srv *server.BgpServer
	if s.state == running {
		srv = s.srv
	}
	s.mu.Unlock()

	byAddr := map[netip.Addr]*api.Peer{}
	if srv != nil {
		// Ends with an error, not a wait, if Run has stopped the server since.
		_ = srv.ListPeer(context.Background(), &api.ListPeerRequest{}, func(p *api.Peer) {
			if a, err := netip.ParseAddr(p.GetConf().GetNeighborAddress()); err == nil {
				byAddr[a.Unmap()] = p
			}
		})
	}
	now := time.Now()
	for _, c := range peers {
		ps := PeerStatus{Addr: c.Addr, ASN: c.ASN, State: sessionIdle}
		if p := byAddr[c.Addr]; p != nil {
			var fsm bgp.FSMState
			switch p.GetState().GetSessionState() {
			case api.PeerState_SESSION_STATE_CONNECT:
				fsm = bgp.BGP_FSM_CONNECT
			case api.PeerState_SESSION_STATE_ACTIVE:
				fsm = bgp.BGP_FSM_ACTIVE
			case api.PeerState_SESSION_STATE_OPENSENT:
				fsm = bgp.BGP_FSM_OPENSENT
			case api.PeerState_SESSION_STATE_OPENCONFIRM:
				fsm = bgp.BGP_FSM_OPENCONFIRM
			case api.PeerState_SESSION_STATE_ESTABLISHED:
				fsm = bgp.BGP_FSM_ESTABLISHED
			}
			ps.State = sessionName(fsm)
			if up := p.GetTimers().GetState().GetUptime(); ps.State == sessionEstablished && up != nil && up.IsValid() {
				ps.EstablishedAt = up.AsTime()
				ps.UptimeSeconds = now.Sub(ps.EstablishedAt).Round(time.Second).Seconds()
			}
			s.peerMu.Lock()
			on := false
			if pt := s.peers[c.Addr]; pt != nil { // nil: removed since
				on = pt.bfdOn
			}
			s.peerMu.Unlock()
			if c.BFD != nil || on {
				ps.BFD = "down" // until bfdStartDelay after the session is up
				if on {
					ps.BFD = bfdName(p.GetState().GetBfdState().GetSessionState())
				}
			}
			for _, af := range p.GetAfiSafis() {
				ps.Received += af.GetState().GetReceived()
				ps.Accepted += af.GetState().GetAccepted()
			}
		} else if c.BFD != nil {
			ps.BFD = "down"
		}
		st.Peers = append(st.Peers, ps)
	}
	return st
}
