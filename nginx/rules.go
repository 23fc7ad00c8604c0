package nginx

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/portico-edge/portico/controlplane/model"
)

// target renders what one location does with a request it takes: its upstream
// (with cookie affinity), weighted backends or status, and its conditions and
// filters as the table's options (see lua/portico.lua). ok is false when the
// location cannot be served as asked (reported): a request then tries the next
// candidate, as if the location were not there.
func (r *renderer) target(match string, l *model.Location, obj string) (tl tmplLocation, ok bool) {
	tl = tmplLocation{Match: match, Source: commentSafe(l.Source)}
	opts, err := options(l)
	if err != nil {
		r.problem(obj, "rule", model.ReasonInvalidRule, fmt.Sprintf("path %q: %v; not served", l.Path, err))
		return tl, false
	}
	tl.Options = opts
	// Mirrors: ";mi=<upstream>*<numerator>/<denominator>" each (0/0: every
	// request); one whose upstream does not resolve is left out (reported).
	for _, m := range l.Filters.Mirrors {
		if m.Denominator != 0 && m.Numerator > m.Denominator {
			r.problem(obj, "rule", model.ReasonInvalidRule, fmt.Sprintf("path %q: mirror share %d/%d; not mirrored", l.Path, m.Numerator, m.Denominator))
			continue
		}
		if up, status := r.upstream(m.Upstream, obj); status == 0 {
			tl.Options += ";mi=" + up + "*" + strconv.FormatUint(uint64(m.Numerator), 10) + "/" + strconv.FormatUint(uint64(m.Denominator), 10)
		}
	}
	switch {
	case len(l.Backends) > 0:
		if tl.Backends, err = r.backends(l.Backends, obj); err != nil {
			r.problem(obj, "rule", model.ReasonInvalidRule, fmt.Sprintf("path %q: backend: %v; not served", l.Path, err))
			return tl, false
		}
	case l.Status != 0:
		tl.Status = l.Status
	default:
		tl.Upstream, tl.Status = r.upstream(l.Upstream, obj)
	}
	if a := l.Affinity; a.Cookie != "" && tl.Upstream != "" {
		if !model.CookieNameRE.MatchString(a.Cookie) || a.MaxAge > model.MaxCookieAge {
			r.problem(obj, "affinity", model.ReasonInvalidAnnotation, fmt.Sprintf("affinity cookie %q, max-age %d: not applied", a.Cookie, a.MaxAge))
		} else {
			tl.Affinity, tl.AffinityPath = a.Cookie, cmp.Or(strings.TrimRight(l.Path, "/"), "/")
			if a.MaxAge > 0 {
				tl.AffinityMaxAge = strconv.Itoa(int(a.MaxAge))
			}
		}
	}
	return tl, true
}

