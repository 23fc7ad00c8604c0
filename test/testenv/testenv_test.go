package testenv

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestPoll(t *testing.T) {
	n := 0
	took, err := Poll(context.Background(), time.Second, time.Millisecond, func() bool { n++; return n == 3 })
	if err != nil || n != 3 || took >= time.Second {
		t.Errorf("Poll = %v, %v after %d calls, want nil on the third", took, err, n)
	}
	took, err = Poll(context.Background(), 20*time.Millisecond, time.Millisecond, func() bool { return false })
	if err == nil || took < 20*time.Millisecond {
		t.Errorf("Poll of a condition that never holds = %v, %v, want an error after the timeout", took, err)
	}
	notYet := errors.New("not yet")
	if _, err := Poll(context.Background(), 20*time.Millisecond, time.Millisecond, func() error { return notYet }); !errors.Is(err, notYet) {
		t.Errorf("Poll of a func() error that never holds = %v, want its last error", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if took, err := Poll(ctx, time.Minute, time.Millisecond, func() bool { return false }); !errors.Is(err, context.Canceled) || took >= time.Minute {
		t.Errorf("Poll with a cancelled context = %v, %v, want context.Canceled at once", took, err)
	}
}

func TestPorts(t *testing.T) {
	ps := Ports(t, 3)
	if len(ps) != 3 || ps[0] == ps[1] || ps[1] == ps[2] || ps[0] == ps[2] {
		t.Fatalf("Ports(3) = %v, want 3 distinct ports", ps)
	}
	for _, p := range ps {
		if p < firstFreePort {
			t.Errorf("port %d is below %d", p, firstFreePort)
		}
	}
}

func TestEventually(t *testing.T) {
	n := 0
	Eventually(t, time.Second, func() string {
		if n++; n < 3 {
			return "not yet"
		}
		return ""
	})
	if n != 3 {
		t.Errorf("check called %d times, want 3", n)
	}
}

func TestCI(t *testing.T) {
	for v, want := range map[string]bool{"": false, "false": false, "true": true, "1": true} {
		t.Setenv("CI", v)
		if CI() != want {
			t.Errorf("CI=%q: CI() = %v, want %v", v, CI(), want)
		}
	}
}
