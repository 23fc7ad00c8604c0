package agent

import (
	"context"
	"math"
	"net/netip"
	"time"

	"go.uber.org/zap"

	"github.com/portico-edge/portico/api/sites"
)

const (
	// spillStep is the unit of a spill ratio: each change is a ring change.
	spillStep = 0.05
	// spillEvery is how often an edge measures its load, spillWindow the time
	// its rate is measured over, spillDown how long a lower ratio must hold
	// before the ratio goes down (it goes up at once).
	spillEvery  = 200 * time.Millisecond
	spillWindow = time.Second
	spillDown   = 2 * time.Second
)

// spillFor is the spill ratio an offered rate of new connections a second needs
// to bring what stays at o's capacity: 0 at or below it, in whole spillSteps
// (rounded up) above, at most o's limit.
func spillFor(o sites.Overflow, rate float64) float64 {
	if o.CapacityPerEdge <= 0 || rate <= o.CapacityPerEdge {
		return 0
	}
	r := math.Ceil((1-o.CapacityPerEdge/rate)/spillStep-1e-9) * spillStep
	return math.Min(math.Round(r*100)/100, o.EffectiveLimit())
}

// spiller follows an edge's load and sets its spill ratio: up at once, down once
// the lower ratio has held for spillDown.
type spiller struct {
	samples []sample
	ratio   float64
	lowFrom time.Time // when the wanted ratio went below ratio (zero: it is not)
}

type sample struct {
	at    time.Time
	flows uint64
}

// observe takes a reading of the edge's new-connection counter and returns the
// ratio to use, and whether it changed.
func (s *spiller) observe(now time.Time, flows uint64, o *sites.Overflow) (float64, bool) {
	s.samples = append(s.samples, sample{now, flows})
	for len(s.samples) > 2 && now.Sub(s.samples[1].at) >= spillWindow {
		s.samples = s.samples[1:]
	}
	want := 0.0
	if first := s.samples[0]; o != nil && now.Sub(first.at) > 0 && flows >= first.flows {
		want = spillFor(*o, float64(flows-first.flows)/now.Sub(first.at).Seconds())
	}
	switch {
	case want > s.ratio:
		s.ratio, s.lowFrom = want, time.Time{}
		return want, true
	case want == s.ratio:
		s.lowFrom = time.Time{}
	case s.lowFrom.IsZero():
		s.lowFrom = now
	case now.Sub(s.lowFrom) >= spillDown:
		s.ratio, s.lowFrom = want, time.Time{}
		return want, true
	}
	return s.ratio, false
}

// spillRatio is the edge's spill ratio now.
func (s *l4Sink) spillRatio() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.spill
}

// followLoad measures the edge's new connections to the group's VIPs every
// spillEvery and applies the spill ratio the site's overflow asks for.
func (s *l4Sink) followLoad(ctx context.Context) error {
	t := time.NewTicker(spillEvery)
	defer t.Stop()
	var sp spiller
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			o := s.sites.overflow()
			s.mu.Lock()
			var vips []netip.Addr
			for _, g := range s.last.Groups {
				if g.Name == s.group {
					vips = g.VIPs
				}
			}
			flows, err := s.dp.NewFlows(vips)
			if err != nil {
				s.mu.Unlock()
				s.log.Warn("read new connections", zap.Error(err))
				continue
			}
			ratio, changed := sp.observe(now, flows, o)
			if changed {
				s.spill = ratio
				s.log.Info("spill ratio", zap.Float64("ratio", ratio))
				if len(s.last.Groups) > 0 {
					if err := s.applyLocked(); err != nil {
						s.log.Warn("apply the spill ratio", zap.Error(err))
					}
				}
				// Set once the maps have it: what the gauge says, the
				// data plane does.
				if s.spillGauge != nil {
					s.spillGauge.Set(ratio)
				}
			}
			s.mu.Unlock()
		}
	}
}
