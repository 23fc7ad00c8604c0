// Package shutdown stops what client-go started, within bounds.
package shutdown

import (
	"sync"
	"time"

	"go.uber.org/zap"
)

// Factory is an informer factory, typed or dynamic: Shutdown waits until every
// informer it started has stopped.
type Factory interface{ Shutdown() }

// Wait is how long Informers waits for the factories' informers.
const Wait = time.Second

// Informers shuts the factories down (their informers' context must have ended)
// and waits for their informers at most Wait. A reflector of client-go v0.36
// that is backing off a failed watch-list request (an API server gone) sleeps
// out its backoff without looking at its context (tools/cache reflector.go,
// watchList), up to 30 s: an agent whose API server was down took more than 10 s
// to exit on SIGTERM. Those informers end by themselves after the sleep; the
// process does not wait for them. It reports whether every informer stopped in
// time.
func Informers(log *zap.Logger, fs ...Factory) bool {
	var wg sync.WaitGroup
	for _, f := range fs {
		if f != nil {
			wg.Go(f.Shutdown)
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(Wait):
		log.Warn("informers still backing off a failed request to the API server; not waited for", zap.Duration("waited", Wait))
		return false
	}
}
