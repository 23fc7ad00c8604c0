package agent

import (
	"math"
	"testing"
	"time"

	"github.com/portico-edge/portico/api/agentstatus"
)

// TestLoadMeter: rates from the counters' differences, workers that come and
// go, counters that start again, and the average's pace.
func TestLoadMeter(t *testing.T) {
	var requests, bytes float64
	cpu := map[int]time.Duration{}
	var flows uint64
	m := newLoadMeter(func() (float64, float64, map[int]time.Duration) {
		c := map[int]time.Duration{}
		for k, v := range cpu {
			c[k] = v
		}
		return requests, bytes, c
	}, func() (uint64, error) { return flows, nil })
	m.cores = 4
	t0 := time.Unix(1000, 0)
	requests, bytes, cpu[10], cpu[11], flows = 500, 1e6, time.Second, time.Second, 70
	if l := m.sample(t0); l != nil {
		t.Fatalf("first sample %+v, want none", l)
	}
	// 3 s: 300 requests, 3 MB, 1.5 s of CPU over two workers, 30 new flows.
	requests, bytes, cpu[10], cpu[11], flows = 800, 4e6, 2*time.Second, 1500*time.Millisecond, 100
	want := agentstatus.Load{Requests: 100, Bytes: 1e6, NginxCPU: 0.5, NewConnections: 10, Cores: 4}
	if l := m.sample(t0.Add(3 * time.Second)); l == nil || *l != want {
		t.Fatalf("second sample %+v, want %+v", l, want)
	}
	// 3 s more: a reload replaced worker 11 by 12 (1 s of CPU), worker 10 ran
	// 1 s; the data plane's maps were made again (flows from 0); no requests.
	delete(cpu, 11)
	cpu[10], cpu[12], flows = 3*time.Second, time.Second, 15
	share := 1 - math.Exp(-3/agentstatus.LoadWindow.Seconds())
	l := m.sample(t0.Add(6 * time.Second))
	for _, c := range []struct {
		name      string
		got, want float64
		step      float64
	}{
		{"requests", l.Requests, 100 * (1 - share), 0.1},
		{"bytes", l.Bytes, 1e6 * (1 - share), 1},
		{"nginx CPU", l.NginxCPU, 0.5 + share*(2.0/3-0.5), 0.001},
		{"new connections", l.NewConnections, 10 + share*(5-10), 0.1},
	} {
		if math.Abs(c.got-c.want) > c.step/2+1e-9 {
			t.Errorf("third sample: %s %v, want %v", c.name, c.got, c.want)
		}
	}
	// A sample right after another says what the last one said.
	if again := m.sample(t0.Add(6*time.Second + 100*time.Millisecond)); *again != *l {
		t.Errorf("a sample 100 ms later: %+v, want %+v", again, l)
	}
}
