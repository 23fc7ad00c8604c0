package model

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
)

// Validate reports every way s breaks the rules the types of this package document:
// each list sorted by its key with no key twice, addresses valid, at most
// MaxVIPsPerFamily VIPs per address family, protocols, replica states, unmatched-host answers and path types
// known, and every name a Server refers to (its group, upstreams and certificate)
// present. Build's snapshots pass; a snapshot that does not is a bug, not a bad
// object.
func (s Snapshot) Validate() error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	groups := make(map[string]bool, len(s.Groups))
	add(ordered("groups", s.Groups, func(x, y Group) int { return cmp.Compare(x.Name, y.Name) }, func(g Group) string { return g.Name }))
	for _, g := range s.Groups {
		groups[g.Name] = true
		add(g.validate())
	}
	upstreams := make(map[string]bool, len(s.Upstreams))
	add(ordered("upstreams", s.Upstreams, func(x, y Upstream) int { return cmp.Compare(x.Name, y.Name) }, func(u Upstream) string { return u.Name }))
	for _, u := range s.Upstreams {
		upstreams[u.Name] = true
		add(u.validate())
	}
	certs := make(map[string]bool, len(s.Certificates))
	add(ordered("certificates", s.Certificates, func(x, y Certificate) int { return cmp.Compare(x.Name, y.Name) }, func(c Certificate) string { return c.Name }))
	for _, c := range s.Certificates {
		certs[c.Name] = true
	}
	views := make(map[string]View, len(s.Views))
	add(ordered("views", s.Views, func(x, y View) int { return cmp.Compare(x.Name, y.Name) }, func(v View) string { return v.Name }))
	for _, v := range s.Views {
		views[v.Name] = v
		add(v.validate(groups))
	}
	add(ordered("servers", s.Servers, func(x, y Server) int {
		return cmp.Or(cmp.Compare(x.Group, y.Group), cmp.Compare(x.View, y.View), cmp.Compare(x.Port, y.Port), cmp.Compare(x.Host, y.Host))
	}, func(v Server) string {
		if v.View != "" {
			return v.Group + " view " + v.View + ":" + strconv.Itoa(int(v.Port)) + " " + v.Host
		}
		return v.Group + " " + v.Host
	}))
	for _, v := range s.Servers {
		add(v.validate(groups, upstreams, certs))
		view, ok := views[v.View]
		switch {
		case v.View == "" && (v.Port != 0 || v.Listener != ""):
			errs = append(errs, fmt.Errorf("server %s %q: port %d or listener %q outside a view", v.Group, v.Host, v.Port, v.Listener))
		case !listenerRE.MatchString(v.Listener):
			errs = append(errs, fmt.Errorf("server %s %q: listener %q", v.Group, v.Host, v.Listener))
		case v.View != "" && (!ok || view.Group != v.Group):
			errs = append(errs, fmt.Errorf("server %s %q: view %q is not one of group %s's", v.Group, v.Host, v.View, v.Group))
		case v.View != "" && !slices.Contains(view.Ports, Port{TCP, v.Port}):
			errs = append(errs, fmt.Errorf("server %s %q: port %d is not one of view %s's", v.Group, v.Host, v.Port, v.View))
		}
	}
	add(ordered("services", s.Services, func(x, y Service) int { return cmp.Compare(x.Name, y.Name) }, func(v Service) string { return v.Name }))
	for _, v := range s.Services {
		add(v.validate(groups, upstreams))
	}
	vipOf := map[netip.Addr]string{}
	for _, g := range s.Groups {
		for _, a := range g.VIPs {
			vipOf[a] = "group " + g.Name
		}
	}
	for _, v := range s.Services {
		for _, a := range v.VIPs {
			if other, ok := vipOf[a]; ok {
				errs = append(errs, fmt.Errorf("service %s: vip %s is also %s's", v.Name, a, other))
			}
			vipOf[a] = "service " + v.Name
		}
	}
	for _, v := range s.Views {
		for _, a := range v.VIPs {
			if other, ok := vipOf[a]; ok {
				errs = append(errs, fmt.Errorf("view %s: vip %s is also %s's", v.Name, a, other))
			}
			vipOf[a] = "view " + v.Name
		}
	}
	return errors.Join(errs...)
}

