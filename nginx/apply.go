package nginx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
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
	// configuration and table equal the running ones (or the configuration is the
	// last refused one and the table did not change), ResultTable when only the
	// table (routes, certificates, endpoints) changed and went to nginx without a
	// reload.
	Result   string
	Checksum string
	Problems []model.Problem
	// Digest is the digest of the table nginx uses now (Config.Digest).
	Digest string
	// Render is the time to render. Serve is the time from the reload signal until
	// workers with the new configuration answered, Switch until workers with the
	// old one stopped accepting connections (both zero without a master; without
	// ConfirmTimeout, just the time to send the signal). For ResultTable both are
	// the time to hand the change to nginx, after which every worker uses it.
	Render, Serve, Switch time.Duration
	// Keys is how many keys of the table a change without reload touched.
	Keys int
	// Serving: nginx now runs the snapshot's configuration (its own, not the
	// last good one kept because nginx -t refused the snapshot's).
	Serving bool
}

// ResultUnchanged is ApplyResult.Result when nothing had to be done.
const ResultUnchanged = "unchanged"

// ResultTable is ApplyResult.Result when only the table changed (hosts, paths,
// certificates, endpoints) and nginx took the change without a reload.
const ResultTable = "table"

// ApplyNow renders s and brings nginx to it. A change of the table (routes,
// certificates, endpoints) goes to the running workers through the control
// socket: no nginx -t, no reload. Only a change of nginx.conf (where nginx
// listens, its own settings) is written as a candidate, validated with nginx -t,
// swapped in and reloaded; the workers it replaces keep serving the connections
// they hold (Options.DrainTimeout). New certificates are checked by OpenSSL
// first (checkWithNginx); one it refuses is left out, as one that does not
// parse. When nginx -t refuses the configuration, the running one stays and
// still gets the snapshot's table. Run calls ApplyNow for each change; it is
// exported for callers that need a synchronous apply.
func (r *Reloader) ApplyNow(ctx context.Context, s model.Snapshot) (ApplyResult, error) {
	return r.apply(ctx, s, false)
}

// ResultDeferred is ApplyResult.Result when the table went to nginx at once and
// the reload the snapshot also needs waits for the debounce window (Run).
const ResultDeferred = "deferred"

