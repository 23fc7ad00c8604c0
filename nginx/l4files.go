package nginx

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"go.uber.org/zap"
)

// steer hands the routes of the steered listeners to SteerL4, then removes the
// files of routes that are gone: a route leaves the sk_lookup program before
// its file, as it came after it (writeL4).
func (r *Reloader) steer(cfg *Config) error {
	if r.cfg.SteerL4 == nil {
		return nil
	}
	pid := 0
	r.mu.Lock()
	if r.master != nil {
		pid = r.master.PID()
	}
	r.mu.Unlock()
	// The listeners change only with the master or its configuration: a
	// change of routes alone does not look for them again.
	register := 0
	if pid != 0 && (pid != r.listenersOf || !bytes.Equal(r.applied, r.listenersText)) {
		register = pid
	}
	r.steered = cfg.L4Routes
	if err := r.cfg.SteerL4(register, cfg.L4Routes); err != nil {
		r.m.reloads.WithLabelValues(ResultError).Inc()
		r.log.Error("L4 routes not steered", zap.Error(err))
		return fmt.Errorf("steer L4 routes: %w", err)
	}
	if register != 0 {
		r.listenersOf, r.listenersText = register, r.applied
	}
	if err := r.pruneSteered(cfg.L4); err != nil {
		r.log.Warn("remove stale L4 route files", zap.Error(err))
	}
	return nil
}

// pruneSteered removes the files of steered routes that L4 no longer has.
func (r *Reloader) pruneSteered(files map[string][]byte) error {
	return pruneDir(filepath.Join(resolve(r.cfg.Dir, r.cfg.Render.L4Dir), steeredDir), func(name string) bool {
		_, ok := files[steeredDir+"/"+name]
		return ok
	})
}

// writeL4 writes the L4 Service ports' endpoint files that changed. A file is
// replaced by a rename, so a worker reads the old list or the new one.
func (r *Reloader) writeL4(files map[string][]byte) error {
	dir := resolve(r.cfg.Dir, r.cfg.Render.L4Dir)
	if len(files) == 0 {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create L4 endpoint directory: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, steeredDir), 0o755); err != nil {
		return fmt.Errorf("create L4 route directory: %w", err)
	}
	for name, b := range files {
		if err := writeFileIfChanged(filepath.Join(dir, name), b, 0o644); err != nil {
			return fmt.Errorf("write L4 endpoints of %s: %w", name, err)
		}
	}
	return nil
}

// pruneL4 removes the endpoint files of ports the running configuration no
// longer has.
func (r *Reloader) pruneL4(files map[string][]byte) error {
	return pruneDir(resolve(r.cfg.Dir, r.cfg.Render.L4Dir), func(name string) bool {
		_, ok := files[name]
		return ok
	})
}

// pruneDir removes the files of dir (not its directories) that keep refuses.
func pruneDir(dir string, keep func(name string) bool) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if !e.IsDir() && !keep(e.Name()) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
