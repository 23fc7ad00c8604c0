package gslb

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Report is what a site's health endpoint answers: its own health, as its own
// cluster sees it, and which peer sites it reached in its last probe round.
type Report struct {
	Site    string          `json:"site"`
	Healthy bool            `json:"healthy"`
	Reason  string          `json:"reason,omitempty"`
	Reaches map[string]bool `json:"reaches,omitempty"`
}

// siteState is one site's standing with the hysteresis applied.
type siteState struct {
	up        bool
	downVotes int // consecutive rounds judged down
	upVotes   int // consecutive rounds judged up
	reached   bool
	report    Report
}

// probeResult is one peer's probe in a round.
type probeResult struct {
	reached bool
	report  Report
}

// prober judges every site once per interval: the own site by its own health, a peer
// by what its health endpoint reports of itself. A peer that cannot be reached
// counts as down only when another peer, reached in the same round, cannot reach
// it either (a partition between two sites alone moves nobody), or when there is no
// other peer to ask.
type prober struct {
	cfg    Config
	log    *zap.Logger
	client *http.Client

	mu     sync.Mutex
	sites  map[string]*siteState
	rounds int // probe rounds judged so far
	view   atomic.Pointer[map[string]bool]
	// onChange is called (outside the lock) with a site's name and new standing.
	onChange func(site string, up bool)
}

func newProber(cfg Config, log *zap.Logger) *prober {
	p := &prober{cfg: cfg, log: log, sites: map[string]*siteState{}}
	p.client = &http.Client{Timeout: cfg.ProbeTimeout, Transport: &http.Transport{DialContext: cfg.dial, DisableKeepAlives: true}}
	for _, s := range cfg.Sites {
		// Every site starts up: a starting server must not send every client to
		// one site before it has looked.
		p.sites[s.Name] = &siteState{up: true, reached: true}
	}
	p.publishLocked()
	return p
}

// run probes every interval until ctx ends (the caller ran the first round).
func (p *prober) run(ctx context.Context) {
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.round(ctx)
	}
}

// judgeOwn records the own site's health before the first round, so the health
// endpoint has something true to say from its start.
func (p *prober) judgeOwn(ctx context.Context) {
	own := p.cfg.OwnHealth(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.sites[p.cfg.Self]
	st.report, st.up = own, own.Healthy
	p.publishLocked()
}

// round probes every peer at once, then judges every site.
func (p *prober) round(ctx context.Context) {
	results := make(map[string]probeResult, len(p.cfg.Sites))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, s := range p.cfg.Sites {
		if s.Name == p.cfg.Self {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rep, err := p.fetch(ctx, s.Health)
			mu.Lock()
			results[s.Name] = probeResult{reached: err == nil, report: rep}
			mu.Unlock()
			if err != nil {
				p.log.Debug("probe failed", zap.String("site", s.Name), zap.Error(err))
			}
		}()
	}
	wg.Wait()
	own := p.cfg.OwnHealth(ctx)
	own.Site = p.cfg.Self

	var changes []func()
	p.mu.Lock()
	p.rounds++
	for _, s := range p.cfg.Sites {
		st := p.sites[s.Name]
		var up bool
		if s.Name == p.cfg.Self {
			up, st.reached, st.report = own.Healthy, true, own
		} else {
			r := results[s.Name]
			st.reached = r.reached
			if r.reached {
				up, st.report = r.report.Healthy, r.report
			} else {
				up = !p.confirmedUnreachable(s.Name, results)
			}
		}
		if up {
			st.upVotes, st.downVotes = st.upVotes+1, 0
		} else {
			st.downVotes, st.upVotes = st.downVotes+1, 0
		}
		switch {
		case st.up && st.downVotes >= p.cfg.FailAfter:
			st.up = false
		case !st.up && st.upVotes >= p.cfg.RiseAfter:
			st.up = true
		default:
			continue
		}
		name, now := s.Name, st.up
		changes = append(changes, func() { p.onChange(name, now) })
	}
	if len(changes) > 0 {
		p.publishLocked()
	}
	p.mu.Unlock()
	for _, c := range changes {
		c()
	}
}

// confirmedUnreachable: another peer reached this round says it cannot reach site
// either, or there is no other peer to ask.
func (p *prober) confirmedUnreachable(site string, results map[string]probeResult) bool {
	witnesses := 0
	for name, r := range results {
		if name == site || !r.reached {
			continue
		}
		witnesses++
		if reaches, known := r.report.Reaches[site]; known && !reaches {
			return true
		}
	}
	return witnesses == 0 && len(p.cfg.Sites) <= 2
}

func (p *prober) fetch(ctx context.Context, url string) (Report, error) {
	var rep Report
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return rep, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return rep, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(http.MaxBytesReader(nil, resp.Body, 64<<10)).Decode(&rep); err != nil {
		return rep, fmt.Errorf("decode report: %w", err)
	}
	return rep, nil
}

// roundsDone is how many probe rounds have been judged.
func (p *prober) roundsDone() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rounds
}

// up reports each site's standing.
// Every DNS answer reads it: it is a snapshot, replaced when a standing changes, so
// an answer takes no lock and copies nothing.
func (p *prober) up() map[string]bool { return *p.view.Load() }

// publishLocked replaces the standings snapshot (p.mu held).
func (p *prober) publishLocked() {
	out := make(map[string]bool, len(p.sites))
	for n, s := range p.sites {
		out[n] = s.up
	}
	p.view.Store(&out)
}

// report is this site's own Report, with what it reached in the last round.
func (p *prober) report() Report {
	p.mu.Lock()
	defer p.mu.Unlock()
	rep := p.sites[p.cfg.Self].report
	rep.Site = p.cfg.Self
	rep.Reaches = map[string]bool{}
	for _, s := range p.cfg.Sites {
		if s.Name != p.cfg.Self {
			rep.Reaches[s.Name] = p.sites[s.Name].reached
		}
	}
	return rep
}
