package agent

import (
	"math"
	"runtime"
	"sync"
	"time"

	"github.com/portico-edge/portico/api/agentstatus"
)

// loadMeter measures the node's edge work for its status report
// (agentstatus.Load), which the leader schedules new Ingresses by: requests
// and bytes from nginx's telemetry, its workers' CPU time, and the new
// connections xdp_lb directed. Each sample moves the figures towards the rates
// since the last one by a share that grows with the time between them
// (an exponential average over agentstatus.LoadWindow).
type loadMeter struct {
	work  func() (requests, bytes float64, cpu map[int]time.Duration) // nginx.Reloader.Work
	flows func() (uint64, error)                                      // new flows directed so far
	cores int

	mu        sync.Mutex
	at        time.Time // of the last sample; zero before the first
	requests  float64
	bytes     float64
	cpu       map[int]time.Duration
	newFlows  uint64
	load      agentstatus.Load
	hasSample bool
}

func newLoadMeter(work func() (float64, float64, map[int]time.Duration), flows func() (uint64, error)) *loadMeter {
	return &loadMeter{work: work, flows: flows, cores: runtime.NumCPU()}
}

// sample measures and returns the average so far; nil at the first call,
// which only takes the starting point.
func (m *loadMeter) sample(now time.Time) *agentstatus.Load {
	requests, bytes, cpu := m.work()
	flows, err := m.flows()
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		flows = m.newFlows // not read this time: counted at the next
	}
	if m.at.IsZero() {
		m.at, m.requests, m.bytes, m.cpu, m.newFlows = now, requests, bytes, cpu, flows
		return nil
	}
	dt := now.Sub(m.at).Seconds()
	if dt < 0.5 { // too close to the last sample to say much
		return m.current()
	}
	var busy time.Duration
	for pid, d := range cpu {
		if was, ok := m.cpu[pid]; ok {
			busy += max(d-was, 0)
		} else {
			busy += d // a worker that started since: all of its time is recent
		}
	}
	rate := func(now, was float64) float64 { return max(now-was, 0) / dt }
	got := agentstatus.Load{
		Requests:       rate(requests, m.requests),
		Bytes:          rate(bytes, m.bytes),
		NginxCPU:       busy.Seconds() / dt,
		NewConnections: rate(float64(flows), float64(m.newFlows)),
		Cores:          m.cores,
	}
	if flows < m.newFlows { // the maps were made again
		got.NewConnections = float64(flows) / dt
	}
	share := 1 - math.Exp(-dt/agentstatus.LoadWindow.Seconds())
	if !m.hasSample {
		share = 1
	}
	ewma := func(avg, x float64) float64 { return avg + share*(x-avg) }
	m.load = agentstatus.Load{
		Requests:       ewma(m.load.Requests, got.Requests),
		Bytes:          ewma(m.load.Bytes, got.Bytes),
		NginxCPU:       ewma(m.load.NginxCPU, got.NginxCPU),
		NewConnections: ewma(m.load.NewConnections, got.NewConnections),
		Cores:          m.cores,
	}
	m.hasSample = true
	m.at, m.requests, m.bytes, m.cpu, m.newFlows = now, requests, bytes, cpu, flows
	return m.current()
}

// current is the average so far, rounded so that a report says no more than
// the measurement does; nil before a second sample.
func (m *loadMeter) current() *agentstatus.Load {
	if !m.hasSample {
		return nil
	}
	// To 1/per: math.Round(x*per)/per, which JSON prints short, unlike a
	// multiple of 0.1.
	round := func(x, per float64) float64 { return math.Round(x*per) / per }
	l := agentstatus.Load{
		Requests:       round(m.load.Requests, 10),
		Bytes:          round(m.load.Bytes, 1),
		NginxCPU:       round(m.load.NginxCPU, 1000),
		NewConnections: round(m.load.NewConnections, 10),
		Cores:          m.cores,
	}
	return &l
}

// newFlows is the new connections xdp_lb directed so far, over every VIP.
func (a *agent) newFlows() (uint64, error) {
	c, err := a.dp.Counters()
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, v := range c.VIPs {
		n += v.NewFlows
	}
	return n, nil
}
