package liveness

import (
	"testing"
	"time"
)

// step is one event in a replica's life: a probe answer (ok or not) or a tick
// of the evaluation loop, at a time since the start.
type step struct {
	at   time.Duration
	kind string // "ok", "fail", "tick"
	want bool   // live after the step
	flip bool   // the step changed the verdict
}

func TestReplicaVerdict(t *testing.T) {
	tm := Timing{Interval: 25 * time.Millisecond, DeadAfter: 150 * time.Millisecond, Rise: 3, FlapWindow: 10 * time.Second}
	ms := time.Millisecond
	tests := []struct {
		name  string
		steps []step
	}{
		{"starts live and stays live on answers", []step{
			{0, "ok", true, false}, {25 * ms, "ok", true, false}, {400 * ms, "tick", false, true /* no answer for 375 ms */},
		}},
		{"silence up to DeadAfter is tolerated", []step{
			{0, "ok", true, false}, {150 * ms, "tick", true, false}, {151 * ms, "tick", false, true},
		}},
		{"failed answers alone do not kill before DeadAfter", []step{
			{0, "ok", true, false}, {25 * ms, "fail", true, false}, {50 * ms, "fail", true, false},
			{75 * ms, "fail", true, false}, {100 * ms, "ok", true, false}, {240 * ms, "fail", true, false},
			{251 * ms, "fail", false, true},
		}},
		{"comes back after Rise consecutive answers", []step{
			{0, "ok", true, false}, {200 * ms, "tick", false, true},
			{225 * ms, "ok", false, false}, {250 * ms, "ok", false, false}, {275 * ms, "ok", true, true},
		}},
		{"a failure restarts the count", []step{
			{0, "ok", true, false}, {200 * ms, "fail", false, true},
			{225 * ms, "ok", false, false}, {250 * ms, "ok", false, false}, {275 * ms, "fail", false, false},
			{300 * ms, "ok", false, false}, {325 * ms, "ok", false, false}, {350 * ms, "ok", true, true},
		}},
		{"dying again soon after coming back doubles the rise", []step{
			{0, "ok", true, false}, {200 * ms, "tick", false, true},
			{225 * ms, "ok", false, false}, {250 * ms, "ok", false, false}, {275 * ms, "ok", true, true},
			{500 * ms, "tick", false, true}, // 225 ms silent, 225 ms after coming back: penalty 1, rise 6
			{525 * ms, "ok", false, false}, {550 * ms, "ok", false, false}, {575 * ms, "ok", false, false},
			{600 * ms, "ok", false, false}, {625 * ms, "ok", false, false}, {650 * ms, "ok", true, true},
		}},
		{"a replica live for FlapWindow is forgiven", []step{
			{0, "ok", true, false}, {200 * ms, "tick", false, true},
			{225 * ms, "ok", false, false}, {250 * ms, "ok", false, false}, {275 * ms, "ok", true, true},
			{500 * ms, "tick", false, true}, // penalty 1
			{525 * ms, "ok", false, false}, {550 * ms, "ok", false, false}, {575 * ms, "ok", false, false},
			{600 * ms, "ok", false, false}, {625 * ms, "ok", false, false}, {650 * ms, "ok", true, true},
			{11 * time.Second, "ok", true, false}, // live 10.35 s: forgiven
			{12 * time.Second, "tick", false, true},
			{12*time.Second + 25*ms, "ok", false, false}, {12*time.Second + 50*ms, "ok", false, false},
			{12*time.Second + 75*ms, "ok", true, true},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t0 := time.Unix(1000, 0)
			r := newReplica(t0)
			for i, s := range tc.steps {
				now := t0.Add(s.at)
				var flip bool
				switch s.kind {
				case "ok":
					flip = r.answer(tm, now, true)
				case "fail":
					flip = r.answer(tm, now, false)
				case "tick":
					flip = r.expire(tm, now)
				}
				if r.live != s.want || flip != s.flip {
					t.Fatalf("step %d (%s at %v): live=%v changed=%v, want live=%v changed=%v", i, s.kind, s.at, r.live, flip, s.want, s.flip)
				}
			}
		})
	}
}

// A replica flapping faster than it can rise stays out: the rings never churn.
func TestFlappingReplicaStaysOut(t *testing.T) {
	tm := DefaultTiming
	t0 := time.Unix(1000, 0)
	r := newReplica(t0)
	transitions := 0
	now := t0
	// 10 s of cycles: Rise-1 good answers, then a silence longer than DeadAfter.
	for cycle := 0; cycle < 33; cycle++ {
		for i := 0; i < tm.Rise-1; i++ {
			now = now.Add(tm.Interval)
			if r.answer(tm, now, true) {
				transitions++
			}
		}
		for i := 0; i < int((tm.DeadAfter+100*time.Millisecond)/(10*time.Millisecond)); i++ {
			now = now.Add(10 * time.Millisecond)
			if r.expire(tm, now) {
				transitions++
			}
		}
	}
	if transitions != 1 {
		t.Fatalf("%d transitions over 33 flaps, want 1 (out once, never back while it flaps)", transitions)
	}
	if r.live {
		t.Fatal("a flapping replica is live")
	}
}
