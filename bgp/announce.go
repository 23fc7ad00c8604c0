package bgp

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"go.uber.org/zap"
)

// Announce makes the announced set equal to prefixes at pref (none when pref
// is Withdrawn): paths whose preference changes are replaced, prefixes not
// listed are withdrawn, the others are left alone. Prefixes must be IPv4 /32
// or IPv6 /128 (those only with Config.NextHop6).
func (s *Speaker) Announce(prefixes []netip.Prefix, pref Preference) error {
	if !slices.Contains(Preferences, pref) {
		return fmt.Errorf("announce: unknown preference %d", int(pref))
	}
	if err := checkPrefixes(prefixes, s.cfg.NextHop6); err != nil {
		return fmt.Errorf("announce: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c := diff(s.announced, prefixes, pref)
	var errs []error
	for _, a := range c.add {
		if s.state == running {
			if err := s.addPath(a); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		if old, ok := s.announced[a.Prefix]; ok {
			s.log.Info("bgp prefix preference changed", zap.Stringer("vip", a.Prefix), zap.Stringer("from", old), zap.Stringer("to", a.Preference))
		} else {
			s.log.Info("bgp prefix announced", zap.Stringer("vip", a.Prefix), zap.Stringer("to", a.Preference))
		}
		s.announced[a.Prefix] = a.Preference
	}
	for _, p := range c.withdraw {
		if s.state == running {
			if err := s.deletePath(Announcement{Prefix: p, Preference: s.announced[p]}); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		s.log.Info("bgp prefix withdrawn", zap.Stringer("vip", p))
		delete(s.announced, p)
	}
	s.countAnnounced()
	return errors.Join(errs...)
}

// countAnnounced sets the count of announced prefixes at each preference; s.mu
// is held.
func (s *Speaker) countAnnounced() {
	for _, p := range Preferences {
		if p != Withdrawn {
			n := 0
			for _, q := range s.announced {
				if q == p {
					n++
				}
			}
			s.met.announced.WithLabelValues(p.String()).Set(float64(n))
		}
	}
}

// announcements lists the announced set, sorted by prefix; s.mu is held.
func (s *Speaker) announcements() []Announcement {
	var l []Announcement
	for p, pref := range s.announced {
		l = append(l, Announcement{Prefix: p, Preference: pref})
	}
	slices.SortFunc(l, func(a, b Announcement) int { return a.Prefix.Addr().Compare(b.Prefix.Addr()) })
	return l
}

// addPath adds a's path to GoBGP's RIB (replacing the prefix's old one).
func (s *Speaker) addPath(a Announcement) error {
	p, err := s.attrs.path(a, false)
	if err != nil {
		return fmt.Errorf("announce %v: %w", a.Prefix, err)
	}
	if _, err := s.srv.AddPath(apiutil.AddPathRequest{Paths: []*apiutil.Path{p}}); err != nil {
		return fmt.Errorf("announce %v: %w", a.Prefix, err)
	}
	return nil
}

// deletePath withdraws a's path from GoBGP's RIB.
func (s *Speaker) deletePath(a Announcement) error {
	p, err := s.attrs.path(a, true)
	if err != nil {
		return fmt.Errorf("withdraw %v: %w", a.Prefix, err)
	}
	if err := s.srv.DeletePath(apiutil.DeletePathRequest{Paths: []*apiutil.Path{p}}); err != nil {
		return fmt.Errorf("withdraw %v: %w", a.Prefix, err)
	}
	return nil
}
