package nginx

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/portico-edge/portico/controlplane/model"
)

// ApplyResult says what Apply did.
type ApplyResult struct {
	// Result is one of the Result* constants: ResultUnchanged when the rendered
	// configuration and endpoints equal the running ones (or the configuration is
	// the last refused one and the running one's endpoints did not change),
	// ResultEndpoints when only the endpoint table went to nginx.
	Result   string
	Checksum string
	Problems []model.Problem
	// EndpointsVersion is the version of the snapshot's endpoint table
	// (Config.EndpointsVersion); when nginx -t refused the configuration, of the
	// table for the running configuration's upstreams, with the snapshot's
	// endpoints.
	EndpointsVersion string
	// Render is the time to render. Serve is the time from the reload signal until
	// workers with the new configuration answered, Switch until workers with the
	// old one stopped accepting connections (both zero without a master; without
	// ConfirmTimeout, just the time to send the signal). For ResultEndpoints both
	// are the time to write the table and hand it to nginx, after which every
	// worker uses it.
	Render, Serve, Switch time.Duration
	// Serving: nginx now runs the snapshot's configuration (its own, not the
	// last good one kept because nginx -t refused the snapshot's).
	Serving bool
}

// ResultUnchanged is ApplyResult.Result when nothing had to be done.
const ResultUnchanged = "unchanged"

// ResultEndpoints is ApplyResult.Result when only endpoints changed and nginx took
// the new endpoint table without a reload.
const ResultEndpoints = "endpoints"