// backends renders weighted backends as "<upstream>*<weight>" or
// "@<status>*<weight>", comma-separated; a backend of weight 0 is left out, and
// when every one is, the location answers 500 (Gateway API's rule).
func (r *renderer) backends(bs []model.Backend, obj string) (string, error) {
	var b strings.Builder
	for _, be := range bs {
		if be.Weight == 0 {
			continue
		}
		if err := validateHeaderChanges(be.RequestHeaders); err != nil {
			return "", err
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		status := be.Status
		if be.Upstream != "" {
			var up string
			up, status = r.upstream(be.Upstream, obj)
			b.WriteString(up)
		}
		if status != 0 {
			b.WriteString("@" + strconv.Itoa(status))
		}
		b.WriteString("*" + strconv.FormatUint(uint64(be.Weight), 10))
		// The backend's own request headers: options, '!' for ';' (no
		// escaped value holds either).
		for _, h := range be.RequestHeaders.Set {
			b.WriteString("!s=" + escape(h.Name) + ":" + escape(h.Value))
		}
		for _, h := range be.RequestHeaders.Add {
			b.WriteString("!a=" + escape(h.Name) + ":" + escape(h.Value))
		}
		for _, n := range be.RequestHeaders.Remove {
			b.WriteString("!d=" + escape(n))
		}
	}
	if b.Len() == 0 {
		return "@500*1", nil
	}
	return b.String(), nil
}

// validateHeaderChanges checks every header a HeaderChanges names.
func validateHeaderChanges(h model.HeaderChanges) error {
	for _, nv := range append(slices.Clone(h.Set), h.Add...) {
		if err := validateHeader(nv.Name, nv.Value); err != nil {
			return err
		}
	}
	for _, n := range h.Remove {
		if err := validateHeader(n, ""); err != nil {
			return err
		}
	}
	return nil
}

// options renders a location's conditions and filters as the table's
// options, each ";<key>=<value>" with every value escaped (escape): m the
// method; h and q a header and a query parameter that must have a value
// ("<name>:<value>"); s, a, d request headers set, appended to and removed; S,
// A, D the same for the response; rs, rh, rp, rf and rx the redirect's scheme,
// host, port, full path and prefix; wh, wf and wx the rewrite's host, full
// path and prefix; tr and tb the request and backend timeouts (milliseconds);
// co, cm, ch, ce, ca and cc a CORS filter's origins, methods, headers, exposed
// headers, max age and credentials.
func options(l *model.Location) (string, error) {
	var b strings.Builder
	opt := func(k, v string) {
		b.WriteString(";" + k + "=" + escape(v))
	}
	pair := func(k, n, v string) {
		b.WriteString(";" + k + "=" + escape(n) + ":" + escape(v))
	}
	m := l.Match
	if m.Method != "" {
		if err := validateToken(m.Method); err != nil || strings.ToUpper(m.Method) != m.Method {
			return "", fmt.Errorf("method %q is not an upper-case token", m.Method)
		}
		opt("m", m.Method)
	}
	for _, h := range m.Headers {
		if err := validateHeader(h.Name, h.Value); err != nil {
			return "", err
		}
		pair("h", strings.ToLower(h.Name), h.Value)
	}
	for _, q := range m.Query {
		if q.Name == "" || !printable(q.Name) || !printable(q.Value) {
			return "", fmt.Errorf("query parameter %q=%q: empty, or a control character", q.Name, q.Value)
		}
		pair("q", q.Name, q.Value)
	}
	f := l.Filters
	for _, hc := range []struct {
		set, add, del string
		h             model.HeaderChanges
	}{{"s", "a", "d", f.RequestHeaders}, {"S", "A", "D", f.ResponseHeaders}} {
		for _, h := range hc.h.Set {
			if err := validateHeader(h.Name, h.Value); err != nil {
				return "", err
			}
			pair(hc.set, h.Name, h.Value)
		}
		for _, h := range hc.h.Add {
			if err := validateHeader(h.Name, h.Value); err != nil {
				return "", err
			}
			pair(hc.add, h.Name, h.Value)
		}
		for _, n := range hc.h.Remove {
			if err := validateHeader(n, ""); err != nil {
				return "", err
			}
			opt(hc.del, n)
		}
	}
	if rd := f.Redirect; rd != nil {
		if l.Status < 300 || l.Status > 399 {
			return "", fmt.Errorf("a redirect with status %d", l.Status)
		}
		switch rd.Scheme {
		case "", "http", "https":
		default:
			return "", fmt.Errorf("redirect scheme %q is not http or https", rd.Scheme)
		}
		b.WriteString(";r=")
		if rd.Scheme != "" {
			opt("rs", rd.Scheme)
		}
		if rd.Host != "" {
			if err := validateHost(rd.Host); err != nil || strings.HasPrefix(rd.Host, "*") {
				return "", fmt.Errorf("redirect host %q is not a host name", rd.Host)
			}
			opt("rh", rd.Host)
		}
		if rd.Port != 0 {
			opt("rp", strconv.Itoa(int(rd.Port)))
		}
		if err := pathOption(&b, "rf", "rx", rd.Path, l); err != nil {
			return "", fmt.Errorf("redirect: %w", err)
		}
	}
	if c := f.CORS; c != nil {
		for _, o := range c.AllowOrigins {
			if err := validateOrigin(o); err != nil {
				return "", err
			}
			opt("co", o)
		}
		for _, list := range []struct {
			k  string
			vs []string
		}{{"cm", c.AllowMethods}, {"ch", c.AllowHeaders}, {"ce", c.ExposeHeaders}} {
			for _, v := range list.vs {
				if err := validateToken(v); err != nil && (v != "*" || list.k == "ce") {
					return "", fmt.Errorf("CORS %q: %w", v, err)
				}
				opt(list.k, v)
			}
		}
		if c.MaxAge != 0 {
			opt("ca", strconv.Itoa(int(c.MaxAge)))
		}
		if c.AllowCredentials {
			b.WriteString(";cc=")
		}
	}
	if to := l.Timeouts; to.Request != 0 || to.Backend != 0 {
		if to.Request > model.NoTimeout || to.Backend > model.NoTimeout {
			return "", fmt.Errorf("timeouts %+v: more than a day", to)
		}
		if to.Request != 0 {
			opt("tr", strconv.Itoa(int(to.Request)))
		}
		if to.Backend != 0 {
			opt("tb", strconv.Itoa(int(to.Backend)))
		}
	}
	if rw := f.Rewrite; rw != nil {
		if rw.Host != "" {
			if err := validateHost(rw.Host); err != nil || strings.HasPrefix(rw.Host, "*") {
				return "", fmt.Errorf("rewrite host %q is not a host name", rw.Host)
			}
			opt("wh", rw.Host)
		}
		if err := pathOption(&b, "wf", "wx", rw.Path, l); err != nil {
			return "", fmt.Errorf("rewrite: %w", err)
		}
	}
	return b.String(), nil
}

// pathOption renders a path change under full or prefix.
// (with the length of the prefix replaced, pl, which the redirect and the
// rewrite share: both replace the prefix the location matched).
func pathOption(b *strings.Builder, full, prefix string, pc model.PathChange, l *model.Location) error {
	k := ""
	switch pc.Type {
	case "":
		return nil
	case model.PathChangeFull:
		k = full
	case model.PathChangePrefix:
		if l.Type != model.PathPrefix {
			return fmt.Errorf("a prefix replacement on a %s path", l.Type)
		}
		k = prefix
		if !strings.Contains(b.String(), ";pl=") {
			b.WriteString(";pl=" + strconv.Itoa(len(strings.TrimRight(l.Path, "/"))))
		}
	default:
		return fmt.Errorf("path change %q", pc.Type)
	}
	if err := validatePath(pc.Value); err != nil {
		return fmt.Errorf("path %q: %w", pc.Value, err)
	}
	b.WriteString(";" + k + "=" + escape(pc.Value))
	return nil
}

// validateOrigin checks a CORS origin: "*", or a scheme, "://" and a host
// (its first label may be "*") with an optional port, nothing nginx's Lua or
// a header could read otherwise.
func validateOrigin(o string) error {
	if o == "*" {
		return nil
	}
	scheme, rest, ok := strings.Cut(o, "://")
	if !ok || scheme == "" || rest == "" || validateToken(scheme) != nil {
		return fmt.Errorf("CORS origin %q is not scheme://host[:port]", o)
	}
	for _, c := range rest {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune(".-*:[]", c)) {
			return fmt.Errorf("CORS origin %q is not scheme://host[:port]", o)
		}
	}
	if strings.Contains(strings.TrimPrefix(rest, "*."), "*") {
		return fmt.Errorf("CORS origin %q: a wildcard is its host's first label alone", o)
	}
	return nil
}

