package nginx

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/portico-edge/portico/controlplane/model"
)

// pathRule is one Ingress path of a semantics case; the backend it routes to answers
// with the rule's name ("Exact /foo/").
type pathRule struct {
	typ  model.PathType
	path string
}

func (r pathRule) name() string { return string(r.typ) + " " + r.path }

// pathCases are the examples of the Ingress specification
// (https://kubernetes.io/docs/concepts/services-networking/ingress/#examples) and the
// combinations around them. want maps a request path to the rule that must answer it,
// or to "" for a 404 (no rule matches and the host has no default backend), or to
// "default" for the host's default backend.
var pathCases = []struct {
	name      string
	rules     []pathRule
	defaultUp bool
	want      map[string]string
}{
	{name: "prefix root matches all", rules: []pathRule{{model.PathPrefix, "/"}},
		want: map[string]string{"/": "Prefix /", "/foo": "Prefix /", "/foo/bar/": "Prefix /"}},
	{name: "exact foo", rules: []pathRule{{model.PathExact, "/foo"}},
		want: map[string]string{"/foo": "Exact /foo", "/bar": "", "/foo/": "", "/foo/bar": ""}},
	{name: "exact foo slash does not match foo", rules: []pathRule{{model.PathExact, "/foo/"}},
		want: map[string]string{"/foo": "", "/foo/": "Exact /foo/", "/foo/bar": ""}},
	{name: "exact foo slash with prefix root", rules: []pathRule{{model.PathPrefix, "/"}, {model.PathExact, "/foo/"}},
		want: map[string]string{"/foo": "Prefix /", "/foo/": "Exact /foo/", "/foo/x": "Prefix /"}},
	{name: "exact slash path under a prefix", rules: []pathRule{{model.PathPrefix, "/aaa"}, {model.PathExact, "/aaa/bbb/"}},
		want: map[string]string{"/aaa/bbb": "Prefix /aaa", "/aaa/bbb/": "Exact /aaa/bbb/", "/aaa/bbb/c": "Prefix /aaa", "/x": ""}},
	{name: "exact slash path with its prefix", rules: []pathRule{{model.PathPrefix, "/foo"}, {model.PathExact, "/foo/"}},
		want: map[string]string{"/foo": "Prefix /foo", "/foo/": "Exact /foo/", "/foo/x": "Prefix /foo"}},
	{name: "exact slash path with the exact path without it", rules: []pathRule{{model.PathExact, "/foo"}, {model.PathExact, "/foo/"}},
		want: map[string]string{"/foo": "Exact /foo", "/foo/": "Exact /foo/", "/foo/x": ""}},
	{name: "exact root", rules: []pathRule{{model.PathExact, "/"}},
		want: map[string]string{"/": "Exact /", "/x": ""}},
	{name: "prefix foo", rules: []pathRule{{model.PathPrefix, "/foo"}},
		want: map[string]string{"/foo": "Prefix /foo", "/foo/": "Prefix /foo", "/foo/bar": "Prefix /foo", "/foobar": "", "/": ""}},
	{name: "prefix foo slash ignores the slash", rules: []pathRule{{model.PathPrefix, "/foo/"}},
		want: map[string]string{"/foo": "Prefix /foo/", "/foo/": "Prefix /foo/", "/foo/bar": "Prefix /foo/", "/foobar": ""}},
	{name: "prefix is not a string prefix", rules: []pathRule{{model.PathPrefix, "/aaa/bb"}},
		want: map[string]string{"/aaa/bbb": "", "/aaa/bb": "Prefix /aaa/bb", "/aaa/bb/": "Prefix /aaa/bb"}},
	{name: "prefix aaa bbb", rules: []pathRule{{model.PathPrefix, "/aaa/bbb"}},
		want: map[string]string{"/aaa/bbb": "Prefix /aaa/bbb", "/aaa/bbb/": "Prefix /aaa/bbb", "/aaa/bbb/ccc": "Prefix /aaa/bbb", "/aaa/bbbxyz": ""}},
	{name: "prefix aaa bbb slash", rules: []pathRule{{model.PathPrefix, "/aaa/bbb/"}},
		want: map[string]string{"/aaa/bbb": "Prefix /aaa/bbb/", "/aaa/bbb/": "Prefix /aaa/bbb/"}},
	{name: "longest prefix of two", rules: []pathRule{{model.PathPrefix, "/"}, {model.PathPrefix, "/aaa"}},
		want: map[string]string{"/aaa/ccc": "Prefix /aaa", "/aaa": "Prefix /aaa", "/aaaa": "Prefix /"}},
	{name: "longest prefix of three", rules: []pathRule{{model.PathPrefix, "/"}, {model.PathPrefix, "/aaa"}, {model.PathPrefix, "/aaa/bbb"}},
		want: map[string]string{"/aaa/bbb": "Prefix /aaa/bbb", "/ccc": "Prefix /", "/aaa/bbbxyz": "Prefix /aaa", "/aaa/bbb/c": "Prefix /aaa/bbb"}},
	{name: "no match uses the default backend", rules: []pathRule{{model.PathPrefix, "/aaa"}}, defaultUp: true,
		want: map[string]string{"/ccc": "default", "/aaa/x": "Prefix /aaa", "/aaax": "default"}},
	{name: "exact slash path with a default backend", rules: []pathRule{{model.PathExact, "/foo/"}}, defaultUp: true,
		want: map[string]string{"/foo": "default", "/foo/": "Exact /foo/"}},
	{name: "exact beats prefix of the same path", rules: []pathRule{{model.PathExact, "/foo"}, {model.PathPrefix, "/foo"}},
		want: map[string]string{"/foo": "Exact /foo", "/foo/": "Prefix /foo", "/foo/x": "Prefix /foo"}},
	// A Prefix path's trailing slash is ignored, so Exact "/foo" and Prefix "/foo/"
	// are the same length for "/foo": Exact wins.
	{name: "exact beats prefix with a trailing slash", rules: []pathRule{{model.PathExact, "/foo"}, {model.PathPrefix, "/foo/"}},
		want: map[string]string{"/foo": "Exact /foo", "/foo/": "Prefix /foo/", "/foo/x": "Prefix /foo/"}},
	{name: "longest path wins over type", rules: []pathRule{{model.PathPrefix, "/a"}, {model.PathPrefix, "/a/b"}, {model.PathExact, "/a/b/c"}},
		want: map[string]string{"/a/b/c": "Exact /a/b/c", "/a/b/c/d": "Prefix /a/b", "/a/b/cd": "Prefix /a/b", "/a/x": "Prefix /a", "/a/b": "Prefix /a/b"}},
	// Portico treats ImplementationSpecific as Prefix, as ingress-nginx does.
	{name: "implementation specific is prefix", rules: []pathRule{{model.PathImplementationSpecific, "/foo"}},
		want: map[string]string{"/foo": "ImplementationSpecific /foo", "/foo/": "ImplementationSpecific /foo", "/foo/x": "ImplementationSpecific /foo", "/foobar": ""}},
	{name: "exact beats implementation specific", rules: []pathRule{{model.PathImplementationSpecific, "/foo"}, {model.PathExact, "/foo"}},
		want: map[string]string{"/foo": "Exact /foo", "/foo/x": "ImplementationSpecific /foo"}},
}

