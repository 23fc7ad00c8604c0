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
	"github.com/osrg/gobgp/v4/pkg/server"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
	"go.uber.org/zap/zapcore"
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

	mu        sync.Mutex // serialises Announce, Reconfigure, the BFD sync and the start and end of Run
	state     runState
	announced map[netip.Prefix]Preference // in GoBGP's RIB while running, to be added at start before

	// peerMu guards peers, and cfg.Peers with mu: Reconfigure, which changes
	// them, holds both.
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
		met.sessionUp.WithLabelValues(p.Addr.String()).Set(0)
	}
	met.peers.Set(float64(len(cfg.Peers)))
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
	peers := len(s.cfg.Peers)
	s.mu.Unlock()
	if err != nil {
		s.stop()
		return err
	}
	s.log.Info("bgp speaker started", zap.Uint32("asn", s.cfg.ASN), zap.Stringer("router_id", s.cfg.RouterID), zap.Int("peers", peers))

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

// start starts BGP in the server made by Run, watches the sessions, adds the
// peers and the paths announced before; s.mu is held.
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

// stop stops the server (see Run) and quiets the session watch.
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
	for addr := range s.peers {
		s.met.sessionUp.WithLabelValues(addr.String()).Set(0)
	}
}
