package traffic

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"sync"
	"time"
)

// Attempt is one new connection of a Stream.
type Attempt struct {
	Start time.Time
	SPort uint16 // the connection's source port (0 if it was not made)
	Edge  string // the replica that answered
	Err   error  // nil when it was answered in time
	// Connected: the TCP handshake completed. A failure after it that is a
	// timeout is a request that got no answer in time (slow, or its packets went
	// astray); a reset after it means its packets reached a replica that did not
	// have the connection.
	Connected bool
}

// Stream is a bounded stream of new connections through the VIP: every Every a
// fresh TCP connection with one request that must be answered within Timeout
// (below TCP's 1 s initial retransmission timeout, so a SYN lost to a dead
// replica counts as a failure, not as a slow success). At most Max attempts and
// For; at most 200 in flight.
type Stream struct {
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup
	mu   sync.Mutex
	atts []Attempt
}

// StreamOptions shape a Stream; zero values take the defaults.
type StreamOptions struct {
	Every   time.Duration // default 5 ms
	Timeout time.Duration // default 500 ms
	Max     int           // default 30,000
	For     time.Duration // default 2 min, at most 10 min
}

// StartStream starts new connections to host through the VIP until Stop.
func (l Target) StartStream(ctx context.Context, host string, o StreamOptions) *Stream {
	if o.Every <= 0 {
		o.Every = 5 * time.Millisecond
	}
	if o.Timeout <= 0 {
		o.Timeout = 500 * time.Millisecond
	}
	if o.Max <= 0 {
		o.Max = 30000
	}
	if o.For <= 0 {
		o.For = 2 * time.Minute
	}
	o.For = min(o.For, 10*time.Minute)
	s := &Stream{stop: make(chan struct{})}
	slots := make(chan struct{}, 200)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		tick := time.NewTicker(o.Every)
		defer tick.Stop()
		deadline := time.Now().Add(o.For)
		for i := 0; i < o.Max && time.Now().Before(deadline); i++ {
			select {
			case <-s.stop:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			select {
			case slots <- struct{}{}:
			default:
				s.record(Attempt{Start: time.Now(), Err: fmt.Errorf("more than %d attempts in flight", cap(slots))})
				continue
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer func() { <-slots }()
				s.record(l.attempt(ctx, host, o.Timeout))
			}()
		}
	}()
	return s
}

func (l Target) attempt(ctx context.Context, host string, timeout time.Duration) Attempt {
	a := Attempt{Start: time.Now()}
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := l.Dial(actx, "tcp", l.httpAddr())
	if err != nil {
		a.Err = err
		return a
	}
	defer c.Close()
	if ta, ok := c.LocalAddr().(*net.TCPAddr); ok {
		a.SPort = uint16(ta.Port)
	}
	k := NewKeepConn(c)
	r, err := k.Do(host, "/stream", time.Until(a.Start.Add(timeout)))
	a.Connected = true
	a.Edge, a.Err = r.Edge, err
	return a
}

func (s *Stream) record(a Attempt) {
	s.mu.Lock()
	s.atts = append(s.atts, a)
	s.mu.Unlock()
}

// Stop ends the stream, waits for the attempts in flight and returns them all,
// in order of their start. It may be called again (a deferred Stop after the
// test's own): the stream stays stopped.
func (s *Stream) Stop() []Attempt {
	s.once.Do(func() { close(s.stop) })
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	sort.Slice(s.atts, func(i, j int) bool { return s.atts[i].Start.Before(s.atts[j].Start) })
	return s.atts
}

// Failures summarises attempts around a fault: how many were made and failed,
// and when the first and the last failed one started, relative to the fault.
type Failures struct {
	Total, Failed int
	// Unanswered counts the failures that had connected and then timed out
	// (see Attempt.Connected): slow answers, or packets lost after the handshake.
	Unanswered  int
	First, Last time.Duration
	FirstErr    error
	PerEdge     map[string]int // answered attempts after the fault, by replica
}

// FailuresAround counts the attempts started at or after fault.
func FailuresAround(atts []Attempt, fault time.Time) Failures {
	f := Failures{PerEdge: map[string]int{}}
	for _, a := range atts {
		if a.Start.Before(fault) {
			continue
		}
		f.Total++
		if a.Err == nil {
			f.PerEdge[a.Edge]++
			continue
		}
		at := a.Start.Sub(fault)
		if f.Failed == 0 {
			f.First, f.FirstErr = at, a.Err
		}
		f.Failed++
		if a.unanswered() {
			f.Unanswered++
		}
		f.Last = at
	}
	return f
}

func (f Failures) String() string {
	if f.Failed == 0 {
		return fmt.Sprintf("0 of %d new connections failed", f.Total)
	}
	return fmt.Sprintf("%d of %d new connections failed (%d connected but unanswered in time), started %v to %v after the fault (first: %v)",
		f.Failed, f.Total, f.Unanswered, f.First.Round(time.Millisecond), f.Last.Round(time.Millisecond), f.FirstErr)
}

// Hard returns the attempts without those that connected and then timed out:
// what is left failed because the connection could not be made or was reset.
func Hard(atts []Attempt) []Attempt {
	var out []Attempt
	for _, a := range atts {
		if a.unanswered() {
			continue
		}
		out = append(out, a)
	}
	return out
}

// unanswered reports whether the attempt connected and then timed out.
func (a Attempt) unanswered() bool {
	var ne net.Error
	return a.Err != nil && a.Connected && errors.As(a.Err, &ne) && ne.Timeout()
}
