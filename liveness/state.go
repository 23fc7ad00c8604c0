package liveness

import "time"

// Timing is how fast a replica goes out and how slowly it comes back.
type Timing struct {
	// Interval is the time between two probes of one replica.
	Interval time.Duration
	// DeadAfter is how long a replica may go without one good answer before it
	// is dead. Detection takes at most Interval + DeadAfter + the checker's tick.
	DeadAfter time.Duration
	// Rise is how many consecutive good answers bring a dead replica back.
	Rise int
	// FlapWindow: a replica that dies again within this time of coming back
	// needs twice as many good answers the next time (up to Rise<<MaxPenalty);
	// one that stays live this long is forgiven.
	FlapWindow time.Duration
	// ReloadGrace is how long a replica may take to answer on a new
	// connection after it ended the previous one itself (an nginx reload or
	// restart ends every kept-alive connection, and its new workers accept
	// the connections its listening socket queued meanwhile): its verdict is
	// held while that answer is awaited, for at most this long after the
	// close. Zero holds nothing. A replica that refuses the new connection, or
	// does not accept it at all, is judged as before.
	ReloadGrace time.Duration
}

// MaxPenalty caps the damping of a flapping replica: Rise<<MaxPenalty good
// answers (6.4 s at the defaults).
const MaxPenalty = 6

// DefaultTiming detects a dead replica in at most ~230 ms (20 ms + 200 ms + a
// 10 ms tick), inside the 300 ms that a director has to stop giving it new
// flows with ~50 ms left to rebuild the rings, and brings it back after 100 ms
// of good answers. 150 ms of silence was tried first: on a loaded 2-core lab
// node a live nginx now and then went that long without answering one probe
// connection, and was taken out for 100 ms.
//
// ReloadGrace is 1 s: on the loaded 2-core lab, an nginx reload left the
// probes' new connections unanswered for 250–400 ms (new workers starting),
// which called every replica of the group dead on every edge at each reload.
var DefaultTiming = Timing{Interval: 20 * time.Millisecond, DeadAfter: 200 * time.Millisecond, Rise: 5, FlapWindow: 10 * time.Second, ReloadGrace: time.Second}

// replica is the damped verdict on one replica, a pure function of the probe
// results and times it is shown. A replica starts live: Kubernetes already
// says it is ready, and a restarted agent must not empty its rings while its
// first answers are on the way.
type replica struct {
	live    bool
	since   time.Time // of the last transition (or the first sight)
	lastOK  time.Time // the last good answer, or the first sight
	good    int       // consecutive good answers while dead
	penalty int       // doublings of Rise owed for recent flaps
	rose    time.Time // when it last came back
}

func newReplica(now time.Time) *replica {
	return &replica{live: true, since: now, lastOK: now}
}

// rise is the number of consecutive good answers a dead replica needs now.
func (r *replica) rise(t Timing) int { return t.Rise << r.penalty }

// answer records one probe result and reports whether the verdict changed.
func (r *replica) answer(t Timing, now time.Time, ok bool) bool {
	if !ok {
		r.good = 0
		return r.expire(t, now)
	}
	gap := now.Sub(r.lastOK)
	r.lastOK = now
	if r.live {
		if r.penalty > 0 && now.Sub(r.rose) >= t.FlapWindow {
			r.penalty = 0
		}
		return false
	}
	if gap > t.DeadAfter/2 {
		r.good = 0 // answers with a silence between are not consecutive
	}
	r.good++
	if r.good < r.rise(t) {
		return false
	}
	r.live, r.since, r.rose, r.good = true, now, now, 0
	return true
}

// expire turns a live replica dead once it has gone DeadAfter without a good
// answer, and reports whether it did.
func (r *replica) expire(t Timing, now time.Time) bool {
	if !r.live || now.Sub(r.lastOK) <= t.DeadAfter {
		return false
	}
	if !r.rose.IsZero() && now.Sub(r.rose) < t.FlapWindow {
		r.penalty = min(r.penalty+1, MaxPenalty)
	} else {
		r.penalty = 0
	}
	r.live, r.since, r.good = false, now, 0
	return true
}