// apply is ApplyNow; with deferReload, a snapshot that needs a reload gets only its
// table applied, and the result says ResultDeferred.
func (r *Reloader) apply(ctx context.Context, s model.Snapshot, deferReload bool) (ApplyResult, error) {
	r.applyMu.Lock()
	defer r.applyMu.Unlock()

	var res ApplyResult
	fail := func(result string, err error) (ApplyResult, error) {
		res.Result = result
		r.m.reloads.WithLabelValues(result).Inc()
		r.log.Error("nginx config not applied", zap.String("result", result), zap.Error(err))
		return res, err
	}
	var cfg *Config
	for {
		t0 := time.Now()
		var err error
		cfg, err = render(s, r.cfg.Render, r.refused, &r.certCache)
		took := time.Since(t0)
		res.Render += took
		r.m.renderDuration.Observe(took.Seconds())
		if err != nil {
			return fail(ResultError, err)
		}
		res.Checksum, res.Problems, res.Digest = cfg.Checksum, cfg.Problems, cfg.Digest
		r.setProblems(cfg.Problems)
		// OpenSSL can refuse what Go parsed (a key too small for its security
		// level, say): then that certificate is left out, as if it had not
		// parsed, and the snapshot rendered again, so that one bad Secret does not
		// hold back every other change.
		refused, err := r.checkWithNginx(ctx, cfg.Certificates)
		if err != nil {
			return fail(ResultError, err)
		}
		if !refused {
			break
		}
	}
	r.observeCertificates()
	if err := r.writeL4(cfg.L4); err != nil {
		return fail(ResultError, err)
	}
	if bytes.Equal(cfg.Text, r.applied) || bytes.Equal(cfg.Text, r.rejected) {
		// nginx runs this text, or nginx -t refused it already and the last good
		// configuration keeps running: either way the table is all there is to
		// apply.
		res, err := r.updateTable(ctx, cfg, res)
		if err == nil {
			err = r.steer(cfg)
		}
		res.Serving = err == nil && bytes.Equal(cfg.Text, r.applied)
		return res, err
	}
	if deferReload && r.applied != nil {
		res, err := r.updateTable(ctx, cfg, res)
		if err == nil {
			err = r.steer(cfg)
		}
		if err == nil {
			res.Result = ResultDeferred
		}
		return res, err
	}
	if !r.luaWritten {
		if err := writeLuaModule(r.cfg.Dir); err != nil {
			return fail(ResultError, err)
		}
		r.luaWritten = true
	}
	if err := writeFallbackCertificate(resolve(r.cfg.Dir, r.cfg.Render.CertDir)); err != nil {
		return fail(ResultError, err)
	}
	candidate := r.confPath() + ".candidate"
	if err := writeFileAtomic(candidate, cfg.Text, 0o600); err != nil {
		return fail(ResultError, fmt.Errorf("write candidate config: %w", err))
	}
	if err := r.runner.Test(ctx, r.cfg.Dir, candidate); err != nil {
		// Routes, certificates and endpoints do not wait for a configuration nginx
		// accepts: the running one gets the snapshot's table. A failed push is
		// logged and counted; Run tries again.
		result := ResultInvalid
		if unboundAddress(err.Error()) {
			// An L4 Service's VIP not on lo yet (the announcer adds it
			// concurrently): not a verdict on the text, and the error makes the
			// sink try again.
			result = ResultError
		} else {
			r.rejected = cfg.Text
		}
		res, _ = fail(result, err)
		if r.applied != nil {
			var terr error
			if res, terr = r.updateTable(ctx, cfg, res); terr == nil {
				// Routes whose listeners the running configuration lacks
				// are refused, as without a route; a failure is logged.
				_ = r.steer(cfg)
			}
		}
		res.Result, res.Serving = result, false
		return res, err
	}
	r.mu.Lock()
	master := r.master
	r.mu.Unlock()
	// The new configuration loads the table at its reload (or start), when the
	// file is newer than what nginx has (a clock stepped back since must not
	// make it keep its table).
	if master != nil {
		if _, stamp, err := tableState(ctx, r.ctl); err == nil {
			r.lastStamp = max(r.lastStamp, stamp)
		}
	}
	if err := r.writeTable(cfg.Table, cfg.Digest); err != nil {
		return fail(ResultError, err)
	}
	if err := os.Rename(candidate, r.confPath()); err != nil {
		return fail(ResultError, fmt.Errorf("swap config: %w", err))
	}
	r.applied, r.rejected = cfg.Text, nil
	r.appliedTable, r.appliedDigest = cfg.Table, cfg.Digest
	r.forgetRefusals(cfg)
	r.mu.Lock()
	r.checksum = cfg.Checksum
	r.mu.Unlock()
	r.m.configBytes.Set(float64(len(cfg.Text)))

	if master != nil {
		// Until nginx is seen to run it, what it runs is not known: the next
		// apply reloads again, and nothing is reported served meanwhile.
		unknown := func(result string, err error) (ApplyResult, error) {
			r.applied, r.appliedTable, r.appliedDigest = nil, nil, ""
			return fail(result, err)
		}
		var old []Worker
		var err error
		if r.cfg.ConfirmTimeout > 0 {
			if old, err = master.Workers(); err != nil {
				return unknown(ResultError, err)
			}
		}
		r.capDraining(master)
		t1 := time.Now()
		if err := master.Reload(); err != nil {
			return unknown(ResultError, err)
		}
		if r.cfg.ConfirmTimeout > 0 {
			serve, err := r.waitServing(ctx, cfg.Checksum, master)
			if err != nil {
				return unknown(ResultUnconfirmed, err)
			}
			res.Serve = serve
			// nginx lets old and new workers accept side by side for a moment (its
			// master waits 100ms before telling the old ones to quit); the change is
			// complete once none of the old ones accepts any more.
			if err := r.waitOldWorkers(ctx, master, old); err != nil {
				return unknown(ResultUnconfirmed, err)
			}
			// And the master loaded the table.
			if err := r.waitTable(ctx, cfg.Digest); err != nil {
				return unknown(ResultUnconfirmed, err)
			}
			res.Switch = time.Since(t1)
		} else {
			res.Serve = time.Since(t1)
			res.Switch = res.Serve
		}
		r.m.reloadDuration.Observe(res.Switch.Seconds())
	}
	if err := r.steer(cfg); err != nil {
		res.Result = ResultError
		return res, err
	}
	if err := r.pruneL4(cfg.L4); err != nil {
		r.log.Warn("remove stale L4 endpoint files", zap.Error(err))
	}
	res.Result, res.Serving = ResultSuccess, true
	r.m.reloads.WithLabelValues(ResultSuccess).Inc()
	r.m.lastSuccess.SetToCurrentTime()
	r.log.Info("nginx config applied", zap.String("to", cfg.Checksum[:12]),
		zap.Int("bytes", len(cfg.Text)), zap.Int("problems", len(cfg.Problems)), zap.Duration("serve", res.Serve))
	return res, nil
}

// forgetRefusals forgets the refusals of certificates that are gone (a fixed
// Secret has a new file name), so the map stays as small as the set of bad
// Secrets.
func (r *Reloader) forgetRefusals(cfg *Config) {
	for file := range r.refused {
		if !slices.Contains(cfg.refusedSeen, file) {
			delete(r.refused, file)
		}
	}
}