// pathSnapshot is a snapshot with one host per path case ("c<i>.test") and one
// upstream, and backend, per rule.
func pathSnapshot(t *testing.T) model.Snapshot {
	t.Helper()
	var snap model.Snapshot
	ups := map[string]netip.AddrPort{}
	upstream := func(name string) string {
		n := "t-" + strings.NewReplacer(" ", "-", "/", "s").Replace(strings.ToLower(name))
		if _, ok := ups[n]; !ok {
			_, ep := backend(t, name)
			ups[n] = ep
			snap.Upstreams = append(snap.Upstreams, model.Upstream{Name: n, Endpoints: []netip.AddrPort{ep}})
		}
		return n
	}
	for i, tc := range pathCases {
		s := model.Server{Host: fmt.Sprintf("c%d.test", i)}
		for _, r := range tc.rules {
			s.Locations = append(s.Locations, model.Location{Path: r.path, Type: r.typ, Upstream: upstream(r.name())})
		}
		if tc.defaultUp {
			s.DefaultUpstream = upstream("default")
		}
		snap.Servers = append(snap.Servers, s)
	}
	return snap
}

// TestServePathSemantics sends the Ingress specification's examples through a real
// nginx: every request must reach the rule the specification names, or get a 404 (or
// the default backend) when none matches. No request is ever redirected.
func TestServePathSemantics(t *testing.T) {
	snap := pathSnapshot(t)
	cfg, err := Render(snap, goldenOptions())
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Problems) != 0 {
		t.Fatalf("problems rendering the cases: %v", cfg.Problems)
	}
	n := startNginx(t, snap)
	c := n.client(false)
	for i, tc := range pathCases {
		t.Run(tc.name, func(t *testing.T) {
			for path, want := range tc.want {
				url := fmt.Sprintf("http://c%d.test%s", i, path)
				resp, body := get(t, c, url)
				switch {
				case want == "" && resp.StatusCode != 404:
					t.Errorf("GET %s = %d %q, want 404 (no rule matches)", path, resp.StatusCode, body)
				case want != "" && (resp.StatusCode != 200 || body != want+" "+path):
					t.Errorf("GET %s = %d %q, want 200 from %q", path, resp.StatusCode, body, want)
				}
			}
		})
	}
}

