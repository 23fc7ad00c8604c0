package lab

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

// waitL4 waits up to d until 30 new connections in a row to addr are answered
// and their answers pass check.
func (l *Lab) waitL4(ctx context.Context, d time.Duration, addr string, check func([]traffic.Reply) error) error {
	_, err := testenv.Poll(ctx, d, 100*time.Millisecond, func() error {
		var reps []traffic.Reply
		for range 30 {
			c, _, rep, err := l.tcpLine(ctx, addr)
			if err != nil {
				return err
			}
			c.Close()
			reps = append(reps, rep)
		}
		return check(reps)
	})
	return err
}

// waitUpgrades waits up to d until 30 new upgraded connections in a row to
// host+path are answered and their first answers pass check.
func (l *Lab) waitUpgrades(ctx context.Context, d time.Duration, host, path string, check func([]traffic.Reply) error) error {
	_, err := testenv.Poll(ctx, d, 100*time.Millisecond, func() error {
		var reps []traffic.Reply
		for range 30 {
			u, err := l.OpenUpgraded(ctx, host, path, 2*time.Second)
			if err != nil {
				return err
			}
			u.Close()
			reps = append(reps, u.First)
		}
		return check(reps)
	})
	return err
}

// reached checks that answers came through every edge and only from pods.
func (l *Lab) reached(edges, pods []string, want ...*Node) error {
	if seen := slices.Compact(slices.Sorted(slices.Values(edges))); len(seen) != len(l.Edges) {
		return fmt.Errorf("answers came through %v, want every edge", seen)
	}
	for _, p := range pods {
		if !slices.Contains(names(want), p) {
			return fmt.Errorf("an answer came from %s, want only %v", p, names(want))
		}
	}
	return nil
}

// reloads reads every edge's count of successful nginx reloads and the time of
// the last one.
func (l *Lab) reloads(t *testing.T) (counts []int, last time.Time) {
	t.Helper()
	for i := range l.Edges {
		n, err := l.Metric(i, `portico_nginx_reloads_total{result="success"}`)
		if err != nil {
			t.Fatal(err)
		}
		at, err := l.Metric(i, "portico_nginx_last_reload_success_timestamp_seconds")
		if err != nil {
			t.Fatal(err)
		}
		counts = append(counts, int(n))
		if ts := time.Unix(0, int64(at*1e9)); ts.After(last) {
			last = ts
		}
	}
	return counts, last
}
