package nginx

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
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
	// Debounce is the least time between two reloads for changes the table
	// cannot carry: a change after a quiet window reloads at once, and the
	// changes that follow within the window are collected into one reload at
	// its end. Zero means DefaultDebounce.
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
	// OnServed, if set, is called by Run with each snapshot nginx has started
	// serving (its configuration confirmed live, or only its endpoints changed).
	OnServed func(model.Snapshot)
	// SteerL4, when set, is called once nginx serves a configuration, with the
	// TCP routes of its steered listeners (Config.L4Routes; none without
	// Render.L4Steered), and the master's process id when its listeners must
	// be registered (a new master, or a new configuration), else 0: it points
	// the routes at nginx's listeners (dataplane/steer). An error makes the
	// apply fail, so that it is tried again.
	SteerL4 func(pid int, routes []L4Route) error
	// MaxDraining bounds the workers that reloads replaced and that still serve
	// the connections they hold: before a reload, the oldest beyond it are ended
	// (their connections with them), so that at most MaxDraining plus the workers
	// of one reload drain. Zero means DefaultMaxDraining, a negative value no
	// bound.
	MaxDraining int
}

// DefaultMaxDraining is ReloaderConfig.MaxDraining's default: reloads happen only
// for new listening ports, and a draining worker holds a few MiB.
const DefaultMaxDraining = 32

// DefaultDebounce is the default coalescing window for changes that need a
// reload; a change of the table alone is applied at once.
const DefaultDebounce = 500 * time.Millisecond

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
	tel    *telemetry   // nil without Render.Telemetry

	kick chan struct{}

	mu      sync.Mutex // guards pending, master, status, reloadedAt
	pending *model.Snapshot
	master  Master
	// reloadedAt is when Run last started nginx or reloaded it for a
	// deferred change: the next deferred reload waits until a debounce window
	// after it.
	reloadedAt time.Time
	problems   []model.Problem
	checksum   string // of the configuration in nginx.conf

	applyMu  sync.Mutex        // serialises Apply
	applied  []byte            // text of nginx.conf
	rejected []byte            // text of the last candidate nginx -t refused
	refused  map[string]string // certificate files OpenSSL refused, and why
	// checked are the certificate files OpenSSL accepted (checkWithNginx).
	checked map[string]bool
	// certCache keeps certificate checks from one render to the next.
	certCache certCache
	// certSeries are the Secrets portico_tls_certificate_expiry_timestamp_seconds
	// has a series for (observeCertificates).
	certSeries map[[2]string]bool
	// luaWritten says the Lua module is in the prefix directory: it is part of the
	// binary and never changes, so the first configuration that needs it writes it.
	luaWritten bool
	// appliedTable is the table nginx uses, appliedDigest its digest; nil when
	// not known (before the first start or reload).
	appliedTable  table
	appliedDigest string
	// steered are the L4 routes last given to SteerL4, for a master that
	// starts later.
	steered []L4Route
	// listenersOf is the master whose listeners SteerL4 last registered, and
	// listenersText the configuration it ran then.
	listenersOf   int
	listenersText []byte
	// fileDigest is the digest of the table in Options.TableFile, which is
	// written before every start and reload, and after changes once they stop
	// coming (Run), so that an agent that restarts finds what nginx has.
	fileDigest string
	lastStamp  int64 // the stamp of the last delta or file (table.delta)
}

// NewReloader returns a Reloader; Run starts nginx.
func NewReloader(cfg ReloaderConfig, runner Runner, log *zap.Logger, reg prometheus.Registerer) (*Reloader, error) {
	if cfg.Dir == "" {
		return nil, errors.New("new nginx reloader: no directory")
	}
	if err := cfg.Render.validate(); err != nil {
		return nil, fmt.Errorf("new nginx reloader: %w", err)
	}
	if cfg.Render.L4Steered[0] != 0 && cfg.SteerL4 == nil {
		return nil, errors.New("new nginx reloader: steered L4 listeners (Render.L4Steered) without SteerL4")
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
	if cfg.MaxDraining == 0 {
		cfg.MaxDraining = DefaultMaxDraining
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
	r := &Reloader{
		cfg: cfg, runner: runner, log: log, m: m,
		client: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Second},
		ctl:    controlClient(resolve(cfg.Dir, cfg.Render.ControlSocket)),
		kick:   make(chan struct{}, 1),
	}
	if err := registerDraining(reg, r.draining); err != nil {
		return nil, err
	}
	if cfg.Render.Telemetry {
		r.tel = newTelemetry()
		if err := reg.Register(r.tel); err != nil {
			return nil, fmt.Errorf("register nginx metrics: %w", err)
		}
	}
	return r, nil
}

// registerDraining registers the gauges of the workers a reload replaced that
// still serve connections, read from draining at each scrape.
func registerDraining(reg prometheus.Registerer, draining func() (int, int64)) error {
	for _, g := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "portico", Subsystem: "nginx", Name: "draining_workers",
			Help: "nginx workers that a reload replaced and that still serve the connections they hold."},
			func() float64 { n, _ := draining(); return float64(n) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "portico", Subsystem: "nginx", Name: "draining_workers_bytes",
			Help: "Private memory of the nginx workers that a reload replaced and that still serve connections."},
			func() float64 { _, b := draining(); return float64(b) }),
	} {
		if err := reg.Register(g); err != nil {
			return fmt.Errorf("register nginx metrics: %w", err)
		}
	}
	return nil
}

