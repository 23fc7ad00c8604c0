package testenv

import (
	"testing"
	"time"
)

func TestUntil(t *testing.T) {
	n := 0
	took, ok := Until(time.Second, time.Millisecond, func() bool { n++; return n == 3 })
	if !ok || n != 3 || took >= time.Second {
		t.Errorf("Until = %v, %v after %d calls, want true on the third", took, ok, n)
	}
	took, ok = Until(20*time.Millisecond, time.Millisecond, func() bool { return false })
	if ok || took < 20*time.Millisecond {
		t.Errorf("Until of a condition that never holds = %v, %v, want false after the timeout", took, ok)
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