// ApplyNow renders s and, when the result differs from the running configuration,
// writes its certificates, the Lua module (the first time) and a candidate, validates it with nginx
// -t, writes the endpoint table, swaps the candidate in and signals the master (if
// one runs). When only endpoints changed, it writes the endpoint table and hands it
// to the running nginx instead: no nginx -t, no reload. When nginx -t refuses the configuration,
// the running one stays and gets the snapshot's endpoints for its upstreams. Run
// calls it after each debounce window; it is exported for callers that need a
// synchronous apply.
func (r *Reloader) ApplyNow(ctx context.Context, s model.Snapshot) (ApplyResult, error) {
	r.applyMu.Lock()
	defer r.applyMu.Unlock()

	var res ApplyResult
	fail := func(result string, err error) (ApplyResult, error) {
		res.Result = result
		r.m.reloads.WithLabelValues(result).Inc()
		r.log.Error("nginx config not applied", zap.String("result", result), zap.Error(err))
		return res, err
	}
	certDir := resolve(r.cfg.Dir, r.cfg.Render.CertDir)
	candidate := r.confPath() + ".candidate"
	var cfg *Config
	var err error
	// Render, and test what nginx does not run yet. OpenSSL can refuse what Go
	// parsed (a key too small for its security level, say): then that certificate
	// is left out, as if it had not parsed, and the snapshot rendered again, so
	// that one bad Secret does not hold back every other change.
	for {
		t0 := time.Now()
		cfg, err = render(s, r.cfg.Render, r.refused, &r.certCache)
		took := time.Since(t0)
		res.Render += took
		r.m.renderDuration.Observe(took.Seconds())
		if err != nil {
			return fail(ResultError, err)
		}
		res.Checksum, res.Problems, res.EndpointsVersion = cfg.Checksum, cfg.Problems, cfg.EndpointsVersion
		r.setProblems(cfg.Problems)
		if bytes.Equal(cfg.Text, r.rejected) {
			// nginx -t refused this text already: the last good configuration keeps
			// running, with the snapshot's endpoints for its upstreams.
			return r.keepRunning(ctx, s, res)
		}
		if bytes.Equal(cfg.Text, r.applied) {
			res, err := r.updateEndpoints(ctx, cfg.Endpoints, cfg.EndpointsVersion, cfg.table, res)
			res.Serving = err == nil
			return res, err
		}
		// Keep the running configuration's files until the new one has replaced it.
		if err := addCertificates(certDir, cfg.Certificates); err != nil {
			return fail(ResultError, err)
		}
		if !r.luaWritten {
			if err := writeLuaModule(r.cfg.Dir); err != nil {
				return fail(ResultError, err)
			}
			r.luaWritten = true
		}
		if err := writeFileAtomic(candidate, cfg.Text, 0o600); err != nil {
			return fail(ResultError, fmt.Errorf("write candidate config: %w", err))
		}
		err = r.runner.Test(ctx, r.cfg.Dir, candidate)
		if err == nil {
			break
		}
		if unboundAddress(err.Error()) {
			// An L4 Service's VIP not on lo yet (the announcer adds it
			// concurrently): not a verdict on the text. The running configuration
			// stays, and the error makes the sink try again.
			res, _ = fail(ResultError, err)
			res, _ = r.keepRunning(ctx, s, res)
			res.Result = ResultError
			return res, err
		}
		file := blamedCertificate(cfg, err.Error())
		if file == "" || r.refused[file] != "" {
			r.rejected = cfg.Text
			res, _ = fail(ResultInvalid, err)
			// Endpoint changes must not wait for a configuration nginx accepts.
			// A failed push is logged and counted; Run tries again.
			res, _ = r.keepRunning(ctx, s, res)
			res.Result = ResultInvalid
			return res, err
		}
		if r.refused == nil {
			r.refused = map[string]string{}
		}
		r.refused[file] = nginxReason(err.Error())
	}
	// The new configuration loads the table at its reload (or start); the old
	// workers, which accept for a moment after the reload, read it too.
	table, _ := cfg.table.with(r.appliedTable).encode()
	if err := writeFileAtomic(r.endpointsPath(), table, 0o644); err != nil {
		return fail(ResultError, fmt.Errorf("write endpoint table: %w", err))
	}
	if err := os.Rename(candidate, r.confPath()); err != nil {
		return fail(ResultError, fmt.Errorf("swap config: %w", err))
	}
	r.applied, r.rejected = cfg.Text, nil
	r.appliedEndpoints, r.appliedTable = cfg.Endpoints, cfg.table
	// Forget refusals of certificates that are gone (a fixed Secret has a new file
	// name), so the map stays as small as the set of bad Secrets.
	for file := range r.refused {
		if !slices.Contains(cfg.refusedSeen, file) {
			delete(r.refused, file)
		}
	}
	r.mu.Lock()
	r.checksum = cfg.Checksum
	master := r.master
	r.mu.Unlock()
	r.m.configBytes.Set(float64(len(cfg.Text)))

	if master != nil {
		var old []Worker
		if r.cfg.ConfirmTimeout > 0 {
			if old, err = master.Workers(); err != nil {
				return fail(ResultError, err)
			}
		}
		t1 := time.Now()
		if err := master.Reload(); err != nil {
			return fail(ResultError, err)
		}
		if r.cfg.ConfirmTimeout > 0 {
			serve, err := r.waitServing(ctx, cfg.Checksum, master)
			if err != nil {
				return fail(ResultUnconfirmed, err)
			}
			res.Serve = serve
			// nginx lets old and new workers accept side by side for a moment (its
			// master waits 100ms before telling the old ones to quit); the change is
			// complete once none of the old ones accepts any more.
			if err := r.waitOldWorkers(ctx, master, old); err != nil {
				return fail(ResultUnconfirmed, err)
			}
			res.Switch = time.Since(t1)
		} else {
			res.Serve = time.Since(t1)
			res.Switch = res.Serve
		}
		r.m.reloadDuration.Observe(res.Switch.Seconds())
	}
	if err := WriteCertificates(certDir, cfg.Certificates); err != nil {
		r.log.Warn("remove stale certificates", zap.Error(err))
	}
	res.Result, res.Serving = ResultSuccess, true
	r.m.reloads.WithLabelValues(ResultSuccess).Inc()
	r.m.lastSuccess.SetToCurrentTime()
	r.log.Info("nginx config applied", zap.String("to", cfg.Checksum[:12]),
		zap.Int("bytes", len(cfg.Text)), zap.Int("problems", len(cfg.Problems)), zap.Duration("serve", res.Serve))
	return res, nil
}

