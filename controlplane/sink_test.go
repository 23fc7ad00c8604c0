package controlplane

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/testenv"
)

// scriptedSink blocks on gate (when set) and fails while failing is true.
type scriptedSink struct {
	name    string
	mu      sync.Mutex
	failing bool
	gate    chan struct{}
	got     []string // first group name of each applied snapshot
	calls   int
}

func (s *scriptedSink) Name() string { return s.name }

func (s *scriptedSink) Apply(ctx context.Context, snap model.Snapshot) error {
	if s.gate != nil {
		select {
		case <-s.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if s.failing {
		return errors.New("injected")
	}
	s.got = append(s.got, snap.Groups[0].Name)
	return nil
}

func (s *scriptedSink) applied() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.got...)
}

func snapNamed(n string) model.Snapshot { return model.Snapshot{Groups: []model.Group{{Name: n}}} }

func TestFanout(t *testing.T) {
	m, err := newMetrics(prometheus.NewRegistry(), func() float64 { return 0 }, &agentsCollector{})
	if err != nil {
		t.Fatal(err)
	}
	slow := &scriptedSink{name: "slow", gate: make(chan struct{})}
	flaky := &scriptedSink{name: "flaky", failing: true}
	fast := &scriptedSink{name: "fast"}
	f := newFanout([]Sink{slow, flaky, fast}, zaptest.NewLogger(t), m, time.Millisecond, 5*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	f.run(ctx, &wg)
	defer func() { cancel(); wg.Wait() }()

	f.publish(snapNamed("v1"))
	// The fast sink is not held up by the blocked one.
	testenv.Eventually(t, 5*time.Second, func() string {
		if got := fast.applied(); len(got) != 1 || got[0] != "v1" {
			return "fast sink has " + strings.Join(got, ",")
		}
		return ""
	})
	// While slow is busy with v1, v2 and v3 arrive: it gets only v3 next (coalesced).
	f.publish(snapNamed("v2"))
	f.publish(snapNamed("v3"))
	close(slow.gate)
	testenv.Eventually(t, 5*time.Second, func() string {
		if got := slow.applied(); strings.Join(got, ",") != "v1,v3" {
			return "slow sink has " + strings.Join(got, ",")
		}
		return ""
	})
	// The failing sink is retried, then succeeds with the latest snapshot.
	testenv.Eventually(t, 5*time.Second, func() string {
		flaky.mu.Lock()
		defer flaky.mu.Unlock()
		if flaky.calls < 3 {
			return "flaky sink not retried yet"
		}
		flaky.failing = false
		return ""
	})
	testenv.Eventually(t, 5*time.Second, func() string {
		if got := flaky.applied(); len(got) != 1 || got[0] != "v3" {
			return "flaky sink has " + strings.Join(got, ",")
		}
		return ""
	})
	if n := testutil.ToFloat64(m.sinkApplies.WithLabelValues("flaky", "error")); n < 3 {
		t.Errorf("flaky errors counted %v, want >= 3", n)
	}
}
