package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/portico-edge/portico/test/kapi"
)

var porticoBin string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		if os.Geteuid() != 0 {
			return m.Run() // every test skips
		}
		dir, err := os.MkdirTemp("", "portico-e2e-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		porticoBin = filepath.Join(dir, "portico")
		out, err := exec.Command("go", "build", "-o", porticoBin, "github.com/portico-edge/portico/cmd/portico").CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "build portico: %v\n%s", err, out)
			return 1
		}
		return m.Run()
	}())
}

// startLab brings the lab up with backends, an Ingress and every agent, and
// waits until HTTP through the VIP works.
func startLab(t *testing.T) *Lab {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("end-to-end tests must run as root in CI")
		}
		t.Skip("needs root: network namespaces, XDP, VRRP")
	}
	if err := kapi.Available(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l, err := Start(ctx, Options{Portico: porticoBin})
	if err != nil {
		t.Fatalf("start lab: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for i := range l.Edges {
				if a := l.Agent(i); a != nil {
					log := a.Log()
					if len(log) > 6000 {
						log = log[len(log)-6000:]
					}
					t.Logf("agent %s log (tail):\n%s", a.Edge.Name, log)
				}
			}
		}
		if err := l.Close(); err != nil {
			t.Errorf("close lab: %v", err)
		}
	})
	if err := l.ServePods(); err != nil {
		t.Fatal(err)
	}
	if err := l.Backend(ctx, "echo", l.Pods...); err != nil {
		t.Fatal(err)
	}
	if err := l.Ingress(ctx, "echo", "echo.lab", "echo"); err != nil {
		t.Fatal(err)
	}
	for i := range l.Edges {
		if _, err := l.StartAgent(i); err != nil {
			t.Fatal(err)
		}
	}
	c := l.HTTPClient(false, 2*time.Second)
	var lastErr error
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		if _, lastErr = l.Owner(); lastErr == nil {
			if _, lastErr = l.Get(ctx, c, "echo.lab", "/"); lastErr == nil {
				return l
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("no HTTP through the VIP after 90 s: %v", lastErr)
	return nil
}

func TestLabServesThroughVIP(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	c := l.HTTPClient(false, 2*time.Second)
	edges := map[string]int{}
	for range 300 {
		r, err := l.Get(ctx, c, "echo.lab", "/hello")
		if err != nil {
			t.Fatal(err)
		}
		if r.Client != l.Client.Addr.Addr().String() {
			t.Fatalf("backend saw client %q, want %s", r.Client, l.Client.Addr.Addr())
		}
		edges[r.Edge]++
	}
	t.Logf("requests per edge: %v", edges)
	if len(edges) != len(l.Edges) {
		t.Fatalf("requests reached %d edges, want %d: %v", len(edges), len(l.Edges), edges)
	}
}