// TestServeHostSemantics: a wildcard host matches exactly one more DNS label, and an
// exact host beats a wildcard that also matches it.
func TestServeHostSemantics(t *testing.T) {
	_, wild := backend(t, "wild")
	_, exact := backend(t, "exact")
	_, deeper := backend(t, "deeper")
	snap := model.Snapshot{
		Servers: []model.Server{
			{Host: "*.bar.foo.test", DefaultUpstream: "t-deeper-80"},
			{Host: "*.foo.test", DefaultUpstream: "t-wild-80"},
			{Host: "exact.foo.test", DefaultUpstream: "t-exact-80"},
		},
		Upstreams: []model.Upstream{
			{Name: "t-deeper-80", Endpoints: []netip.AddrPort{deeper}},
			{Name: "t-exact-80", Endpoints: []netip.AddrPort{exact}},
			{Name: "t-wild-80", Endpoints: []netip.AddrPort{wild}},
		},
	}
	n := startNginx(t, snap)
	c := n.client(false)
	for _, tc := range []struct{ host, want string }{
		{"bar.foo.test", "wild"},
		{"BAR.Foo.test", "wild"}, // host names are case-insensitive
		{"bar.foo.test.", "wild"},
		{"exact.foo.test", "exact"},
		{"baz.bar.foo.test", "deeper"},
		{"foo.test", ""},
		{"a.baz.bar.foo.test", ""},
		{"barfoo.test", ""},
	} {
		t.Run(tc.host, func(t *testing.T) {
			if tc.want == "" {
				expectClosed(t, n, tc.host)
				return
			}
			resp, body := get(t, c, "http://"+tc.host+"/x")
			if resp.StatusCode != 200 || body != tc.want+" /x" {
				t.Errorf("Host %s = %d %q, want 200 from %s", tc.host, resp.StatusCode, body, tc.want)
			}
		})
	}
}

// TestRenderUnmatchedHost: the default server answers as the rendered group asks
// (Options.Group); another group's choice, or no group, keeps the connection close,
// and a catch-all Server takes the default server's place whatever the choice.
func TestRenderUnmatchedHost(t *testing.T) {
	groups := []model.Group{{Name: "edge/a", UnmatchedHost: model.UnmatchedHostNotFound}, {Name: "edge/b"}}
	host := model.Server{Host: "a.test", DefaultUpstream: "t-a-80"}
	catchAll := model.Server{DefaultUpstream: "t-a-80"}
	for _, tc := range []struct {
		name    string
		group   string
		servers []model.Server
		want    string // the catch-all's routes in the table
	}{
		{name: "not-found group", group: "edge/a", servers: []model.Server{host}, want: "- - 404"},
		{name: "group without the annotation", group: "edge/b", servers: []model.Server{host}, want: "- - 444"},
		{name: "every group", group: "", servers: []model.Server{host}, want: "- - 444"},
		{name: "unknown group", group: "edge/c", servers: []model.Server{host}, want: "- - 444"},
		{name: "catch-all server", group: "edge/a", servers: []model.Server{catchAll, host}, want: "- - - / t-a-80"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap := model.Snapshot{Groups: groups, Upstreams: []model.Upstream{{Name: "t-a-80"}}}
			for _, s := range tc.servers {
				s.Group = tc.group
				snap.Servers = append(snap.Servers, s)
			}
			opt := goldenOptions()
			opt.Group = tc.group
			cfg, err := Render(snap, opt)
			if err != nil {
				t.Fatal(err)
			}
			if len(cfg.Problems) != 0 {
				t.Errorf("problems: %v", cfg.Problems)
			}
			if got := cfg.Table["h:"]; got != tc.want {
				t.Errorf("catch-all routes %q, want %q", got, tc.want)
			}
			nginxTest(t, t.TempDir(), cfg, opt)
		})
	}
}

