package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"
	"k8s.io/client-go/kubernetes"
)

// Run runs the agent until ctx ends, then releases the VIPs and stops. The XDP
// program stays attached and its maps pinned, so forwarding goes on while the
// agent restarts; unless the agent's DaemonSet was deleted (owner.go): then it
// detaches xdp_lb, removes every pin, its VIPs from lo and restores the sysctls.
// The node's lock (lockNode) is held throughout.
func Run(ctx context.Context, cfg Config, log *zap.Logger) error {
	lock, err := lockNode(ctx, cfg.StateDir, log)
	if err != nil {
		return err
	}
	defer lock.Close()
	var owner *ownerWatch
	if cfg.Pod != "" {
		client, err := kubernetes.NewForConfig(cfg.Kube)
		if err != nil {
			return fmt.Errorf("kubernetes client: %w", err)
		}
		if owner, err = watchOwner(client, cfg.Pod, log.Named("owner")); err != nil {
			return err
		}
		defer owner.stop()
	}
	runErr := run(ctx, cfg, log)
	if owner == nil {
		log.Info("agent stopped; xdp_lb stays attached (portico uninstall removes it)")
		return runErr
	}
	owner.wait(5 * time.Second)
	gone, why := owner.uninstalling()
	if !gone {
		log.Info("agent stopped; xdp_lb stays attached (portico uninstall removes it)", zap.String("reason", why))
		return runErr
	}
	log.Info("agent stopped and its DaemonSet is gone: undoing the node", zap.String("reason", why))
	if err := undoNode(cfg.PinPath, cfg.StateDir); err != nil {
		return errors.Join(runErr, fmt.Errorf("undo the node: %w", err))
	}
	log.Info("node undone: xdp_lb detached, its pins removed, the VIPs off lo, the sysctls restored", zap.String("pins", cfg.PinPath))
	return runErr
}

// run is Run until the agent has stopped and closed its handles on xdp_lb and
// the steering program (their pins stay).
func run(ctx context.Context, cfg Config, log *zap.Logger) error {
	a, err := newAgent(ctx, cfg, log)
	if err != nil {
		return err
	}
	if err := a.buildDataplane(); err != nil {
		return err
	}
	defer a.dp.Close() // pins stay: forwarding goes on while the agent restarts
	err = a.buildNginx()
	if a.steer != nil {
		defer a.steer.Close() // pins stay: steering goes on while the agent restarts
	}
	if err != nil {
		return err
	}
	a.buildL4()
	if cfg.Sites != "" {
		a.buildSites()
	}
	if cfg.LivenessPort != 0 {
		if err := a.buildLiveness(); err != nil {
			return err
		}
	}
	// The announcer: VRRP (one owner) or BGP (every edge).
	switch cfg.Announce {
	case "bgp":
		err = a.buildBGP()
	default:
		err = a.buildVRRP(ctx)
	}
	if err != nil {
		return err
	}
	if err := a.buildControlplane(); err != nil {
		return err
	}
	if err := a.buildHeld(); err != nil {
		return err
	}
	a.buildHealth()
	ln, err := net.Listen("tcp", cfg.MetricsAddr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.MetricsAddr, err)
	}
	return a.run(ctx, ln)
}

// part is one of the agent's goroutines; name says which in its errors.
type part struct {
	name string
	run  func(context.Context) error
}

// parts are the agent's goroutines, in the order they start.
func (a *agent) parts() []part {
	ps := []part{
		{"nginx", a.runNginx},
		{"controlplane", a.ctrl.Run},
		{"neighbours", a.l4.watchNeighbours},
	}
	if a.checker != nil {
		ps = append(ps, part{"liveness", a.checker.Run}, part{"liveness-follow", a.l4.followLiveness})
	}
	ps = append(ps, part{"transitions", a.l4.expireTransitions})
	if a.held != nil {
		ps = append(ps, part{"held", a.held.run})
	}
	if a.l4.sites != nil {
		ps = append(ps,
			part{"sites", func(ctx context.Context) error { return a.l4.sites.watch(ctx, a.l4.reapply, a.l4.handoverDraining) }},
			part{"overflow", a.l4.followLoad})
	}
	ps = append(ps, a.ann.parts...)
	return append(ps,
		part{"health", func(ctx context.Context) error { a.health.loop(ctx, a.ann.setHealthy, a.log); return nil }},
		part{"status", a.publishStatus})
}

// run starts the parts and serves /metrics, /healthz and /readyz on ln until
// ctx ends or a part fails, then stops in order: unready but still serving for
// cfg.ShutdownDelay, the VIPs released, the parts stopped, the server shut down.
// It returns the first part's failure.
func (a *agent) run(ctx context.Context, ln net.Listener) error {
	mux := a.health.mux(a.reg, a.cfg.Pprof)
	if a.held != nil {
		mux.HandleFunc(heldPath, a.held.serveHTTP)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	// Everything but VRRP stops when ctx ends; VRRP is released first.
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	var wg sync.WaitGroup
	// The first failure stops the agent; later ones (during shutdown) are only
	// logged, so no goroutine ever blocks on errc.
	errc := make(chan error, 1)
	for _, p := range a.parts() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.run(runCtx); err != nil && !errors.Is(err, context.Canceled) {
				select {
				case errc <- fmt.Errorf("%s: %w", p.name, err):
				default:
					a.log.Error("agent part failed", zap.String("part", p.name), zap.Error(err))
				}
			}
		}()
	}
	go srv.Serve(ln)
	a.log.Info("agent started", zap.String("iface", a.cfg.Iface), zap.String("metrics", a.cfg.MetricsAddr))

	runErr := a.wait(ctx, errc)
	// Then priority-0 release (a Backup takes over after its skew time; with BGP
	// the speaker stops with the rest, a graceful restart for its peers), then
	// nginx finishes in-flight requests, then the rest.
	a.health.stopping.Store(true)
	a.log.Info("releasing VIPs")
	a.ann.release()
	cancel()
	wg.Wait()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	srv.Shutdown(sctx)
	return runErr
}

// wait returns when a part fails (with its error) or, once ctx ends, after
// cfg.ShutdownDelay spent unready but still serving (or at a failure then).
func (a *agent) wait(ctx context.Context, errc <-chan error) error {
	var runErr error
	select {
	case <-ctx.Done():
		// Unready first, still serving: Kubernetes marks the endpoint terminating,
		// every edge stops giving this replica new flows, its flows finish. With
		// BGP, the routes are de-preferenced now: routers move flows to the other
		// edges, which steer them to the same replicas.
		a.health.stopping.Store(true)
		if a.ann.deprefer != nil {
			a.ann.deprefer()
		}
		a.log.Info("agent stopping: unready, still serving", zap.Duration("delay", a.cfg.ShutdownDelay))
		select {
		case <-time.After(a.cfg.ShutdownDelay):
		case runErr = <-errc:
		}
	case runErr = <-errc:
		a.log.Error("agent stopping", zap.Error(runErr))
	}
	return runErr
}
