package lab

import (
	"context"
	"os"
	"path/filepath"
	"strings"

	"testing"
	"time"

	"github.com/portico-edge/portico/test/kapi"
	"github.com/portico-edge/portico/test/testenv"
)

var porticoBin string

func TestMain(m *testing.M) { os.Exit(Main(m, &porticoBin)) }

// startLab brings the lab up with backends, an Ingress and every agent, and
// waits until HTTP through the VIP works.
func startLab(t *testing.T) *Lab {
	t.Helper()
	testenv.RequireRoot(t, "network namespaces, XDP, VRRP")
	return startLabWith(t, Options{Portico: porticoBin})
}

// startLabWith starts a lab of o and brings it up; the agents' logs are printed
// if the test fails, and the lab is closed when it ends.
func startLabWith(t *testing.T, o Options) *Lab {
	t.Helper()
	kapi.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l, err := Start(ctx, o)
	if err != nil {
		t.Fatalf("start lab: %v", err)
	}
	t.Cleanup(func() {
		for i := range l.Edges {
			if a := l.Agent(i); a != nil {
				keepLog(t, a.Edge.Name, a.Log())
			}
		}
		if t.Failed() {
			for i := range l.Edges {
				if a := l.Agent(i); a != nil {
					log := a.Log()
					t.Logf("agent %s warnings and errors (last 40):\n%s", a.Edge.Name, warnings(log, 40))
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
	if err := l.Up(ctx, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	return l
}

// keepLog copies an agent's whole log into $PORTICO_LAB_LOGS, when set, as
// <test>-<edge>.log: for a failure the tail does not explain, or to compare a
// passing run with it.
func keepLog(t *testing.T, edge, log string) {
	dir := os.Getenv("PORTICO_LAB_LOGS")
	if dir == "" {
		return
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()) + "-" + edge + ".log"
	err := os.MkdirAll(dir, 0o755)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, name), []byte(log), 0o644)
	}
	if err != nil {
		t.Logf("keep agent %s log: %v", edge, err)
	}
}

// warnings returns the last max lines of log at level warn or above.
func warnings(log string, max int) string {
	var out []string
	for line := range strings.SplitSeq(log, "\n") {
		if strings.Contains(line, `"level":"warn"`) || strings.Contains(line, `"level":"error"`) {
			out = append(out, line)
		}
	}
	if len(out) > max {
		out = out[len(out)-max:]
	}
	return strings.Join(out, "\n")
}