// updateTable brings the running nginx's table to cfg's: it sends the change from
// the table nginx has, which every worker uses from its next request on. When
// nginx's table is not the one the change was made from (a master this agent
// adopted, or one that restarted), nginx is reloaded, which loads the whole table
// from its file; its workers keep their connections.
func (r *Reloader) updateTable(ctx context.Context, cfg *Config, res ApplyResult) (ApplyResult, error) {
	// The tables, not their digests: a digest is an XOR of public hashes, which
	// someone who chooses many hosts could make collide.
	if r.appliedTable != nil && maps.Equal(cfg.Table, r.appliedTable) {
		res.Result = ResultUnchanged
		return res, nil
	}
	t0 := time.Now()
	fail := func(err error) (ApplyResult, error) {
		res.Result = ResultError
		r.m.tableUpdates.WithLabelValues(ResultError).Inc()
		r.log.Error("nginx table not updated", zap.Error(err))
		return res, err
	}
	r.mu.Lock()
	master := r.master
	r.mu.Unlock()
	if master == nil {
		// The next master loads the file.
		if err := r.writeTable(cfg.Table, cfg.Digest); err != nil {
			return fail(err)
		}
	} else {
		err := errStaleBase
		if r.appliedTable != nil {
			var text []byte
			text, res.Keys = cfg.Table.delta(r.appliedTable, r.appliedDigest, cfg.Digest, r.stamp())
			err = pushDelta(ctx, r.ctl, text, cfg.Digest)
		}
		if errors.Is(err, errStaleBase) {
			r.log.Info("nginx has another table than this agent applied: reloading it with the whole table", zap.Error(err))
			err = r.reloadTable(ctx, master, cfg)
		}
		if err != nil {
			return fail(err)
		}
	}
	r.appliedTable, r.appliedDigest = cfg.Table, cfg.Digest
	r.forgetRefusals(cfg)
	if err := r.pruneL4(cfg.L4); err != nil {
		r.log.Warn("remove stale L4 endpoint files", zap.Error(err))
	}
	res.Result = ResultTable
	res.Serve = time.Since(t0)
	res.Switch = res.Serve
	r.m.tableUpdates.WithLabelValues(ResultSuccess).Inc()
	r.m.tableUpdateDuration.Observe(res.Serve.Seconds())
	r.log.Info("nginx table updated", zap.String("to", cfg.Digest), zap.Int("keys", res.Keys),
		zap.Duration("serve", res.Serve))
	return res, nil
}

// reloadTable writes the whole table and reloads nginx, whose master loads it,
// and waits until nginx uses it.
func (r *Reloader) reloadTable(ctx context.Context, master Master, cfg *Config) error {
	// nginx keeps a table newer than the file's stamp: a clock stepped back since
	// it got its table must not leave it with that one.
	if _, stamp, err := tableState(ctx, r.ctl); err == nil {
		r.lastStamp = max(r.lastStamp, stamp)
	}
	if err := r.writeTable(cfg.Table, cfg.Digest); err != nil {
		return err
	}
	r.capDraining(master)
	if err := master.Reload(); err != nil {
		return err
	}
	return r.waitTable(ctx, cfg.Digest)
}

// waitTable waits until nginx's workers use the table with that digest.
func (r *Reloader) waitTable(ctx context.Context, digest string) error {
	ctx, cancel := context.WithTimeout(ctx, max(r.cfg.ConfirmTimeout, time.Second))
	defer cancel()
	for {
		got, err := tableDigest(ctx, r.ctl)
		if err == nil && got == digest {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for nginx to load table %s: %w (last answer %q, %v)", digest, ctx.Err(), got, err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// writeTable writes the whole table where nginx loads it at every start and
// reload. It holds private keys: only root (the master) reads it.
func (r *Reloader) writeTable(t table, digest string) error {
	if err := writeFileAtomic(r.tablePath(), t.encode(digest, r.stamp()), 0o600); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	r.fileDigest = digest
	return nil
}

// fileBehind reports whether the table file lacks the table nginx uses.
func (r *Reloader) fileBehind() bool {
	r.applyMu.Lock()
	defer r.applyMu.Unlock()
	return r.appliedTable != nil && r.fileDigest != r.appliedDigest
}

// flushTable writes the table nginx uses to its file, unless the file has it.
// Run calls it once changes stop coming: a start or reload writes the file
// first anyway, but an agent that restarts compares it with what nginx has
// (adoptRunning).
func (r *Reloader) flushTable() {
	r.applyMu.Lock()
	defer r.applyMu.Unlock()
	if r.appliedTable == nil || r.fileDigest == r.appliedDigest {
		return
	}
	if err := r.writeTable(r.appliedTable, r.appliedDigest); err != nil {
		r.log.Warn("write the table nginx uses", zap.Error(err))
	}
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

// unboundAddress reports whether nginx -t failed to bind a listen address that
// is not (yet) this node's.
func unboundAddress(msg string) bool {
	return strings.Contains(msg, "bind() to ") && strings.Contains(msg, "(99: ")
}

// nginxReason extracts the "[emerg] ..." part of an nginx -t failure.
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