// keepRunning applies s while nginx -t refuses its configuration: the last good
// configuration keeps running, and its upstreams get the endpoints s gives them now
// (none for an upstream s no longer has). One refused object must not freeze the
// endpoints of every host. res.EndpointsVersion becomes that table's version.
func (r *Reloader) keepRunning(ctx context.Context, s model.Snapshot, res ApplyResult) (ApplyResult, error) {
	if r.applied == nil {
		// Nothing runs yet: the table of whatever starts is written with it.
		res.Result = ResultUnchanged
		return res, nil
	}
	table := r.appliedTable.refresh(s)
	text, version := table.encode()
	res.EndpointsVersion = version
	return r.updateEndpoints(ctx, text, version, table, res)
}

// updateEndpoints applies an endpoint table (text, its version and table decoded)
// for the configuration nginx already runs: unless nginx has that table too, it
// writes it (for the next start or reload) and hands it to the running nginx
// through the control socket.
func (r *Reloader) updateEndpoints(ctx context.Context, text []byte, version string, table endpointTable, res ApplyResult) (ApplyResult, error) {
	if bytes.Equal(text, r.appliedEndpoints) {
		res.Result = ResultUnchanged
		return res, nil
	}
	t0 := time.Now()
	fail := func(err error) (ApplyResult, error) {
		res.Result = ResultError
		r.m.endpointUpdates.WithLabelValues(ResultError).Inc()
		r.log.Error("nginx endpoints not updated", zap.Error(err))
		return res, err
	}
	if err := writeFileAtomic(r.endpointsPath(), text, 0o644); err != nil {
		return fail(fmt.Errorf("write endpoint table: %w", err))
	}
	r.mu.Lock()
	master := r.master
	r.mu.Unlock()
	// Without a master, the next one loads the file.
	if master != nil {
		if err := pushEndpoints(ctx, r.ctl, text, version); err != nil {
			return fail(err)
		}
	}
	r.appliedEndpoints, r.appliedTable = text, table
	res.Result = ResultEndpoints
	res.Serve = time.Since(t0)
	res.Switch = res.Serve
	r.m.endpointUpdates.WithLabelValues(ResultSuccess).Inc()
	r.m.endpointUpdateDuration.Observe(res.Serve.Seconds())
	r.log.Info("nginx endpoints updated", zap.String("to", version), zap.Int("upstreams", len(table)),
		zap.Duration("serve", res.Serve))
	return res, nil
}

func (r *Reloader) setProblems(ps []model.Problem) {
	r.mu.Lock()
	same := slices.Equal(r.problems, ps)
	r.problems = ps
	r.mu.Unlock()
	if same {
		return
	}
	counts := map[model.Reason]int{}
	for _, p := range ps {
		counts[p.Reason]++
	}
	r.m.problems.Reset()
	for reason, n := range counts {
		r.m.problems.WithLabelValues(string(reason)).Set(float64(n))
	}
	for _, p := range ps {
		r.log.Warn("object left out of nginx config", zap.String("object", p.Object), zap.String("field", p.Field),
			zap.String("reason", string(p.Reason)), zap.String("detail", p.Detail))
	}
}

// nginxReason extracts the "[emerg] ..." part of an nginx -t failure.
// unboundAddress reports whether nginx -t failed to bind a listen address that
// is not (yet) this node's.
func unboundAddress(msg string) bool {
	return strings.Contains(msg, "bind() to ") && strings.Contains(msg, "(99: ")
}

func nginxReason(msg string) string {
	if i := strings.Index(msg, "[emerg] "); i >= 0 {
		msg = msg[i+len("[emerg] "):]
		// Drop "pid#tid: ", which changes with every run.
		if j := strings.Index(msg, ": "); j >= 0 && strings.Trim(msg[:j], "0123456789#") == "" {
			msg = msg[j+2:]
		}
	}
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		msg = msg[:i]
	}
	return msg
}
