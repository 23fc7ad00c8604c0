package nginx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/portico-edge/portico/controlplane/model"
)

// ReloaderConfig configures a Reloader.
type ReloaderConfig struct {
	// Dir is nginx's prefix: it holds nginx.conf, the candidate and, with relative
	// Render paths, the pid file, temporary files and certificates.
	Dir string
	// Render are the render options; relative paths are relative to Dir.
	Render Options
	// Debounce is how long changes are collected before one reload (seed 004 used
	// 2 s chunks). Zero means DefaultDebounce.
	Debounce time.Duration
	// ConfirmTimeout bounds the wait, after a start or reload, for workers with the
	// new configuration to answer on the status port and for the old ones to stop
	// accepting. Zero means 10s; a negative value skips the wait (for fake runners).
	ConfirmTimeout time.Duration
	// RestartBackoff is the pause before starting a master that died. Zero means 1s.
	RestartBackoff time.Duration
	// StopTimeout bounds the graceful shutdown on exit before nginx is killed. Zero
	// means 30s.
	StopTimeout time.Duration
}

// DefaultDebounce is the default coalescing window for configuration changes.
const DefaultDebounce = 500 * time.Millisecond

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
}

// ResultUnchanged is ApplyResult.Result when nothing had to be done.
const ResultUnchanged = "unchanged"

// ResultEndpoints is ApplyResult.Result when only endpoints changed and nginx took
// the new endpoint table without a reload.
const ResultEndpoints = "endpoints"

// Reloader keeps a supervised nginx master serving the latest snapshot: it renders,
// skips unchanged configurations, validates candidates with nginx -t, swaps them in
// atomically and signals a reload; a candidate that fails validation is reported and
// the last good configuration keeps running.
type Reloader struct {
	cfg    ReloaderConfig
	runner Runner
	log    *zap.Logger
	m      *metrics
	client *http.Client
	ctl    *http.Client // to the control socket

	kick chan struct{}

	mu       sync.Mutex // guards pending, master, status
	pending  *model.Snapshot
	master   Master
	problems []model.Problem
	checksum string // of the configuration in nginx.conf

	applyMu  sync.Mutex        // serialises Apply
	applied  []byte            // text of nginx.conf
	rejected []byte            // text of the last candidate nginx -t refused
	certs    []string          // certificate files nginx.conf uses
	refused  map[string]string // certificate files nginx -t refused, and why
	// certCache keeps certificate checks from one render to the next.
	certCache certCache
	// appliedEndpoints is the endpoint table for applied (what the snapshot asked
	// for; the file may hold more, see endpointTable.with), appliedTable decoded.
	appliedEndpoints []byte
	appliedTable     endpointTable
}

// NewReloader returns a Reloader; Run starts nginx.
func NewReloader(cfg ReloaderConfig, runner Runner, log *zap.Logger, reg prometheus.Registerer) (*Reloader, error) {
	if cfg.Dir == "" {
		return nil, errors.New("new nginx reloader: no directory")
	}
	if err := cfg.Render.validate(); err != nil {
		return nil, fmt.Errorf("new nginx reloader: %w", err)
	}
	if cfg.Debounce <= 0 {
		cfg.Debounce = DefaultDebounce
	}
	if cfg.ConfirmTimeout == 0 {
		cfg.ConfirmTimeout = 10 * time.Second
	}
	if cfg.RestartBackoff <= 0 {
		cfg.RestartBackoff = time.Second
	}
	if cfg.StopTimeout <= 0 {
		cfg.StopTimeout = 30 * time.Second
	}
	if log == nil {
		log = zap.NewNop()
	}
	// A unix socket path is at most 107 bytes (sun_path, with its NUL).
	if socket := resolve(cfg.Dir, cfg.Render.ControlSocket); len(socket) > 107 {
		return nil, fmt.Errorf("new nginx reloader: control socket path %s is longer than 107 bytes", socket)
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("register nginx metrics: %w", err)
	}
	return &Reloader{
		cfg: cfg, runner: runner, log: log, m: m,
		client: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Second},
		ctl:    controlClient(resolve(cfg.Dir, cfg.Render.ControlSocket)),
		kick:   make(chan struct{}, 1),
	}, nil
}

func (r *Reloader) confPath() string { return filepath.Join(r.cfg.Dir, "nginx.conf") }

func (r *Reloader) endpointsPath() string { return resolve(r.cfg.Dir, r.cfg.Render.EndpointsFile) }

// Update hands the Reloader a new snapshot; Run applies the latest one after the
// debounce window. It never blocks.
func (r *Reloader) Update(s model.Snapshot) {
	r.mu.Lock()
	r.pending = &s
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Problems returns what the last rendered snapshot left out.
func (r *Reloader) Problems() []model.Problem {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]model.Problem(nil), r.problems...)
}

// MasterPID is the running nginx master's process id, 0 when none runs.
func (r *Reloader) MasterPID() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.master == nil {
		return 0
	}
	return r.master.PID()
}

// Checksum identifies the configuration nginx runs (or will run on start).
func (r *Reloader) Checksum() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.checksum
}