// listenerRE is a Server's Listener: a Gateway API SectionName, or nothing.
var listenerRE = regexp.MustCompile(`^([a-z0-9]([-a-z0-9]{0,251}[a-z0-9])?)?$`)

func (v View) validate(groups map[string]bool) error {
	var errs []error
	if !groups[v.Group] {
		errs = append(errs, fmt.Errorf("group %q does not exist", v.Group))
	}
	if len(v.VIPs) == 0 {
		errs = append(errs, errors.New("no vip"))
	}
	errs = appendErr(errs, validVIPs(v.VIPs))
	errs = appendErr(errs, ordered("ports", v.Ports, func(x, y Port) int {
		return cmp.Or(cmp.Compare(x.Protocol, y.Protocol), cmp.Compare(x.Port, y.Port))
	}, func(p Port) string { return string(p.Protocol) + "/" + strconv.Itoa(int(p.Port)) }))
	if len(v.Ports) == 0 {
		errs = append(errs, errors.New("no port")) // an empty list would steer every port
	}
	for _, p := range v.Ports {
		if p.Protocol != TCP || p.Port == 0 {
			errs = append(errs, fmt.Errorf("port %s/%d is not a TCP port", p.Protocol, p.Port))
		}
	}
	errs = appendErr(errs, ordered("tls ports", v.TLSPorts, cmp.Compare[uint16], func(p uint16) string { return strconv.Itoa(int(p)) }))
	for _, p := range v.TLSPorts {
		if !slices.Contains(v.Ports, Port{TCP, p}) {
			errs = append(errs, fmt.Errorf("tls port %d is not one of its ports", p))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("view %s: %w", v.Name, err)
	}
	return nil
}

func (v Service) validate(groups, upstreams map[string]bool) error {
	var errs []error
	if !groups[v.Group] {
		errs = append(errs, fmt.Errorf("group %q does not exist", v.Group))
	}
	errs = appendErr(errs, validVIPs(v.VIPs))
	errs = appendErr(errs, ordered("ports", v.Ports, func(x, y ServicePort) int {
		return cmp.Or(cmp.Compare(x.Protocol, y.Protocol), cmp.Compare(x.Port, y.Port))
	}, func(p ServicePort) string { return string(p.Protocol) + "/" + strconv.Itoa(int(p.Port)) }))
	for _, p := range v.Ports {
		if p.Protocol != TCP && p.Protocol != UDP {
			errs = append(errs, fmt.Errorf("port %d has protocol %q", p.Port, p.Protocol))
		}
		if p.Port == 0 {
			errs = append(errs, errors.New("port 0"))
		}
		if !upstreams[p.Upstream] {
			errs = append(errs, fmt.Errorf("port %s/%d: upstream %q does not exist", p.Protocol, p.Port, p.Upstream))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("service %s: %w", v.Name, err)
	}
	return nil
}

// validVIPs checks a VIP list: sorted, no address twice, plain addresses, at most
// MaxVIPsPerFamily of a family.
func validVIPs(vips []netip.Addr) error {
	errs := []error{ordered("vips", vips, netip.Addr.Compare, netip.Addr.String)}
	families := map[bool]int{}
	for _, a := range vips {
		if !a.IsValid() || a.Is4In6() || a.Zone() != "" {
			errs = append(errs, fmt.Errorf("vip %q is not a plain IPv4 or IPv6 address", a))
		}
		families[a.Is4()]++
	}
	if families[true] > MaxVIPsPerFamily || families[false] > MaxVIPsPerFamily {
		errs = append(errs, fmt.Errorf("more than %d vips of an address family", MaxVIPsPerFamily))
	}
	return errors.Join(errs...)
}

func (g Group) validate() error {
	var errs []error
	if g.Name == "" {
		errs = append(errs, errors.New("group without a name"))
	}
	errs = appendErr(errs, validVIPs(g.VIPs))
	errs = appendErr(errs, ordered("ports", g.Ports, func(x, y Port) int {
		return cmp.Or(cmp.Compare(x.Protocol, y.Protocol), cmp.Compare(x.Port, y.Port))
	}, func(p Port) string { return string(p.Protocol) + "/" + strconv.Itoa(int(p.Port)) }))
	for _, p := range g.Ports {
		if p.Protocol != TCP && p.Protocol != UDP {
			errs = append(errs, fmt.Errorf("port %d has protocol %q", p.Port, p.Protocol))
		}
	}
	for _, p := range []struct {
		name string
		port uint16
	}{{"http", g.HTTPPort}, {"https", g.HTTPSPort}} {
		if p.port != 0 && len(g.Ports) > 0 && !slices.Contains(g.Ports, Port{TCP, p.port}) {
			errs = append(errs, fmt.Errorf("%s port %d is not one of the group's TCP ports", p.name, p.port))
		}
	}
	if g.HTTPPort != 0 && g.HTTPPort == g.HTTPSPort {
		errs = append(errs, fmt.Errorf("http and https share port %d", g.HTTPPort))
	}
	errs = appendErr(errs, ordered("replicas", g.Replicas, func(x, y Replica) int { return x.Addr.Compare(y.Addr) },
		func(r Replica) string { return r.Addr.String() }))
	for _, r := range g.Replicas {
		if !r.Addr.IsValid() {
			errs = append(errs, fmt.Errorf("replica on node %q has no address", r.Node))
		}
		if r.State != Ready && r.State != Draining {
			errs = append(errs, fmt.Errorf("replica %s has state %q", r.Addr, r.State))
		}
	}
	if g.UnmatchedHost != UnmatchedHostClose && g.UnmatchedHost != UnmatchedHostNotFound {
		errs = append(errs, fmt.Errorf("unmatched host answer %q", g.UnmatchedHost))
	}
	if len(errs) == 0 {
		return nil // no prefix built: Validate runs on every sync
	}
	return prefixed("group "+g.Name, errs)
}

func (u Upstream) validate() error {
	var errs []error
	if u.Name == "" {
		errs = append(errs, errors.New("upstream without a name"))
	}
	errs = appendErr(errs, ordered("endpoints", u.Endpoints, netip.AddrPort.Compare, netip.AddrPort.String))
	for _, ep := range u.Endpoints {
		if !ep.IsValid() {
			errs = append(errs, fmt.Errorf("endpoint %q is not an address and port", ep))
		}
	}
	if len(errs) == 0 {
		return nil // no prefix built: Validate runs on every sync
	}
	return prefixed("upstream "+u.Name, errs)
}

func (v Server) validate(groups, upstreams, certs map[string]bool) error {
	var errs []error
	if !groups[v.Group] {
		errs = append(errs, fmt.Errorf("group %q does not exist", v.Group))
	}
	if v.TLSCertificate != "" && !certs[v.TLSCertificate] {
		errs = append(errs, fmt.Errorf("certificate %q does not exist", v.TLSCertificate))
	}
	if v.DefaultUpstream != "" && !upstreams[v.DefaultUpstream] {
		errs = append(errs, fmt.Errorf("default upstream %q does not exist", v.DefaultUpstream))
	}
	errs = appendErr(errs, ordered("locations", v.Locations, func(x, y Location) int {
		return cmp.Or(cmp.Compare(x.Path, y.Path), cmp.Compare(x.Type, y.Type), cmp.Compare(x.Rank, y.Rank))
	}, func(l Location) string {
		if l.Rank > 0 {
			return string(l.Type) + " " + l.Path + " rank " + strconv.Itoa(int(l.Rank))
		}
		return string(l.Type) + " " + l.Path
	}))
	for _, l := range v.Locations {
		if l.Type != PathExact && l.Type != PathPrefix && l.Type != PathImplementationSpecific {
			errs = append(errs, fmt.Errorf("path %q has type %q", l.Path, l.Type))
		}
		errs = appendErr(errs, l.validateTarget(upstreams))
		if a := l.Affinity; (a.Cookie != "" && !CookieNameRE.MatchString(a.Cookie)) || (a.Cookie == "" && a.MaxAge != 0) || a.MaxAge > MaxCookieAge {
			errs = append(errs, fmt.Errorf("path %q: affinity cookie %q with max-age %d", l.Path, a.Cookie, a.MaxAge))
		}
	}
	if len(errs) == 0 {
		return nil // no prefix built: Validate runs on every sync
	}
	return prefixed("server "+v.Group+" "+strconv.Quote(v.Host), errs)
}

// ordered reports the first entry of xs that does not sort strictly after the one
// before it (by compare, named by show): out of order, or a key given twice.
func ordered[T any](what string, xs []T, compare func(x, y T) int, show func(T) string) error {
	for i := 1; i < len(xs); i++ {
		switch c := compare(xs[i-1], xs[i]); {
		case c == 0:
			return fmt.Errorf("%s: %q twice", what, show(xs[i]))
		case c > 0:
			return fmt.Errorf("%s: %q before %q, out of order", what, show(xs[i-1]), show(xs[i]))
		}
	}
	return nil
}

// appendErr appends err to errs unless it is nil, so that a valid entry leaves errs
// empty and its validate returns before it names the entry.
func appendErr(errs []error, err error) []error {
	if err != nil {
		errs = append(errs, err)
	}
	return errs
}

// prefixed joins errs (nil ones are dropped), each prefixed with what.
func prefixed(what string, errs []error) error {
	var out []error
	for _, err := range errs {
		if err != nil {
			out = append(out, fmt.Errorf("%s: %w", what, err))
		}
	}
	return errors.Join(out...)
}

// validateTarget checks where a Location sends a request: exactly one of an
// upstream, weighted backends and a status, each naming what exists.
func (l Location) validateTarget(upstreams map[string]bool) error {
	targets := 0
	for _, set := range []bool{l.Upstream != "", len(l.Backends) > 0, l.Status != 0} {
		if set {
			targets++
		}
	}
	if targets != 1 {
		return fmt.Errorf("path %q: %d of upstream, backends and status set, want 1", l.Path, targets)
	}
	if l.Upstream != "" && !upstreams[l.Upstream] {
		return fmt.Errorf("path %q: upstream %q does not exist", l.Path, l.Upstream)
	}
	for _, b := range l.Backends {
		if (b.Upstream == "") == (b.Status == 0) {
			return fmt.Errorf("path %q: a backend names both or neither of an upstream and a status", l.Path)
		}
		if b.Upstream != "" && !upstreams[b.Upstream] {
			return fmt.Errorf("path %q: upstream %q does not exist", l.Path, b.Upstream)
		}
		if b.Status != 0 && (b.Status < 200 || b.Status > 599) {
			return fmt.Errorf("path %q: backend status %d", l.Path, b.Status)
		}
	}
	if l.Status != 0 && (l.Status < 200 || l.Status > 599) {
		return fmt.Errorf("path %q: status %d", l.Path, l.Status)
	}
	for _, m := range l.Filters.Mirrors {
		if !upstreams[m.Upstream] {
			return fmt.Errorf("path %q: mirror upstream %q does not exist", l.Path, m.Upstream)
		}
		if m.Denominator != 0 && m.Numerator > m.Denominator {
			return fmt.Errorf("path %q: mirror share %d/%d", l.Path, m.Numerator, m.Denominator)
		}
	}
	if l.Timeouts.Request > NoTimeout || l.Timeouts.Backend > NoTimeout {
		return fmt.Errorf("path %q: timeouts %+v, more than a day", l.Path, l.Timeouts)
	}
	if l.Filters.Redirect != nil && (l.Status < 300 || l.Status > 399) {
		return fmt.Errorf("path %q: a redirect answers status %d, not a 3xx", l.Path, l.Status)
	}
	if (l.Filters.Redirect != nil && l.Filters.Redirect.Path.Type == PathChangePrefix ||
		l.Filters.Rewrite != nil && l.Filters.Rewrite.Path.Type == PathChangePrefix) && l.Type != PathPrefix {
		return fmt.Errorf("path %q: a prefix replacement needs a Prefix path, not %s", l.Path, l.Type)
	}
	return nil
}