// validateHeader checks a header's name (an RFC 9110 token) and value (no
// control character but tab).
func validateHeader(name, value string) error {
	if err := validateToken(name); err != nil {
		return fmt.Errorf("header name %q: %w", name, err)
	}
	for i := 0; i < len(value); i++ {
		if c := value[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return fmt.Errorf("header %s: value has control character %q", name, c)
		}
	}
	return nil
}

// validateToken checks an RFC 9110 token: 1 to 256 of [A-Za-z0-9!#$%&'*+.^_`|~-].
func validateToken(s string) error {
	if s == "" || len(s) > 256 {
		return errors.New("must be 1 to 256 characters")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+.^_`|~-", c) >= 0) {
			return fmt.Errorf("character %q outside a token", c)
		}
	}
	return nil
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// escape writes s with every byte outside [A-Za-z0-9._~/-] as %XX, so that no
// value holds the table's separators (space, ';', '#', ':', ',', '*', '=').
func escape(s string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._~/-", c) >= 0 {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// sameLocation reports whether two locations are equal, field for field.
func sameLocation(a, b model.Location) bool {
	if a.Path != b.Path || a.Type != b.Type || a.Rank != b.Rank || a.Upstream != b.Upstream || a.Source != b.Source ||
		a.Affinity != b.Affinity || a.Status != b.Status || a.Match.Method != b.Match.Method {
		return false
	}
	if !slices.Equal(a.Match.Headers, b.Match.Headers) || !slices.Equal(a.Match.Query, b.Match.Query) ||
		!slices.EqualFunc(a.Backends, b.Backends, func(x, y model.Backend) bool {
			return x.Upstream == y.Upstream && x.Status == y.Status && x.Weight == y.Weight && sameHeaders(x.RequestHeaders, y.RequestHeaders)
		}) {
		return false
	}
	fa, fb := a.Filters, b.Filters
	return sameHeaders(fa.RequestHeaders, fb.RequestHeaders) && sameHeaders(fa.ResponseHeaders, fb.ResponseHeaders) &&
		samePtr(fa.Redirect, fb.Redirect) && samePtr(fa.Rewrite, fb.Rewrite)
}

func sameHeaders(a, b model.HeaderChanges) bool {
	return slices.Equal(a.Set, b.Set) && slices.Equal(a.Add, b.Add) && slices.Equal(a.Remove, b.Remove)
}

func samePtr[T comparable](a, b *T) bool {
	return a == b || a != nil && b != nil && *a == *b
}
