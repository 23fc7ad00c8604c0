package nginx

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

type fakeRunner struct {
	mu      sync.Mutex
	testErr error
	reject  string // nginx -t fails for configurations containing this
	tests   int
	masters []*fakeMaster
}

func (f *fakeRunner) Test(_ context.Context, dir, conf string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tests++
	text, err := os.ReadFile(conf)
	if err != nil {
		return err
	}
	if f.reject != "" && strings.Contains(string(text), f.reject) {
		return errors.New("nginx: [emerg] refused by the fake")
	}
	return f.testErr
}

func (f *fakeRunner) Start(dir, conf string) (Master, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := os.Stat(conf); err != nil {
		return nil, err
	}
	m := &fakeMaster{pid: 1000 + len(f.masters), done: make(chan struct{})}
	f.masters = append(f.masters, m)
	return m, nil
}

func (f *fakeRunner) Find(string, string) (Master, error) { return nil, nil }

func (f *fakeRunner) snapshot() (tests int, masters []*fakeMaster) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tests, append([]*fakeMaster(nil), f.masters...)
}

type fakeMaster struct {
	pid       int
	mu        sync.Mutex
	reloadErr error // what Reload returns
	reloads   int
	stopped   bool
	done      chan struct{}
	once      sync.Once
}

func (m *fakeMaster) PID() int              { return m.pid }
func (m *fakeMaster) Done() <-chan struct{} { return m.done }
func (m *fakeMaster) Reload() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reloads++
	return m.reloadErr
}
func (m *fakeMaster) Stop(context.Context) error {
	m.mu.Lock()
	m.stopped = true
	m.mu.Unlock()
	m.die()
	return nil
}
func (m *fakeMaster) Workers() ([]Worker, error) { return nil, nil }
func (m *fakeMaster) die()                       { m.once.Do(func() { close(m.done) }) }
func (m *fakeMaster) state() (int, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reloads, m.stopped
}

func newTestReloader(t *testing.T, runner Runner, cfg ReloaderConfig) (*Reloader, *prometheus.Registry) {
	t.Helper()
	cfg.Dir = t.TempDir()
	cfg.ConfirmTimeout = -1 // nothing listens: the runner is a fake
	cfg.Render = DefaultOptions("")
	reg := prometheus.NewRegistry()
	r, err := NewReloader(cfg, runner, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)), reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := prepareDirs(cfg.Dir, cfg.Render); err != nil {
		t.Fatal(err)
	}
	return r, reg
}

// startFake gives r a running fake master.
func startFake(r *Reloader, runner *fakeRunner) *fakeMaster {
	m, _ := runner.Start(r.cfg.Dir, "/dev/null")
	r.master = m
	return m.(*fakeMaster)
}
