package traffic

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
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
	// Late is when the answer of such a request came after all (from Start), and
	// LateEdge the replica that gave it; 0 if none came within
	// StreamOptions.Late (or it was not asked for). The attempt failed anyway.
	Late     time.Duration
	LateEdge string
}

// Stream is a bounded stream of new connections through the VIP: every Every a
// fresh TCP connection with one request that must be answered within Timeout
// (below TCP's 1 s initial retransmission timeout, so a SYN lost to a dead
// replica counts as a failure, not as a slow success). At most Max attempts and
// For; at most 200 in flight.
type Stream struct {
	stop  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
	mu    sync.Mutex
	atts  []Attempt
	late  time.Duration // StreamOptions.Late
	waits chan struct{} // the late waits under way
}

// StreamOptions shape a Stream; zero values take the defaults.
type StreamOptions struct {
	Every   time.Duration // default 5 ms
	Timeout time.Duration // default 500 ms
	Max     int           // default 30,000
	For     time.Duration // default 2 min, at most 10 min
	// Late, when set, is how much longer an attempt that connected and got no
	// answer in time waits for it, to tell when it came (Attempt.Late): a
	// diagnosis, not a second chance. At most 400 wait at once.
	Late time.Duration
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
	s := &Stream{stop: make(chan struct{}), late: o.Late, waits: make(chan struct{}, 400)}
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
				a, k := l.attempt(ctx, host, o.Timeout, s.late > 0)
				if i := s.record(a); k != nil {
					s.waitLate(i, k)
				}
			}()
		}
	}()
	return s
}

// waitLate waits, on a goroutine of its own (its attempt's slot is free
// again), for the answer of the attempt at index i, which connected and got
// none in time, and notes when it came; then closes the connection.
func (s *Stream) waitLate(i int, k *KeepConn) {
	select {
	case s.waits <- struct{}{}:
	default:
		k.Close()
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer func() { <-s.waits }()
		defer k.Close()
		r, err := k.ReadLate(s.late)
		if err != nil {
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		a := &s.atts[i]
		a.Late, a.LateEdge = time.Since(a.Start), r.Edge
	}()
}

// attempt makes one new connection with one request. When the request
// connected and timed out and wait is set, it returns the connection, open,
// for waitLate.
func (l Target) attempt(ctx context.Context, host string, timeout time.Duration, wait bool) (Attempt, *KeepConn) {
	a := Attempt{Start: time.Now()}
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := l.Dial(actx, "tcp", l.httpAddr())
	if err != nil {
		a.Err = err
		return a, nil
	}
	if ta, ok := c.LocalAddr().(*net.TCPAddr); ok {
		a.SPort = uint16(ta.Port)
	}
	k := NewKeepConn(c)
	r, err := k.Do(host, "/stream", time.Until(a.Start.Add(timeout)))
	a.Connected = true
	a.Edge, a.Err = r.Edge, err
	if wait && a.unanswered() {
		return a, k
	}
	c.Close()
	return a, nil
}

// record notes an attempt and returns its index (which Stop's sort changes).
func (s *Stream) record(a Attempt) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.atts = append(s.atts, a)
	return len(s.atts) - 1
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

// LateAnswers tells, for the attempts started at or after from that connected
// and got no answer in time, when their answers came after all (with
// StreamOptions.Late): how many came, the median and the longest wait, by
// replica, and how many never came. "" when there were none.
func LateAnswers(atts []Attempt, from time.Time) string {
	var waits []time.Duration
	byEdge := map[string]int{}
	never := 0
	for _, a := range atts {
		if a.Start.Before(from) || !a.unanswered() {
			continue
		}
		if a.Late == 0 {
			never++
			continue
		}
		waits = append(waits, a.Late)
		byEdge[a.LateEdge]++
	}
	if len(waits) == 0 && never == 0 {
		return ""
	}
	s := fmt.Sprintf("%d of %d requests unanswered in time were answered later", len(waits), len(waits)+never)
	if len(waits) > 0 {
		slices.Sort(waits)
		s += fmt.Sprintf(" (after %v median, %v at most; by replica %v)",
			waits[len(waits)/2].Round(time.Millisecond), waits[len(waits)-1].Round(time.Millisecond), byEdge)
	}
	return s
}
