package nginx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/portico-edge/portico/controlplane/model"
)

// adoptRunning takes the configuration on disk as applied when the adopted
// master's workers serve it (they answer /healthz with the checksum written in
// it): a first snapshot that renders the same text then reloads nothing, so an
// agent restart or upgrade leaves nginx, and its clients' kept-alive
// connections, alone. Anything else (a file swapped by an agent that died
// before its reload) is reloaded as before.
func (r *Reloader) adoptRunning(ctx context.Context) {
	text, err := os.ReadFile(r.confPath())
	if err != nil {
		return
	}
	hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	sum, err := Health(hctx, r.client, r.healthURL())
	if err != nil || len(sum) < 16 || !bytes.Contains(text, []byte("return 200 \""+sum+"\\n\"")) {
		r.log.Info("adopted nginx serves another configuration than the one on disk: the first snapshot reloads it", zap.Error(err))
		return
	}
	r.applyMu.Lock()
	r.applied = text
	// The table too, when nginx has the one in the file: changes then go to it
	// as deltas, without a reload.
	if b, err := os.ReadFile(r.tablePath()); err == nil {
		if t, digest := decodeTable(b); t != nil {
			if got, stamp, err := tableState(hctx, r.ctl); err == nil && got == digest {
				r.appliedTable, r.appliedDigest, r.fileDigest = t, digest, digest
				r.lastStamp = max(r.lastStamp, stamp)
			}
		}
	}
	r.applyMu.Unlock()
	r.mu.Lock()
	r.checksum = sum
	r.mu.Unlock()
	r.log.Info("adopted nginx serves the configuration on disk", zap.String("checksum", sum))
}

// tableFlushDelay is how long after a change of the table Run writes the table
// to its file: changes that come in a burst are written once.
const tableFlushDelay = time.Second

// served tells OnServed that nginx serves s.
func (r *Reloader) served(s model.Snapshot) {
	if r.cfg.OnServed != nil {
		r.cfg.OnServed(s)
	}
}