// TestServeUnmatchedHost: through a real nginx, a host no server names (an unknown
// one, or one a wildcard does not match) has its connection closed by default and
// gets a 404 when the group asks for it; a catch-all server (an Ingress default
// backend) answers it either way. TLS for an unknown name is refused either way:
// there is no certificate to answer with.
func TestServeUnmatchedHost(t *testing.T) {
	_, epA := backend(t, "A")
	_, epD := backend(t, "D")
	ups := []model.Upstream{{Name: "t-a-80", Endpoints: []netip.AddrPort{epA}}, {Name: "t-d-80", Endpoints: []netip.AddrPort{epD}}}
	snap := func(answer model.UnmatchedHost, catchAll bool) model.Snapshot {
		s := model.Snapshot{
			Groups: []model.Group{{Name: "edge/g", UnmatchedHost: answer}},
			Servers: []model.Server{
				{Group: "edge/g", Host: "*.wild.test", DefaultUpstream: "t-a-80"},
				{Group: "edge/g", Host: "a.test", DefaultUpstream: "t-a-80"},
			},
			Upstreams: ups,
		}
		if catchAll {
			s.Servers = append([]model.Server{{Group: "edge/g", DefaultUpstream: "t-d-80"}}, s.Servers...)
		}
		return s
	}
	group := func(o *Options) { o.Group = "edge/g" }
	unmatched := []string{"unknown.test", "a.b.wild.test", "wild.test"}
	for _, tc := range []struct {
		name     string
		answer   model.UnmatchedHost
		catchAll bool
		want     int // 0: connection closed
	}{
		{name: "close (default)", answer: model.UnmatchedHostClose, want: 0},
		{name: "not-found", answer: model.UnmatchedHostNotFound, want: 404},
		{name: "not-found with a default backend", answer: model.UnmatchedHostNotFound, catchAll: true, want: 200},
		{name: "close with a default backend", answer: model.UnmatchedHostClose, catchAll: true, want: 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := startNginx(t, snap(tc.answer, tc.catchAll), group)
			c := n.client(false)
			if resp, body := get(t, c, "http://a.test/x"); resp.StatusCode != 200 || body != "A /x" {
				t.Errorf("a.test = %d %q, want 200 from A", resp.StatusCode, body)
			}
			for _, host := range unmatched {
				if tc.want == 0 {
					expectClosed(t, n, host)
					continue
				}
				resp, body := get(t, c, "http://"+host+"/x")
				if resp.StatusCode != tc.want || (tc.want == 200 && body != "D /x") {
					t.Errorf("%s = %d %q, want %d", host, resp.StatusCode, body, tc.want)
				}
			}
			conn, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", n.opt.HTTPSPort), &tls.Config{ServerName: "unknown.test", InsecureSkipVerify: true})
			if err == nil {
				conn.Close()
				t.Error("TLS handshake for unknown.test succeeded")
			}
		})
	}
}

// TestServeUnmatchedHostChange: changing only the group's choice is a change of
// the table, which needs no reload.
func TestServeUnmatchedHostChange(t *testing.T) {
	_, epA := backend(t, "A")
	snap := model.Snapshot{
		Groups:    []model.Group{{Name: "edge/g"}},
		Servers:   []model.Server{{Group: "edge/g", Host: "a.test", DefaultUpstream: "t-a-80"}},
		Upstreams: []model.Upstream{{Name: "t-a-80", Endpoints: []netip.AddrPort{epA}}},
	}
	n := startNginx(t, snap, func(o *Options) { o.Group = "edge/g" })
	expectClosed(t, n, "unknown.test")
	snap.Groups[0].UnmatchedHost = model.UnmatchedHostNotFound
	if res, err := n.r.ApplyNow(context.Background(), snap); err != nil || res.Result != ResultTable {
		t.Fatalf("apply not-found: %s, %v", res.Result, err)
	}
	if resp, body := get(t, n.client(false), "http://unknown.test/x"); resp.StatusCode != 404 {
		t.Errorf("unknown.test after the change = %d %q, want 404", resp.StatusCode, body)
	}
}