// DescribeMetrics registers on reg every series of a Reloader, with no values
// behind them: for the generated metrics table (hack/metricsdoc).
func DescribeMetrics(reg prometheus.Registerer) error {
	if _, err := newMetrics(reg); err != nil {
		return err
	}
	// One series of each kind, so that the table reads each one's type from
	// what Collect reports.
	tel := newTelemetry()
	if err := tel.add(strings.NewReader(telemetrySample())); err != nil {
		return err
	}
	if err := reg.Register(tel); err != nil {
		return err
	}
	return registerDraining(reg, func() (int, int64) { return 0, 0 })
}

// draining counts the workers a reload replaced that still run, and their private
// memory (from /proc/<pid>/smaps_rollup).
func (r *Reloader) draining() (n int, bytes int64) {
	r.mu.Lock()
	m := r.master
	r.mu.Unlock()
	if m == nil {
		return 0, 0
	}
	ws, err := m.Workers()
	if err != nil {
		return 0, 0
	}
	for _, w := range ws {
		if w.ShuttingDown {
			n++
			bytes += privateMemory(w.PID)
		}
	}
	return n, bytes
}

// capDraining ends the oldest workers that reloads replaced beyond
// cfg.MaxDraining (SIGTERM: an nginx worker then exits at once, closing what it
// holds, and its master does not start another). The Reloader calls it before
// each reload, when the idle workers of the last one have long exited.
func (r *Reloader) capDraining(m Master) {
	if r.cfg.MaxDraining < 0 {
		return
	}
	ws, err := m.Workers()
	if err != nil {
		r.log.Warn("list nginx workers", zap.Error(err))
		return
	}
	var old []Worker
	for _, w := range ws {
		if w.ShuttingDown {
			old = append(old, w)
		}
	}
	if len(old) <= r.cfg.MaxDraining {
		return
	}
	slices.SortFunc(old, func(a, b Worker) int { return cmp.Compare(startTime(a.PID), startTime(b.PID)) })
	for _, w := range old[:len(old)-r.cfg.MaxDraining] {
		if err := syscall.Kill(w.PID, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
			r.log.Warn("end a draining nginx worker", zap.Int("pid", w.PID), zap.Error(err))
			continue
		}
		r.m.drainingEnded.Inc()
		r.log.Warn("ended the oldest draining nginx worker, and the connections it held: more than the bound drain",
			zap.Int("pid", w.PID), zap.Int("draining", len(old)), zap.Int("bound", r.cfg.MaxDraining))
	}
}

// startTime is when a process started, in clock ticks after boot (0 when it
// cannot be read).
func startTime(pid int) uint64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0
	}
	t, _ := strconv.ParseUint(f[19], 10, 64) // field 22 of stat, starttime
	return t
}

// schedCPU is the CPU time a process ran so far (the first field of
// /proc/<pid>/schedstat, in nanoseconds); false when it cannot be read.
func schedCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/schedstat")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return 0, false
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return 0, false
	}
	return time.Duration(ns), true
}

// Work is what this nginx did so far: the requests its workers answered and
// their bytes, in and out (from the telemetry: zero without it), and the CPU
// time of each worker that runs now, by process id.
func (r *Reloader) Work() (requests, bytes float64, cpu map[int]time.Duration) {
	if r.tel != nil {
		requests, bytes = r.tel.totals()
	}
	r.mu.Lock()
	m := r.master
	r.mu.Unlock()
	cpu = map[int]time.Duration{}
	if m == nil {
		return requests, bytes, cpu
	}
	ws, err := m.Workers()
	if err != nil {
		return requests, bytes, cpu
	}
	for _, w := range ws {
		if d, ok := schedCPU(w.PID); ok {
			cpu[w.PID] = d
		}
	}
	return requests, bytes, cpu
}

// privateMemory is a process's private memory in bytes (Private_Clean plus
// Private_Dirty of /proc/<pid>/smaps_rollup), 0 when it cannot be read.
func privateMemory(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return 0
	}
	var kb int64
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Private_"); ok {
			if f := strings.Fields(rest); len(f) >= 2 && (f[0] == "Clean:" || f[0] == "Dirty:") {
				v, _ := strconv.ParseInt(f[1], 10, 64)
				kb += v
			}
		}
	}
	return kb << 10
}

func (r *Reloader) confPath() string { return filepath.Join(r.cfg.Dir, "nginx.conf") }

func (r *Reloader) tablePath() string { return resolve(r.cfg.Dir, r.cfg.Render.TableFile) }

// stamp returns a stamp for a delta or table file: the time in microseconds,
// later than every earlier stamp.
func (r *Reloader) stamp() int64 {
	r.lastStamp = max(time.Now().UnixMicro(), r.lastStamp+1)
	return r.lastStamp
}

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
