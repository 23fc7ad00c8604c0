package nginx

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/portico-edge/portico/controlplane/model"
)

// pathRank orders path types for the same rendered location: Exact owns it over
// Prefix, and Prefix over ImplementationSpecific.
func pathRank(t model.PathType) int {
	switch t {
	case model.PathExact:
		return 0
	case model.PathPrefix:
		return 1
	default:
		return 2
	}
}

// locations renders a server's paths. Each path becomes one or two matches ("= /p"
// exact, "/p/" prefix), and each match a chain of candidates that a request tries
// in order, taking the first whose conditions (model.RequestMatch) it meets: by
// path type (Exact, Prefix, ImplementationSpecific), then Rank, then model order.
// A candidate without conditions ends its chain; when two such want the same match
// and neither is Exact over the other's Prefix (the Ingress rule, or Gateway API's
// precedence by Rank), the later is reported as a conflict. A chain that ends
// without one lets the request try the next shorter prefix; "/" always ends with
// one.
//
// An Exact path ending in '/' ("/p/") also gets "= /p", unless another path owns
// it, answering as "/p" would without it. Otherwise nginx, which redirects a
// request for "/p" to "/p/" when a proxying location's name ends in '/' (its
// auto_redirect), would answer "/p" with 301 and then serve "/p/"; the Ingress
// specification says Exact "/p/" does not match "/p".
func (r *renderer) locations(s *model.Server) []tmplLocation {
	type cand struct {
		loc  tmplLocation
		rank int
		l    *model.Location
		src  string
	}
	byMatch := map[string][]cand{}
	var order []string
	var exactSlash []string // Exact paths ending in '/', without it
	add := func(match string, rank int, l *model.Location, obj string) {
		tl, ok := r.target(match, l, obj)
		if !ok {
			return
		}
		if _, seen := byMatch[match]; !seen {
			order = append(order, match)
		}
		byMatch[match] = append(byMatch[match], cand{loc: tl, rank: rank, l: l, src: obj})
	}
	for i := range s.Locations {
		l := &s.Locations[i]
		obj := l.Source
		if obj == "" {
			obj = "Server " + hostOrDefault(s.Host)
		}
		if err := validatePath(l.Path); err != nil {
			r.problem(obj, "path", model.ReasonInvalidPath, fmt.Sprintf("host %s path %q: %v", hostOrDefault(s.Host), l.Path, err))
			continue
		}
		rank := pathRank(l.Type)
		switch l.Type {
		case model.PathExact:
			add("= "+l.Path, rank, l, obj)
			if p := strings.TrimSuffix(l.Path, "/"); p != l.Path && p != "" {
				exactSlash = append(exactSlash, p)
			}
		case model.PathPrefix, model.PathImplementationSpecific:
			p := strings.TrimRight(l.Path, "/")
			if p == "" {
				add("/", rank, l, obj)
				continue
			}
			add("= "+p, rank, l, obj)
			add(p+"/", rank, l, obj)
		default:
			r.problem(obj, "pathType", model.ReasonInvalidPathType, fmt.Sprintf("host %s path %q: unknown path type %q", hostOrDefault(s.Host), l.Path, l.Type))
		}
	}
	// Each chain in precedence order, cut after its first candidate without
	// conditions.
	for m, cs := range byMatch {
		slices.SortStableFunc(cs, func(a, b cand) int { return cmp.Or(cmp.Compare(a.rank, b.rank), cmp.Compare(a.l.Rank, b.l.Rank)) })
		for i, c := range cs {
			if !c.l.Match.IsZero() {
				continue
			}
			for _, d := range cs[i+1:] {
				// Exact over Prefix is the Ingress rule, not a conflict; two paths of
				// the same kind (or Prefix against ImplementationSpecific) are.
				if d.l.Match.IsZero() && (d.rank == c.rank || c.rank != 0 && d.rank != 0) {
					r.problem(d.src, "path", model.ReasonPathConflict, fmt.Sprintf("location %q of host %s is taken by %s", m, hostOrDefault(s.Host), c.src))
				}
			}
			cs = cs[:i+1]
			break
		}
		byMatch[m] = cs
	}
	if cs := byMatch["/"]; len(cs) == 0 || !cs[len(cs)-1].l.Match.IsZero() {
		// Paths no rule matches go to the default backend, or get a 404 (never to
		// nginx's own document root).
		tl := tmplLocation{Match: "/", Status: 404}
		if s.DefaultUpstream != "" {
			tl.Upstream, tl.Status = r.upstream(s.DefaultUpstream, "Server "+hostOrDefault(s.Host))
		}
		if len(cs) == 0 {
			order = append(order, "/")
		}
		byMatch["/"] = append(cs, cand{loc: tl, l: &model.Location{}})
	}
	for _, p := range exactSlash {
		if _, ok := byMatch["= "+p]; ok {
			continue // another path owns "/p", or an earlier Exact "/p/" did this
		}
		// What "/p" reaches without the auto_redirect: the longest prefix location
		// that is a prefix of it. Every prefix location ends in '/', so it is never
		// "/p" itself, and "/" is always there.
		best := "/"
		for m := range byMatch {
			if !strings.HasPrefix(m, "= ") && strings.HasPrefix(p, m) && len(m) > len(best) {
				best = m
			}
		}
		cs := slices.Clone(byMatch[best])
		for i := range cs {
			cs[i].loc.Match = "= " + p
		}
		byMatch["= "+p] = cs
		order = append(order, "= "+p)
	}
	// Sorted by the path, then exact before prefix, for a stable and readable file.
	slices.SortFunc(order, func(a, b string) int {
		pa, pb := strings.TrimPrefix(a, "= "), strings.TrimPrefix(b, "= ")
		if c := strings.Compare(pa, pb); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	out := make([]tmplLocation, 0, len(order))
	for _, m := range order {
		for _, c := range byMatch[m] {
			out = append(out, c.loc)
		}
	}
	return out
}

// upstream resolves an upstream reference: its name, or a status to return instead
// (503 when it does not exist or has an invalid name). An upstream without usable
// endpoints is proxied to all the same: nginx answers 503 until the endpoint table
// gives it some, which needs no reload.
func (r *renderer) upstream(name, obj string) (string, int) {
	up, status := r.resolve(name, obj)
	if r.rec != nil {
		r.rec.upstreams = append(r.rec.upstreams, upstreamCall{name, obj, up, status})
	}
	return up, status
}

// cachedLocations is r.locations(s), from the cache when s's paths are the ones
// it was computed from and every upstream they name resolves as it did then: a
// change of one host then costs one host's locations, not every host's. The
// problems locations reported are reported again.
func (r *renderer) cachedLocations(s *model.Server) []tmplLocation {
	if r.cache == nil {
		return r.locations(s)
	}
	k := s.Group + "|" + s.Host
	if e, ok := r.cache.locations[k]; ok && e.defaultUpstream == s.DefaultUpstream && slices.EqualFunc(e.paths, s.Locations, sameLocation) {
		same := true
		for _, c := range e.upstreams {
			if up, status := r.resolve(c.name, c.obj); up != c.up || status != c.status {
				same = false
				break
			}
		}
		if same {
			for _, p := range e.problems {
				r.problem(p.Object, p.Field, p.Reason, p.Detail)
			}
			r.cache.keepLocations(k, e)
			return e.out
		}
	}
	e := &locationsEntry{defaultUpstream: s.DefaultUpstream, paths: slices.Clone(s.Locations)}
	r.rec = e
	e.out = r.locations(s)
	r.rec = nil
	r.cache.keepLocations(k, e)
	return e.out
}

// locationsEntry is one host's locations as a render computed them.
type locationsEntry struct {
	defaultUpstream string
	paths           []model.Location
	upstreams       []upstreamCall  // every upstream the locations named, and how it resolved
	problems        []model.Problem // every problem they reported
	out             []tmplLocation
}

type upstreamCall struct {
	name, obj, up string
	status        int
}

// resolve is upstream without the cache's record.
func (r *renderer) resolve(name, obj string) (string, int) {
	u, ok := r.upstreams[name]
	if !ok {
		r.problem(obj, "backend", model.ReasonUpstreamNotFound, fmt.Sprintf("upstream %q does not exist; answering 503", name))
		return "", 503
	}
	if err := validateUpstreamName(name); err != nil {
		r.problem("Upstream "+strconv.Quote(name), "name", model.ReasonInvalidUpstream, err.Error()+"; answering 503")
		return "", 503
	}
	if r.usedUpstreams == nil {
		r.usedUpstreams = map[string]bool{}
	}
	if !r.usedUpstreams[name] {
		// Reported by whichever host uses the upstream first, cached or not: not
		// part of that host's record.
		rec := r.rec
		r.rec = nil
		valid := validEndpoints(u.Endpoints, func(err error) {
			r.problem("Upstream "+name, "endpoints", model.ReasonInvalidEndpoint, err.Error())
		})
		r.rec = rec
		r.upstreams[name] = model.Upstream{Name: name, Endpoints: valid}
		r.usedUpstreams[name] = true
	}
	return name, 0
}

// validEndpoints returns the endpoints that pass validateEndpoint, and reports each
// other one to bad (unless nil).
func validEndpoints(eps []netip.AddrPort, bad func(error)) []netip.AddrPort {
	var valid []netip.AddrPort
	for _, ep := range eps {
		if err := validateEndpoint(ep); err != nil {
			if bad != nil {
				bad(err)
			}
			continue
		}
		valid = append(valid, ep)
	}
	return valid
}
