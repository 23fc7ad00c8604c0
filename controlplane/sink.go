package controlplane

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/portico-edge/portico/controlplane/model"
)

// Sink consumes snapshots: the data plane, nginx and status writers implement it.
// Apply gets every new snapshot (never the same one twice in a row); an error is
// retried with backoff until it succeeds or a newer snapshot replaces it.
type Sink interface {
	Name() string
	Apply(ctx context.Context, snap model.Snapshot) error
}

// fanout delivers snapshots to each sink in its own goroutine, so a slow or failing
// sink delays nobody else. Each sink sees the latest snapshot: ones published while it
// is busy are coalesced.
type fanout struct {
	runners []*sinkRunner
}

type sinkRunner struct {
	sink       Sink
	log        *zap.Logger
	metrics    *metrics
	minBackoff time.Duration
	maxBackoff time.Duration

	mu      sync.Mutex
	pending *model.Snapshot
	wake    chan struct{}
}

func newFanout(sinks []Sink, log *zap.Logger, m *metrics, minBackoff, maxBackoff time.Duration) *fanout {
	f := &fanout{}
	for _, s := range sinks {
		f.runners = append(f.runners, &sinkRunner{
			sink: s, log: log.With(zap.String("sink", s.Name())), metrics: m,
			minBackoff: minBackoff, maxBackoff: maxBackoff, wake: make(chan struct{}, 1),
		})
	}
	return f
}

// publish hands a snapshot to every sink without waiting.
func (f *fanout) publish(s model.Snapshot) {
	for _, r := range f.runners {
		r.mu.Lock()
		r.pending = &s
		r.mu.Unlock()
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
}

// run starts the sink goroutines; they stop when ctx is done.
func (f *fanout) run(ctx context.Context, wg *sync.WaitGroup) {
	for _, r := range f.runners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.run(ctx)
		}()
	}
}

func (r *sinkRunner) take() *model.Snapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.pending
	r.pending = nil
	return s
}

func (r *sinkRunner) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		}
		snap := r.take()
		backoff := r.minBackoff
		for snap != nil {
			err := r.sink.Apply(ctx, *snap)
			r.metrics.sinkApplies.WithLabelValues(r.sink.Name(), result(err)).Inc()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return
			}
			r.log.Warn("sink apply failed, retrying", zap.Duration("backoff", backoff), zap.Error(err))
			select {
			case <-ctx.Done():
				return
			case <-r.wake: // a newer snapshot replaces the failed one
				if n := r.take(); n != nil {
					snap = n
					backoff = r.minBackoff
				}
			case <-time.After(backoff):
				backoff = min(2*backoff, r.maxBackoff)
			}
		}
	}
}

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}
