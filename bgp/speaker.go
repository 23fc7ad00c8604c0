package bgp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
	"go.uber.org/zap/zapcore"
)

const (
	// idleHoldAfterReset is how long GoBGP waits before reconnecting after a
	// session reset (its default, 30 s, would leave a VIP without this edge that
	// long after any BFD flap).
	idleHoldAfterReset = 1 // seconds
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

// Speaker is the embedded BGP speaker. Create it with New, start it with Run;
// Announce and Status may be called at any time, also before Run.
type Speaker struct {
	cfg      Config
	log      *zap.Logger
	met      *Metrics
	attrs    pathAttrs
	gobgpLog *slog.Logger
	level    zap.AtomicLevel // of gobgpLog: warnings and errors

	srv *server.BgpServer // made by Run; read under mu once state is running

	mu        sync.Mutex // serialises Announce and the start and end of Run
	state     runState
	announced map[netip.Prefix]Preference // in GoBGP's RIB while running, to be added at start before

	peerMu sync.Mutex
	peers  map[netip.Addr]*peerTrack
	// quiet is set by stop: GoBGP's watch goroutine may still deliver an
	// event after the server stopped, and nothing is logged or counted then.
	quiet bool
}

type runState int

const (
	notStarted runState = iota
	running
	stopped
)

// peerTrack is what the event watch and the BFD poll last saw of a peer.
type peerTrack struct {
	session string    // "idle" … "established"
	since   time.Time // when session last changed
	bfd     string    // "" until the first poll, then "down", "init", "up", "admin-down"
	bfdOn   bool      // BFD is enabled in GoBGP (see bfdStartDelay)
}

// New checks cfg (after applying its defaults) and prepares a speaker.
func New(cfg Config, log *zap.Logger, met *Metrics) (*Speaker, error) {
	cfg.Peers = slices.Clone(cfg.Peers)
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("bgp config: %w", err)
	}
	// Sessions and paths are logged here; GoBGP's own info lines are chatty.
	level := zap.NewAtomicLevelAt(zap.WarnLevel)
	core, err := zapcore.NewIncreaseLevelCore(log.Core(), level)
	if err != nil {
		core = log.Core() // log is already less verbose than warnings
	}
	s := &Speaker{
		cfg:       cfg,
		log:       log,
		met:       met,
		attrs:     newPathAttrs(&cfg),
		gobgpLog:  slog.New(zapslog.NewHandler(core, zapslog.WithName("gobgp"))),
		level:     level,
		announced: map[netip.Prefix]Preference{},
		peers:     map[netip.Addr]*peerTrack{},
	}
	for _, p := range cfg.Peers {
		s.peers[p.Addr] = &peerTrack{session: sessionIdle}
	}
	return s, nil
}

// Run starts the server, adds the peers and the announced paths, and runs
// until ctx ends; then it stops the server: with Config.GracefulRestart the
// sessions end without a NOTIFICATION, so graceful-restart-capable peers keep
// the routes for RestartTime, otherwise they are closed with a Cease and the
// peers withdraw the routes at once. Run may be called once. GoBGP's start
// writes package variables, so two speakers of one process must not start at
// the same time (the agent runs one).
func (s *Speaker) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.state != notStarted {
		s.mu.Unlock()
		return errors.New("bgp speaker already run")
	}
	s.srv = server.NewBgpServer(server.LoggerOption(s.gobgpLog, nil))
	go s.srv.Serve()
	err := s.start(ctx)
	if err == nil {
		s.state = running
	}
	s.mu.Unlock()
	if err != nil {
		s.stop()
		return err
	}
	s.log.Info("bgp speaker started", zap.Uint32("asn", s.cfg.ASN), zap.Stringer("router_id", s.cfg.RouterID), zap.Int("peers", len(s.cfg.Peers)))

	t := time.NewTicker(bfdPollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.stop()
			s.log.Info("bgp speaker stopped", zap.Bool("graceful_restart", s.cfg.GracefulRestart))
			return nil
		case <-t.C:
			s.syncBFD(ctx)
			s.pollBFD(ctx)
		}
	}
}

func (s *Speaker) start(ctx context.Context) error {
	g := &api.Global{
		Asn:        s.cfg.ASN,
		RouterId:   s.cfg.RouterID.String(),
		ListenPort: s.cfg.ListenPort,
	}
	if s.cfg.GracefulRestart {
		g.GracefulRestart = &api.GracefulRestart{Enabled: true, RestartTime: uint32(s.cfg.RestartTime / time.Second)}
	}
	if err := s.srv.StartBgp(ctx, &api.StartBgpRequest{Global: g}); err != nil {
		return fmt.Errorf("start bgp: %w", err)
	}
	// The watch ends with ctx; the server's own context ends it too.
	if err := s.srv.WatchEvent(ctx, server.WatchEventMessageCallbacks{OnPeerUpdate: s.onPeerEvent}, server.WatchPeer()); err != nil {
		return fmt.Errorf("watch bgp peer events: %w", err)
	}
	for _, p := range s.cfg.Peers {
		if err := s.srv.AddPeer(ctx, &api.AddPeerRequest{Peer: s.apiPeer(p, false)}); err != nil {
			return fmt.Errorf("add bgp peer %v: %w", p.Addr, err)
		}
	}
	for _, a := range s.announcements() {
		if err := s.addPath(a); err != nil {
			return err
		}
	}
	return nil
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

func (s *Speaker) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.state = stopped
	s.peerMu.Lock()
	s.quiet = true // before the stop's own events: nothing more from the watch
	s.peerMu.Unlock()
	if s.cfg.GracefulRestart {
		if err := s.srv.StopBgp(context.Background(), &api.StopBgpRequest{AllowGracefulRestart: true}); err != nil {
			s.log.Error("stop bgp", zap.Error(err))
		}
		// Stop stops the BFD server and would stop BGP again, which it reports
		// as an error since BGP is no longer running: silence GoBGP for that.
		s.level.SetLevel(zap.FatalLevel)
	}
	s.srv.Stop()
	s.met.established.Set(0)
}

