package nginx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// healthURL is the status port's /healthz, which Health asks.
func (r *Reloader) healthURL() string {
	return "http://127.0.0.1:" + strconv.Itoa(int(r.cfg.Render.StatusPort)) + "/healthz"
}

// waitServing polls the status port until /healthz answers with checksum, which
// only workers started with that configuration do, and returns how long it took.
func (r *Reloader) waitServing(ctx context.Context, checksum string, m Master) (time.Duration, error) {
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(ctx, r.cfg.ConfirmTimeout)
	defer cancel()
	for {
		if got, err := Health(ctx, r.client, r.healthURL()); err == nil && got == checksum {
			return time.Since(t0), nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("wait for nginx to serve config %.12s: %w", checksum, ctx.Err())
		case <-m.Done():
			return 0, errors.New("wait for nginx to serve: master exited")
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// waitOldWorkers waits until none of the workers in old accepts connections.
func (r *Reloader) waitOldWorkers(ctx context.Context, m Master, old []Worker) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.ConfirmTimeout)
	defer cancel()
	for {
		now, err := m.Workers()
		if err != nil {
			return err
		}
		accepting := 0
		for _, w := range now {
			if !w.ShuttingDown && slices.ContainsFunc(old, func(o Worker) bool { return o.PID == w.PID }) {
				accepting++
			}
		}
		if accepting == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %d old nginx workers to stop accepting: %w", accepting, ctx.Err())
		case <-m.Done():
			return errors.New("wait for old nginx workers: master exited")
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Health asks an nginx status endpoint (http://127.0.0.1:<StatusPort>/healthz) for
// the checksum of the configuration its workers run.
func Health(ctx context.Context, c *http.Client, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", fmt.Errorf("query nginx health: %w", err)
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", fmt.Errorf("query nginx health: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 256))
	if err != nil {
		return "", fmt.Errorf("read nginx health: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("query nginx health: status %d", resp.StatusCode)
	}
	return strings.TrimSpace(string(body)), nil
}
