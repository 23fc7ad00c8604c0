package lab

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// The kinds of held connections.
const (
	heldL4   = "L4"
	heldWS   = "WebSocket"
	heldFeed = "streaming"
)

// oldShutdownTimeout is how long nginx's old workers used to keep what they held
// after a reload (worker_shutdown_timeout 60s) before they closed it: the tests
// hold their connections longer than that past the first reload.
const oldShutdownTimeout = 60 * time.Second

// heldConn is one connection a test holds through a VIP while the
// configuration changes.
type heldConn struct {
	kind string
	// idle connections say nothing between their first and their last check
	// (a held upgraded one still gets the backend's heartbeats).
	idle      bool
	edge, pod string // where the first exchange went
	check     func() error
	close     func()
	// failed is when a check first failed, and err why; a failed connection
	// is not asked again.
	failed time.Time
	err    error
}

func (h *heldConn) String() string {
	s := fmt.Sprintf("%s via %s to %s", h.kind, h.edge, h.pod)
	if h.idle {
		s += " (idle)"
	}
	return s
}

type heldConns []*heldConn

// holdL4 opens n connections to an L4 Service's addr, of which the last idle
// are idle; each exchange must reach the first one's pod through its edge.
func (l *Lab) holdL4(ctx context.Context, addr string, n, idle int) (heldConns, error) {
	var hs heldConns
	for i := range n {
		c, r, first, err := l.tcpLine(ctx, addr)
		if err != nil {
			hs.close()
			return nil, fmt.Errorf("hold %s: %w", addr, err)
		}
		hs = append(hs, &heldConn{kind: heldL4, idle: i >= n-idle, edge: first.Peer, pod: first.Pod,
			check: func() error {
				rep, err := lineOn(c, r)
				if err == nil && (rep.Pod != first.Pod || rep.Peer != first.Peer) {
					err = fmt.Errorf("answered by %s via %s", rep.Pod, rep.Peer)
				}
				return err
			},
			close: func() { c.Close() }})
	}
	return hs, nil
}

// holdUpgraded opens n upgraded connections to host+path, of which the last
// idle are idle; each exchange must reach the first one's pod through its edge.
func (l *Lab) holdUpgraded(ctx context.Context, host, path string, n, idle int) (heldConns, error) {
	var hs heldConns
	for i := range n {
		u, err := l.OpenUpgraded(ctx, host, path, 3*time.Second)
		if err != nil {
			hs.close()
			return nil, err
		}
		hs = append(hs, &heldConn{kind: heldWS, idle: i >= n-idle, edge: u.First.Edge, pod: u.First.Pod,
			check: func() error {
				r, err := u.Exchange(3 * time.Second)
				if err == nil && (r.Pod != u.First.Pod || r.Edge != u.First.Edge) {
					err = fmt.Errorf("answered by %s via %s", r.Pod, r.Edge)
				}
				return err
			},
			close: func() { u.Close() }})
	}
	return hs, nil
}

// holdFeeds opens n streaming responses from host; each must have delivered a
// line within the last 3 s (they come every 500 ms) whenever it is checked.
func (l *Lab) holdFeeds(ctx context.Context, host string, n int) (heldConns, error) {
	var hs heldConns
	for range n {
		f, err := l.OpenFeed(ctx, host, "/feed", 3*time.Second)
		if err != nil {
			hs.close()
			return nil, err
		}
		hs = append(hs, &heldConn{kind: heldFeed, edge: f.First.Edge, pod: f.First.Pod,
			check: func() error { return f.Check(3 * time.Second) },
			close: func() { f.Close() }})
	}
	return hs, nil
}

func (hs heldConns) close() {
	for _, h := range hs {
		h.close()
	}
}

// check checks, at once, every connection that has not failed: the idle ones
// too when all.
func (hs heldConns) check(all bool) {
	var wg sync.WaitGroup
	for _, h := range hs {
		if h.err != nil || (h.idle && !all) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := h.check(); err != nil {
				h.failed, h.err = time.Now(), err
			}
		}()
	}
	wg.Wait()
}

// watch checks the active connections every 5 s, for at most d, until the
// returned stop, which waits for a check in progress.
func (hs heldConns) watch(d time.Duration) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(5 * time.Second)
		defer tick.Stop()
		end := time.After(d)
		for {
			select {
			case <-quit:
				return
			case <-end:
				return
			case <-tick.C:
			}
			hs.check(false)
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(quit) })
		<-done
	}
}

// kept counts the connections of kind that have not failed, of how many.
func (hs heldConns) kept(kind string) (kept, of int) {
	for _, h := range hs {
		if h.kind == kind {
			of++
			if h.err == nil {
				kept++
			}
		}
	}
	return kept, of
}

// spread counts the connections of kind per edge.
func (hs heldConns) spread(kind string) map[string]int {
	out := map[string]int{}
	for _, h := range hs {
		if h.kind == kind {
			out[h.edge]++
		}
	}
	return out
}

// failures describes the failed connections (at most max, earliest first),
// each with when its failure was seen after since, which event names.
func (hs heldConns) failures(since time.Time, event string, max int) string {
	var failed heldConns
	for _, h := range hs {
		if h.err != nil {
			failed = append(failed, h)
		}
	}
	slices.SortStableFunc(failed, func(a, b *heldConn) int { return a.failed.Compare(b.failed) })
	var b strings.Builder
	for i, h := range failed {
		if i == max {
			fmt.Fprintf(&b, "\n  ... and %d more", len(failed)-max)
			break
		}
		fmt.Fprintf(&b, "\n  %s: failed, seen %v after %s: %v", h, h.failed.Sub(since).Round(100*time.Millisecond), event, h.err)
	}
	return b.String()
}

// holdPast keeps the connections, checking the active ones every 5 s, until
// oldShutdownTimeout and 5 s more have passed since since (and at least until
// now); then it checks every one.
func (l *Lab) holdPast(held heldConns, since time.Time) {
	stop := held.watch(2 * oldShutdownTimeout)
	defer stop()
	time.Sleep(time.Until(since.Add(oldShutdownTimeout + 5*time.Second)))
	stop()
	held.check(true)
}