// Run starts nginx with the pending snapshot (or an empty one), applies updates
// until ctx ends, restarts the master whenever it dies, and stops it on return.
func (r *Reloader) Run(ctx context.Context) error {
	if err := prepareDirs(r.cfg.Dir, r.cfg.Render); err != nil {
		return err
	}
	if d := unsearchable(resolve(r.cfg.Dir, r.cfg.Render.L4Dir)); d != "" {
		r.log.Warn("nginx's workers cannot reach the L4 endpoint files: L4 Services will close every connection",
			zap.String("directory", d), zap.String("fix", "make it searchable by others (chmod o+x)"))
	}
	r.mu.Lock()
	first := r.pending
	r.pending = nil
	r.mu.Unlock()
	if first == nil {
		first = &model.Snapshot{}
	}
	defer r.stop() // whichever master runs by then, started or adopted
	if r.tel != nil {
		go r.runTelemetry(ctx)
	}

	// A master an earlier agent left behind keeps its listening sockets: take it
	// over and reload it rather than start a second one that cannot bind.
	if m, err := r.runner.Find(r.confPath(), resolve(r.cfg.Dir, r.cfg.Render.PIDFile)); err != nil {
		r.log.Warn("look for a running nginx master", zap.Error(err))
	} else if m != nil {
		r.mu.Lock()
		r.master = m
		r.mu.Unlock()
		r.log.Info("adopted running nginx master", zap.Int("pid", m.PID()))
		r.adoptRunning(ctx)
	}
	res, err := r.ApplyNow(ctx, *first)
	if ctx.Err() != nil {
		return nil
	}
	if _, statErr := os.Stat(r.confPath()); err != nil && statErr != nil {
		// Nothing valid on disk yet: start with no routes (every host closed)
		// rather than not at all; the next snapshot may be fine.
		if _, err := r.ApplyNow(ctx, model.Snapshot{}); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("write first nginx config: %w", err)
		}
	}
	if r.MasterPID() == 0 {
		if err := r.start(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	if err == nil && res.Serving {
		r.served(*first)
	}

	var debounce <-chan time.Time
	var restart <-chan time.Time
	retrying := false // debounce is the pause before trying a failed apply again
	var flush <-chan time.Time
	defer r.flushTable()
	for {
		r.mu.Lock()
		master := r.master
		r.mu.Unlock()
		var died <-chan struct{}
		if master != nil {
			died = master.Done()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-r.kick:
			// A change of the table is applied at once; one that needs a
			// reload gets its table now and its reload after the debounce
			// window, which coalesces reloads.
			r.mu.Lock()
			s := r.pending
			r.mu.Unlock()
			if s == nil || debounce != nil && retrying {
				continue
			}
			res, err := r.apply(ctx, *s, true)
			if flush == nil && r.fileBehind() {
				flush = time.After(tableFlushDelay)
			}
			switch {
			case err != nil && ctx.Err() == nil:
				retrying = true
				debounce = time.After(r.cfg.RestartBackoff)
			case err == nil && res.Result == ResultDeferred:
				if debounce == nil {
					r.mu.Lock()
					wait := r.cfg.Debounce - time.Since(r.reloadedAt)
					r.mu.Unlock()
					debounce = time.After(max(wait, 0))
				}
			case err == nil:
				r.mu.Lock()
				if r.pending == s {
					r.pending = nil
				}
				r.mu.Unlock()
				if res.Serving {
					r.served(*s)
				}
			}
		case <-debounce:
			debounce, retrying = nil, false
			r.mu.Lock()
			s := r.pending
			r.pending = nil
			if s != nil {
				r.reloadedAt = time.Now()
			}
			r.mu.Unlock()
			if s != nil {
				// Apply logs and counts its own failures. A failed one is tried
				// again (unless a newer snapshot came): a refused configuration is
				// remembered and cheap to skip, and a table that did not reach
				// nginx must not wait for the next change.
				res, err := r.ApplyNow(ctx, *s)
				if flush == nil && r.fileBehind() {
					flush = time.After(tableFlushDelay)
				}
				if err == nil && res.Serving {
					r.served(*s)
				}
				if err != nil && ctx.Err() == nil {
					r.mu.Lock()
					if r.pending == nil {
						r.pending = s
					}
					r.mu.Unlock()
					retrying = true
					debounce = time.After(r.cfg.RestartBackoff)
				}
			}
		case <-flush:
			flush = nil
			r.flushTable()
		case <-died:
			r.log.Error("nginx master exited; restarting", zap.Int("pid", master.PID()), zap.Duration("backoff", r.cfg.RestartBackoff))
			r.m.restarts.Inc()
			r.mu.Lock()
			r.master = nil
			r.mu.Unlock()
			restart = time.After(r.cfg.RestartBackoff)
		case <-restart:
			restart = nil
			if err := r.start(ctx); err != nil {
				r.log.Error("restart nginx", zap.Error(err))
				restart = time.After(r.cfg.RestartBackoff)
			}
		}
	}
}

func (r *Reloader) start(ctx context.Context) error {
	// A master that was killed leaves its control socket behind, and nginx does
	// not bind over an existing one.
	if err := os.Remove(resolve(r.cfg.Dir, r.cfg.Render.ControlSocket)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("start nginx: remove stale control socket: %w", err)
	}
	// The table file has what nginx had at its last start or reload; the
	// changes since went to the master that died.
	r.applyMu.Lock()
	t, digest := r.appliedTable, r.appliedDigest
	var err error
	if t != nil {
		err = r.writeTable(t, digest)
	}
	r.applyMu.Unlock()
	if err != nil {
		return fmt.Errorf("start nginx: %w", err)
	}
	m, err := r.runner.Start(r.cfg.Dir, r.confPath())
	if err != nil {
		return fmt.Errorf("start nginx: %w", err)
	}
	r.mu.Lock()
	r.master, r.reloadedAt = m, time.Now()
	sum := r.checksum
	r.mu.Unlock()
	r.log.Info("nginx master started", zap.Int("pid", m.PID()))
	if r.cfg.ConfirmTimeout > 0 {
		if _, err := r.waitServing(ctx, sum, m); err != nil {
			r.stop()
			return fmt.Errorf("start nginx: %w", err)
		}
	}
	if r.cfg.SteerL4 != nil {
		// A new master has new listeners: the routes nginx serves now point at
		// them (the last apply's, or none before the first).
		r.applyMu.Lock()
		routes := r.steered
		if err := r.cfg.SteerL4(m.PID(), routes); err != nil {
			r.log.Error("L4 routes not steered to the new nginx master; the next change tries again", zap.Error(err))
		} else {
			r.listenersOf, r.listenersText = m.PID(), r.applied
		}
		r.applyMu.Unlock()
	}
	return nil
}

func (r *Reloader) stop() {
	r.mu.Lock()
	m := r.master
	r.master = nil
	r.mu.Unlock()
	if m == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.StopTimeout)
	defer cancel()
	if err := m.Stop(ctx); err != nil {
		r.log.Error("stop nginx", zap.Error(err))
		return
	}
	r.log.Info("nginx master stopped", zap.Int("pid", m.PID()))
}