// Run starts nginx with the pending snapshot (or an empty one), applies updates
// until ctx ends, restarts the master whenever it dies, and stops it on return.
func (r *Reloader) Run(ctx context.Context) error {
	if err := prepareDirs(r.cfg.Dir, r.cfg.Render); err != nil {
		return err
	}
	r.mu.Lock()
	first := r.pending
	r.pending = nil
	r.mu.Unlock()
	if first == nil {
		first = &model.Snapshot{}
	}
	defer r.stop() // whichever master runs by then, started or adopted

	// A master an earlier agent left behind keeps its listening sockets: take it
	// over and reload it rather than start a second one that cannot bind.
	if m, err := r.runner.Find(r.confPath(), resolve(r.cfg.Dir, r.cfg.Render.PIDFile)); err != nil {
		r.log.Warn("look for a running nginx master", zap.Error(err))
	} else if m != nil {
		r.mu.Lock()
		r.master = m
		r.mu.Unlock()
		r.log.Info("adopted running nginx master", zap.Int("pid", m.PID()))
	}
	_, err := r.ApplyNow(ctx, *first)
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

	var debounce <-chan time.Time
	var restart <-chan time.Time
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
			if debounce == nil {
				debounce = time.After(r.cfg.Debounce)
			}
		case <-debounce:
			debounce = nil
			r.mu.Lock()
			s := r.pending
			r.pending = nil
			r.mu.Unlock()
			if s != nil {
				// Apply logs and counts its own failures. A failed one is tried
				// again (unless a newer snapshot came): a refused configuration is
				// remembered and cheap to skip, and an endpoint table that did not
				// reach nginx must not wait for the next change.
				if _, err := r.ApplyNow(ctx, *s); err != nil && ctx.Err() == nil {
					r.mu.Lock()
					if r.pending == nil {
						r.pending = s
					}
					r.mu.Unlock()
					debounce = time.After(r.cfg.RestartBackoff)
				}
			}
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
	m, err := r.runner.Start(r.cfg.Dir, r.confPath())
	if err != nil {
		return fmt.Errorf("start nginx: %w", err)
	}
	r.mu.Lock()
	r.master = m
	sum := r.checksum
	r.mu.Unlock()
	r.log.Info("nginx master started", zap.Int("pid", m.PID()))
	if r.cfg.ConfirmTimeout > 0 {
		if _, err := r.waitServing(ctx, sum, m); err != nil {
			r.stop()
			return fmt.Errorf("start nginx: %w", err)
		}
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

// Name names the Reloader as a sink of the control plane.
func (r *Reloader) Name() string { return "nginx" }

// Apply hands a snapshot to Run (as Update does) and returns at once: Run coalesces
// snapshots over the debounce window, and keeps the last good configuration when a
// new one fails, so the caller has nothing to retry. It makes the Reloader a sink of
// the control plane (controlplane.Sink).
func (r *Reloader) Apply(_ context.Context, s model.Snapshot) error {
	r.Update(s)
	return nil
}

// ApplyNow renders s and, when the result differs from the running configuration,
// writes its certificates and a candidate, validates it with nginx -t, writes the
// endpoint table, swaps the candidate in and signals the master (if one runs). When
// only endpoints changed, it writes the endpoint table and hands it to the running
// nginx instead: no nginx -t, no reload. When nginx -t refuses the configuration,
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
			return r.updateEndpoints(ctx, cfg.Endpoints, cfg.EndpointsVersion, cfg.table, res)
		}
		// Keep the running configuration's files until the new one has replaced it.
		if err := addCertificates(certDir, cfg.Certificates); err != nil {
			return fail(ResultError, err)
		}
		if err := writeFileAtomic(candidate, cfg.Text, 0o600); err != nil {
			return fail(ResultError, fmt.Errorf("write candidate config: %w", err))
		}
		err = r.runner.Test(ctx, r.cfg.Dir, candidate)
		if err == nil {
			break
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
	res.Result = ResultSuccess
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
	counts := map[string]int{}
	for _, p := range ps {
		counts[p.Reason]++
	}
	r.m.problems.Reset()
	for reason, n := range counts {
		r.m.problems.WithLabelValues(reason).Set(float64(n))
	}
	for _, p := range ps {
		r.log.Warn("object left out of nginx config", zap.String("object", p.Object), zap.String("field", p.Field),
			zap.String("reason", p.Reason), zap.String("detail", p.Detail))
	}
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

// waitServing polls the status port until /healthz answers with checksum, which
// only workers started with that configuration do, and returns how long it took.
func (r *Reloader) waitServing(ctx context.Context, checksum string, m Master) (time.Duration, error) {
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(ctx, r.cfg.ConfirmTimeout)
	defer cancel()
	url := "http://127.0.0.1:" + strconv.Itoa(int(r.cfg.Render.StatusPort)) + "/healthz"
	for {
		if got, err := Health(ctx, r.client, url); err == nil && got == checksum {
			return time.Since(t0), nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("wait for nginx to serve config %.12s: %w", checksum, ctx.Err())
		case <-m.Done():
			return 0, errors.New("wait for nginx to serve: master exited")
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// waitOldWorkers waits until none of the workers in old accepts connections.
func (r *Reloader) waitOldWorkers(ctx context.Context, m Master, old []Worker) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.ConfirmTimeout)
	defer cancel()
	for {
		now, err := m.Workers()
		if err != nil {
			return err
		}
		accepting := 0
		for _, w := range now {
			if !w.ShuttingDown && slices.ContainsFunc(old, func(o Worker) bool { return o.PID == w.PID }) {
				accepting++
			}
		}
		if accepting == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %d old nginx workers to stop accepting: %w", accepting, ctx.Err())
		case <-m.Done():
			return errors.New("wait for old nginx workers: master exited")
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Health asks an nginx status endpoint (http://127.0.0.1:<StatusPort>/healthz) for
// the checksum of the configuration its workers run.
func Health(ctx context.Context, c *http.Client, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", fmt.Errorf("query nginx health: %w", err)
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", fmt.Errorf("query nginx health: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 256))
	if err != nil {
		return "", fmt.Errorf("read nginx health: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("query nginx health: status %d", resp.StatusCode)
	}
	return strings.TrimSpace(string(body)), nil
}