// Announce makes the announced set equal to prefixes at pref (none when pref
// is Withdrawn): paths whose preference changes are replaced, prefixes not
// listed are withdrawn, the others are left alone. Prefixes must be IPv4 /32
// or IPv6 /128 (those only with Config.NextHop6).
func (s *Speaker) Announce(prefixes []netip.Prefix, pref Preference) error {
	if !slices.Contains(Preferences, pref) {
		return fmt.Errorf("announce: unknown preference %d", int(pref))
	}
	if err := checkPrefixes(prefixes, s.cfg.NextHop6); err != nil {
		return fmt.Errorf("announce: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c := diff(s.announced, prefixes, pref)
	var errs []error
	for _, a := range c.add {
		if s.state == running {
			if err := s.addPath(a); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		if old, ok := s.announced[a.Prefix]; ok {
			s.log.Info("bgp prefix preference changed", zap.Stringer("vip", a.Prefix), zap.Stringer("from", old), zap.Stringer("to", a.Preference))
		} else {
			s.log.Info("bgp prefix announced", zap.Stringer("vip", a.Prefix), zap.Stringer("to", a.Preference))
		}
		s.announced[a.Prefix] = a.Preference
	}
	for _, p := range c.withdraw {
		if s.state == running {
			if err := s.deletePath(Announcement{Prefix: p, Preference: s.announced[p]}); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		s.log.Info("bgp prefix withdrawn", zap.Stringer("vip", p))
		delete(s.announced, p)
	}
	for _, p := range Preferences {
		if p != Withdrawn {
			n := 0
			for _, q := range s.announced {
				if q == p {
					n++
				}
			}
			s.met.announced.WithLabelValues(p.String()).Set(float64(n))
		}
	}
	return errors.Join(errs...)
}

// announcements lists the announced set, sorted by prefix; s.mu is held.
func (s *Speaker) announcements() []Announcement {
	var l []Announcement
	for p, pref := range s.announced {
		l = append(l, Announcement{Prefix: p, Preference: pref})
	}
	slices.SortFunc(l, func(a, b Announcement) int { return a.Prefix.Addr().Compare(b.Prefix.Addr()) })
	return l
}

func (s *Speaker) addPath(a Announcement) error {
	p, err := s.attrs.path(a, false)
	if err != nil {
		return fmt.Errorf("announce %v: %w", a.Prefix, err)
	}
	if _, err := s.srv.AddPath(apiutil.AddPathRequest{Paths: []*apiutil.Path{p}}); err != nil {
		return fmt.Errorf("announce %v: %w", a.Prefix, err)
	}
	return nil
}

func (s *Speaker) deletePath(a Announcement) error {
	p, err := s.attrs.path(a, true)
	if err != nil {
		return fmt.Errorf("withdraw %v: %w", a.Prefix, err)
	}
	if err := s.srv.DeletePath(apiutil.DeletePathRequest{Paths: []*apiutil.Path{p}}); err != nil {
		return fmt.Errorf("withdraw %v: %w", a.Prefix, err)
	}
	return nil
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

// syncBFD runs each peer's BFD session while its BGP session has been
// established for bfdStartDelay, and ends it when the session ends.
func (s *Speaker) syncBFD(ctx context.Context) {
	type change struct {
		p  Peer
		on bool
	}
	var changes []change
	s.peerMu.Lock()
	for _, p := range s.cfg.Peers {
		pt := s.peers[p.Addr]
		want := p.BFD != nil && pt.session == sessionEstablished && time.Since(pt.since) >= bfdStartDelay
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
		pt.bfdOn = c.on
		if !c.on {
			pt.bfd = "" // the next session starts down: not a change
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

// Status is the speaker's state, for `portico status`.
type Status struct {
	Peers     []PeerStatus   `json:"peers"`
	Announced []Announcement `json:"announced"`
}

// PeerStatus is one peer's session.
type PeerStatus struct {
	Addr  netip.Addr `json:"addr"`
	ASN   uint32     `json:"asn"`
	State string     `json:"state"` // idle, connect, active, opensent, openconfirm, established
	// EstablishedAt and UptimeSeconds are set while established.
	EstablishedAt time.Time `json:"established_at,omitzero"`
	UptimeSeconds float64   `json:"uptime_seconds,omitempty"`
	// BFD is up, down, init or admin-down; empty without BFD.
	BFD string `json:"bfd,omitempty"`
	// Received and Accepted count the peer's paths, over all families.
	Received uint64 `json:"received"`
	Accepted uint64 `json:"accepted"`
}

// Status reports the sessions and the announced prefixes.
func (s *Speaker) Status() Status {
	var st Status
	s.mu.Lock()
	st.Announced = s.announcements()
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
	for _, c := range s.cfg.Peers {
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
			if c.BFD != nil {
				ps.BFD = "down" // until bfdStartDelay after the session is up
				s.peerMu.Lock()
				on := s.peers[c.Addr].bfdOn
				s.peerMu.Unlock()
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
