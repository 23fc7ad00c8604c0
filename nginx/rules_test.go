package nginx

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/portico-edge/portico/controlplane/model"
)

// echoed is what echoBackend answers: the request as the backend saw it.
type echoed struct {
	Name, Method, Host, Path, Query string
	Headers                         map[string][]string
}

// echoBackend answers every request with echoed, as JSON.
func echoBackend(t *testing.T, name string) netip.AddrPort {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d, err := time.ParseDuration(r.URL.Query().Get("delay")); err == nil && d > 0 && d < 5*time.Second {
			time.Sleep(d) // as the conformance suite's echo backend does
		}
		w.Header().Set("X-Backend", name)
		w.Header().Set("X-Backend-Set", "from-backend")
		w.Header().Set("X-Backend-Remove", "from-backend")
		json.NewEncoder(w).Encode(echoed{Name: name, Method: r.Method, Host: r.Host, Path: r.URL.Path, Query: r.URL.RawQuery, Headers: r.Header})
	}))
	t.Cleanup(s.Close)
	return netip.MustParseAddrPort(s.Listener.Addr().String())
}

// do sends one request and decodes the echo (Name "" when the answer is not
// one).
func do(t *testing.T, c *http.Client, method, url string, hdr ...string) (*http.Response, echoed) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	var e echoed
	json.NewDecoder(resp.Body).Decode(&e)
	return resp, e
}

// TestServeRules checks Gateway API's rules in a real nginx: conditions and
// their precedence, weights, header filters, redirects and rewrites, and
// wildcards of any depth.
func TestServeRules(t *testing.T) {
	a, b, c := echoBackend(t, "a"), echoBackend(t, "b"), echoBackend(t, "c")
	// The mirror: what it was sent, method, path, a header and the body.
	mirrored := make(chan string, 100)
	ms := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mirrored <- r.Method + " " + r.URL.RequestURI() + " " + r.Header.Get("X-Test") + " " + string(body)
	}))
	t.Cleanup(ms.Close)
	m := netip.MustParseAddrPort(ms.Listener.Addr().String())
	hdr := func(n, v string) []model.NameValue { return []model.NameValue{{Name: n, Value: v}} }
	snap := model.Snapshot{
		Servers: []model.Server{
			{Host: "**.deep.test", Locations: []model.Location{{Path: "/", Type: model.PathPrefix, Upstream: "t-c-80"}}},
			{Host: "m.test", Locations: []model.Location{
				{Path: "/", Type: model.PathPrefix, Match: model.RequestMatch{Headers: hdr("version", "two")}, Upstream: "t-b-80"},
				{Path: "/", Type: model.PathPrefix, Rank: 1, Upstream: "t-a-80"},
				{Path: "/api", Type: model.PathExact, Match: model.RequestMatch{Method: "POST"}, Upstream: "t-c-80"},
				{Path: "/api", Type: model.PathPrefix, Match: model.RequestMatch{Query: hdr("q", "a b")}, Upstream: "t-b-80"},
				// Higher precedence (Rank 0) than the one above it in the file, and two
				// conditions: both must hold.
				{Path: "/api", Type: model.PathPrefix, Rank: 1, Match: model.RequestMatch{Method: "GET", Headers: []model.NameValue{{Name: "x-a", Value: "1"}, {Name: "X-B", Value: "2"}}}, Upstream: "t-c-80"},
			}},
			{Host: "w.test", Locations: []model.Location{
				{Path: "/", Type: model.PathPrefix, Backends: []model.Backend{{Upstream: "t-a-80", Weight: 3}, {Upstream: "t-b-80", Weight: 1}, {Upstream: "t-c-80", Weight: 0}}},
				{Path: "/half", Type: model.PathPrefix, Backends: []model.Backend{{Upstream: "t-a-80", Weight: 1}, {Status: 500, Weight: 1}}},
				{Path: "/none", Type: model.PathPrefix, Backends: []model.Backend{{Upstream: "t-a-80", Weight: 0}}},
				{Path: "/each", Type: model.PathPrefix, Filters: model.Filters{RequestHeaders: model.HeaderChanges{Set: hdr("X-Rule", "r")}},
					Backends: []model.Backend{
						{Upstream: "t-a-80", Weight: 1, RequestHeaders: model.HeaderChanges{Set: hdr("X-Which", "a, the first")}},
						{Upstream: "t-b-80", Weight: 1, RequestHeaders: model.HeaderChanges{Set: hdr("X-Which", "b"), Remove: []string{"X-Rule"}}}}},
			}},
			{Host: "mi.test", Locations: []model.Location{
				{Path: "/m", Type: model.PathPrefix, Upstream: "t-a-80", Filters: model.Filters{Mirrors: []model.Mirror{{Upstream: "t-m-80"}}}},
				{Path: "/never", Type: model.PathPrefix, Upstream: "t-a-80", Filters: model.Filters{Mirrors: []model.Mirror{{Upstream: "t-m-80", Numerator: 0, Denominator: 100}}}},
				{Path: "/w", Type: model.PathPrefix, Upstream: "t-b-80", Filters: model.Filters{Mirrors: []model.Mirror{{Upstream: "t-m-80", Numerator: 1, Denominator: 1}},
					RequestHeaders: model.HeaderChanges{Set: hdr("X-Test", "set")}, Rewrite: &model.Rewrite{Path: model.PathChange{Type: model.PathChangeFull, Value: "/rewritten"}}}},
			}},
			{Host: "c.test", Locations: []model.Location{
				{Path: "/one", Type: model.PathPrefix, Upstream: "t-a-80", Filters: model.Filters{CORS: &model.CORS{
					AllowOrigins: []string{"https://www.foo.com", "https://*.bar.com"}, AllowMethods: []string{"GET", "OPTIONS"},
					AllowHeaders: []string{"x-header-1", "x-header-2"}, ExposeHeaders: []string{"x-header-3"}, MaxAge: 3600, AllowCredentials: true}}},
				{Path: "/any", Type: model.PathPrefix, Upstream: "t-a-80", Filters: model.Filters{CORS: &model.CORS{
					AllowOrigins: []string{"*"}, AllowMethods: []string{"*"}, AllowHeaders: []string{"*"}}}},
			}},
			{Host: "t.test", Locations: []model.Location{
				{Path: "/req", Type: model.PathPrefix, Upstream: "t-a-80", Timeouts: model.Timeouts{Request: 1000}},
				{Path: "/be", Type: model.PathPrefix, Upstream: "t-a-80", Timeouts: model.Timeouts{Backend: 1000, Request: model.NoTimeout}},
				{Path: "/none", Type: model.PathPrefix, Upstream: "t-a-80", Timeouts: model.Timeouts{Request: model.NoTimeout, Backend: model.NoTimeout}},
			}},
			{Host: "f.test", Locations: []model.Location{
				{Path: "/req", Type: model.PathPrefix, Upstream: "t-a-80", Filters: model.Filters{RequestHeaders: model.HeaderChanges{
					Set: hdr("X-Set", "new value; with=separators#"), Add: []model.NameValue{{Name: "X-Add", Value: "added"}, {Name: "X-New", Value: "n"}}, Remove: []string{"X-Remove"}}}},
				{Path: "/resp", Type: model.PathPrefix, Upstream: "t-a-80", Filters: model.Filters{ResponseHeaders: model.HeaderChanges{
					Set: hdr("X-Backend-Set", "changed"), Add: hdr("X-Resp-Add", "r"), Remove: []string{"X-Backend-Remove"}}}},
				{Path: "/moved", Type: model.PathPrefix, Status: 301, Filters: model.Filters{Redirect: &model.Redirect{Scheme: "https", Host: "new.test"}}},
				{Path: "/port", Type: model.PathPrefix, Status: 302, Filters: model.Filters{Redirect: &model.Redirect{Port: 8443, Path: model.PathChange{Type: model.PathChangeFull, Value: "/elsewhere"}}}},
				{Path: "/same", Type: model.PathPrefix, Status: 302, Filters: model.Filters{Redirect: &model.Redirect{}}},
				{Path: "/old", Type: model.PathPrefix, Status: 302, Filters: model.Filters{Redirect: &model.Redirect{Scheme: "http", Path: model.PathChange{Type: model.PathChangePrefix, Value: "/new"}}}},
				{Path: "/v1", Type: model.PathPrefix, Upstream: "t-b-80", Filters: model.Filters{Rewrite: &model.Rewrite{Host: "inner.test", Path: model.PathChange{Type: model.PathChangePrefix, Value: "/v2/"}}}},
				{Path: "/strip", Type: model.PathPrefix, Upstream: "t-b-80", Filters: model.Filters{Rewrite: &model.Rewrite{Path: model.PathChange{Type: model.PathChangePrefix, Value: "/"}}}},
				{Path: "/full", Type: model.PathPrefix, Upstream: "t-b-80", Filters: model.Filters{Rewrite: &model.Rewrite{Path: model.PathChange{Type: model.PathChangeFull, Value: "/one"}}}},
			}},
		},
		Upstreams: []model.Upstream{{Name: "t-a-80", Endpoints: []netip.AddrPort{a}}, {Name: "t-b-80", Endpoints: []netip.AddrPort{b}}, {Name: "t-c-80", Endpoints: []netip.AddrPort{c}},
			{Name: "t-m-80", Endpoints: []netip.AddrPort{m}}},
	}
	n := startNginx(t, snap)
	cl := n.client(false)

	t.Run("conditions", func(t *testing.T) {
		for _, tc := range []struct {
			method, url string
			hdr         []string
			want        string
		}{
			{"GET", "http://m.test/", nil, "a"},
			{"GET", "http://m.test/x", []string{"Version", "two"}, "b"},
			{"GET", "http://m.test/x", []string{"Version", "three"}, "a"},
			{"POST", "http://m.test/api", nil, "c"},                                       // Exact with its method
			{"GET", "http://m.test/api", nil, "a"},                                        // Exact's method fails, no Prefix /api condition holds: "/"
			{"GET", "http://m.test/api/x?q=a%20b", nil, "b"},                              // query, decoded
			{"GET", "http://m.test/api/x?q=a", nil, "a"},                                  // wrong value: the shorter prefix
			{"GET", "http://m.test/api/x?q=a%20b", []string{"x-a", "1", "x-b", "2"}, "b"}, // rank 0 before rank 1
			{"GET", "http://m.test/api/x", []string{"x-a", "1", "x-b", "2"}, "c"},
			{"GET", "http://m.test/api/x", []string{"x-a", "1"}, "a"},              // one of two headers
			{"HEAD", "http://m.test/api/x", []string{"x-a", "1", "x-b", "2"}, "a"}, // the GET rule does not take HEAD
			{"GET", "http://m.test/apix", []string{"x-a", "1", "x-b", "2"}, "a"},   // path elements only
		} {
			resp, _ := do(t, cl, tc.method, tc.url, tc.hdr...)
			if got := resp.Header.Get("X-Backend"); resp.StatusCode != 200 || got != tc.want {
				t.Errorf("%s %s %v = %d from %q, want 200 from %q", tc.method, tc.url, tc.hdr, resp.StatusCode, got, tc.want)
			}
		}
	})

	t.Run("mirrors", func(t *testing.T) {
		next := func() string {
			select {
			case got := <-mirrored:
				return got
			case <-time.After(3 * time.Second):
				return "nothing"
			}
		}
		for _, tc := range []struct {
			method, url, body, want, mirror string
		}{
			{"GET", "http://mi.test/m/x?q=1", "", "a", "GET /m/x?q=1 1 "},
			{"POST", "http://mi.test/m/post", "hello", "a", "POST /m/post 1 hello"},
			{"GET", "http://mi.test/w/x?q=2", "", "b", "GET /rewritten?q=2 set "}, // as proxied: rewritten, its header set
		} {
			req, _ := http.NewRequest(tc.method, tc.url, strings.NewReader(tc.body))
			req.Header.Set("X-Test", "1")
			resp, err := cl.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if got := resp.Header.Get("X-Backend"); got != tc.want {
				t.Errorf("%s %s answered by %q, want %q", tc.method, tc.url, got, tc.want)
			}
			if got := next(); got != tc.mirror {
				t.Errorf("%s %s: the mirror got %q, want %q", tc.method, tc.url, got, tc.mirror)
			}
		}
		for range 20 {
			do(t, cl, "GET", "http://mi.test/never")
		}
		select {
		case got := <-mirrored:
			t.Errorf("a 0%% mirror got %q", got)
		case <-time.After(500 * time.Millisecond):
		}
	})

	t.Run("cors", func(t *testing.T) {
		for _, tc := range []struct {
			method, path string
			hdr          []string
			status       int
			want         map[string]string // "" for absent
		}{
			{"OPTIONS", "/one", []string{"Origin", "https://www.foo.com", "Access-Control-Request-Method", "GET", "Access-Control-Request-Headers", "x-header-1"}, 204,
				map[string]string{"Access-Control-Allow-Origin": "https://www.foo.com", "Access-Control-Allow-Methods": "GET, OPTIONS",
					"Access-Control-Allow-Headers": "x-header-1, x-header-2", "Access-Control-Expose-Headers": "x-header-3",
					"Access-Control-Max-Age": "3600", "Access-Control-Allow-Credentials": "true", "X-Backend": ""}},
			{"OPTIONS", "/one", []string{"Origin", "https://a.www.bar.com", "Access-Control-Request-Method", "GET"}, 204,
				map[string]string{"Access-Control-Allow-Origin": "https://a.www.bar.com"}},
			{"OPTIONS", "/one", []string{"Origin", "https://bar.com", "Access-Control-Request-Method", "GET"}, 204,
				map[string]string{"Access-Control-Allow-Origin": "", "Access-Control-Allow-Methods": ""}},
			{"OPTIONS", "/one", []string{"Origin", "http://www.foo.com", "Access-Control-Request-Method", "GET"}, 204,
				map[string]string{"Access-Control-Allow-Origin": ""}}, // another scheme
			{"GET", "/one", []string{"Origin", "https://www.foo.com"}, 200,
				map[string]string{"Access-Control-Allow-Origin": "https://www.foo.com", "Access-Control-Allow-Credentials": "true", "X-Backend": "a"}},
			{"GET", "/one", []string{"Origin", "https://evil.com"}, 200,
				map[string]string{"Access-Control-Allow-Origin": "", "X-Backend": "a"}},
			{"OPTIONS", "/one", nil, 200, map[string]string{"X-Backend": "a"}}, // not a preflight: proxied
			{"OPTIONS", "/any", []string{"Origin", "https://x.test:8443", "Access-Control-Request-Method", "PUT", "Access-Control-Request-Headers", "x-a, x-b"}, 204,
				map[string]string{"Access-Control-Allow-Origin": "https://x.test:8443", "Access-Control-Allow-Methods": "PUT",
					"Access-Control-Allow-Headers": "x-a, x-b", "Access-Control-Allow-Credentials": ""}},
		} {
			resp, _ := do(t, cl, tc.method, "http://c.test"+tc.path, tc.hdr...)
			if resp.StatusCode != tc.status {
				t.Errorf("%s %s %v = %d, want %d", tc.method, tc.path, tc.hdr, resp.StatusCode, tc.status)
			}
			for k, v := range tc.want {
				if got := resp.Header.Get(k); got != v {
					t.Errorf("%s %s %v: %s %q, want %q", tc.method, tc.path, tc.hdr, k, got, v)
				}
			}
		}
	})

	t.Run("timeouts", func(t *testing.T) {
		for _, tc := range []struct {
			url  string
			want int
		}{
			{"http://t.test/req", 200}, {"http://t.test/req?delay=2500ms", 504},
			{"http://t.test/be", 200}, {"http://t.test/be?delay=2500ms", 504},
			{"http://t.test/none?delay=2500ms", 200},
		} {
			start := time.Now()
			resp, _ := do(t, cl, "GET", tc.url)
			if resp.StatusCode != tc.want {
				t.Errorf("GET %s = %d after %v, want %d", tc.url, resp.StatusCode, time.Since(start).Round(time.Millisecond), tc.want)
			}
		}
	})

	t.Run("weights", func(t *testing.T) {
		got := map[string]int{}
		for range 400 {
			_, e := do(t, cl, "GET", "http://w.test/")
			got[e.Name]++
		}
		// Smooth weighted round robin in each of two workers: each takes a and b
		// 3:1 exactly, whatever share of the requests it gets, to within one
		// cycle of 4 requests per worker.
		if got["a"] < 292 || got["a"] > 308 || got["a"]+got["b"] != 400 || got["c"] != 0 {
			t.Errorf("400 requests went %v, want about 300 to a and 100 to b, none to c (weight 0)", got)
		}
		statuses := map[int]int{}
		for range 100 {
			resp, _ := do(t, cl, "GET", "http://w.test/half")
			statuses[resp.StatusCode]++
		}
		if statuses[200] < 46 || statuses[200] > 54 || statuses[200]+statuses[500] != 100 {
			t.Errorf("half to a, half answered 500: got %v", statuses)
		}
		if resp, _ := do(t, cl, "GET", "http://w.test/none"); resp.StatusCode != 500 {
			t.Errorf("every backend of weight 0: %d, want 500", resp.StatusCode)
		}
		// Each backend's own request headers, after the rule's.
		seen := map[string]int{}
		for range 20 {
			_, e := do(t, cl, "GET", "http://w.test/each")
			h := http.Header(e.Headers)
			want := map[string]string{"a": "a, the first|r", "b": "b|"}[e.Name]
			if got := h.Get("X-Which") + "|" + h.Get("X-Rule"); got != want {
				t.Errorf("backend %q saw X-Which|X-Rule %q, want %q", e.Name, got, want)
			}
			seen[e.Name]++
		}
		if seen["a"] == 0 || seen["b"] == 0 {
			t.Errorf("20 requests went %v, want both backends", seen)
		}
	})

	t.Run("header filters", func(t *testing.T) {
		_, e := do(t, cl, "GET", "http://f.test/req", "X-Set", "old", "X-Add", "first", "X-Remove", "gone", "X-Keep", "kept")
		h := http.Header(e.Headers)
		for name, want := range map[string]string{"X-Set": "new value; with=separators#", "X-Add": "first,added", "X-New": "n", "X-Remove": "", "X-Keep": "kept"} {
			if got := strings.Join(h.Values(name), ","); got != want {
				t.Errorf("request header %s = %q at the backend, want %q", name, got, want)
			}
		}
		resp, _ := do(t, cl, "GET", "http://f.test/resp")
		for name, want := range map[string]string{"X-Backend-Set": "changed", "X-Resp-Add": "r", "X-Backend-Remove": ""} {
			if got := strings.Join(resp.Header.Values(name), ","); got != want {
				t.Errorf("response header %s = %q, want %q", name, got, want)
			}
		}
	})

	t.Run("redirects", func(t *testing.T) {
		for _, tc := range []struct {
			url, want string
			status    int
		}{
			{"http://f.test/moved/x?a=1", "https://new.test/moved/x?a=1", 301},
			{"http://f.test/port/x?a=1", "http://f.test:8443/elsewhere?a=1", 302},
			{"http://f.test/same", fmt.Sprintf("http://f.test:%d/same", n.opt.HTTPPort), 302},
			{"http://f.test/old/x/y", "http://f.test/new/x/y", 302},
			{"http://f.test/old", "http://f.test/new", 302},
		} {
			resp, _ := do(t, cl, "GET", tc.url)
			if resp.StatusCode != tc.status || resp.Header.Get("Location") != tc.want {
				t.Errorf("GET %s = %d Location %q, want %d %q", tc.url, resp.StatusCode, resp.Header.Get("Location"), tc.status, tc.want)
			}
		}
	})

	t.Run("rewrites", func(t *testing.T) {
		for _, tc := range []struct{ url, host, path, query string }{
			{"http://f.test/v1/users?id=7", "inner.test", "/v2/users", "id=7"},
			{"http://f.test/v1", "inner.test", "/v2", ""},
			{"http://f.test/strip/a/b", "f.test", "/a/b", ""},
			{"http://f.test/strip", "f.test", "/", ""},
			{"http://f.test/full/x?k=v", "f.test", "/one", "k=v"},
		} {
			resp, e := do(t, cl, "GET", tc.url)
			if resp.StatusCode != 200 || e.Host != tc.host || e.Path != tc.path || e.Query != tc.query {
				t.Errorf("GET %s reached %q %q ?%q (%d), want %q %q ?%q", tc.url, e.Host, e.Path, e.Query, resp.StatusCode, tc.host, tc.path, tc.query)
			}
		}
	})

	t.Run("host header with its port", func(t *testing.T) {
		req, _ := http.NewRequest("GET", "http://f.test/req", nil)
		req.Host = "f.test:1234"
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e echoed
		json.NewDecoder(resp.Body).Decode(&e)
		if e.Host != "f.test:1234" {
			t.Errorf("the backend saw Host %q, want the client's f.test:1234", e.Host)
		}
	})

	t.Run("wildcard of any depth", func(t *testing.T) {
		for _, host := range []string{"a.deep.test", "a.b.c.deep.test"} {
			if _, e := do(t, cl, "GET", "http://"+host+"/"); e.Name != "c" {
				t.Errorf("%s reached %q, want c", host, e.Name)
			}
		}
		expectClosed(t, n, "deep.test")
		expectClosed(t, n, "xdeep.test")
	})
}

// TestRuleOptions checks how the table writes rules, and that a rule nginx
// cannot serve as written is reported and left out, its host served.
func TestRuleOptions(t *testing.T) {
	l := model.Location{Path: "/p/", Type: model.PathPrefix, Upstream: "u",
		Match:   model.RequestMatch{Method: "PUT", Headers: []model.NameValue{{Name: "X-Y", Value: "a b;c#d"}}, Query: []model.NameValue{{Name: "k:1", Value: "=,*"}}},
		Filters: model.Filters{Rewrite: &model.Rewrite{Path: model.PathChange{Type: model.PathChangePrefix, Value: "/q"}}}}
	got, err := options(&l)
	want := ";m=PUT;h=x-y:a%20b%3Bc%23d;q=k%3A1:%3D%2C%2A;pl=2;wx=/q"
	if err != nil || got != want {
		t.Errorf("options = %q, %v; want %q", got, err, want)
	}
	r := &renderer{upstreams: map[string]model.Upstream{"u": {Name: "u"}}}
	if got, err := r.backends([]model.Backend{{Upstream: "u", Weight: 2, RequestHeaders: model.HeaderChanges{Set: []model.NameValue{{Name: "B", Value: "x!y,z"}}, Remove: []string{"C"}}},
		{Status: 500, Weight: 1}}, "ns/r"); err != nil || got != "u*2!s=B:x%21y%2Cz!d=C,@500*1" {
		t.Errorf("backends = %q, %v", got, err)
	}
	if _, err := r.backends([]model.Backend{{Upstream: "u", Weight: 1, RequestHeaders: model.HeaderChanges{Add: []model.NameValue{{Name: "a b", Value: "v"}}}}}, "ns/r"); err == nil {
		t.Error("a backend's header name that is not a token was taken")
	}
	for _, bad := range []model.Location{
		{Match: model.RequestMatch{Method: "get"}},
		{Match: model.RequestMatch{Headers: []model.NameValue{{Name: "a b", Value: "v"}}}},
		{Filters: model.Filters{RequestHeaders: model.HeaderChanges{Set: []model.NameValue{{Name: "X", Value: "a\r\nInjected: 1"}}}}},
		{Status: 302, Filters: model.Filters{Redirect: &model.Redirect{Scheme: "ftp"}}},
		{Status: 200, Filters: model.Filters{Redirect: &model.Redirect{}}},
		{Type: model.PathExact, Filters: model.Filters{Rewrite: &model.Rewrite{Path: model.PathChange{Type: model.PathChangePrefix, Value: "/x"}}}},
		{Type: model.PathPrefix, Filters: model.Filters{Rewrite: &model.Rewrite{Path: model.PathChange{Type: model.PathChangeFull, Value: "/a/../b"}}}},
	} {
		if got, err := options(&bad); err == nil {
			t.Errorf("options(%+v) = %q, want an error", bad, got)
		}
	}

	snap := model.Snapshot{
		Servers: []model.Server{{Host: "a.test", Locations: []model.Location{
			{Path: "/", Type: model.PathPrefix, Upstream: "u"},
			{Path: "/x", Type: model.PathPrefix, Upstream: "u", Source: "ns/bad", Match: model.RequestMatch{Headers: []model.NameValue{{Name: "bad name", Value: "v"}}}},
		}}},
		Upstreams: []model.Upstream{{Name: "u", Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.0.0.1:80")}}},
	}
	cfg, err := Render(snap, DefaultOptions(""))
	if err != nil {
		t.Fatal(err)
	}
	if v := cfg.Table["h:a.test"]; v != "- - - / u" {
		t.Errorf("h:a.test = %q, want the bad rule left out", v)
	}
	if len(cfg.Problems) != 1 || cfg.Problems[0].Reason != model.ReasonInvalidRule || cfg.Problems[0].Object != "ns/bad" {
		t.Errorf("problems = %v, want one InvalidRule for ns/bad", cfg.Problems)
	}
}

func TestValidateOrigin(t *testing.T) {
	for o, ok := range map[string]bool{
		"*": true, "https://www.foo.com": true, "https://*.bar.com": true, "http://x.test:8443": true, "https://[::1]:443": true,
		"www.foo.com": false, "https://": false, "https://a.*.com": false, "https://a b": false, "https://a;b": false, "://x": false,
	} {
		if err := validateOrigin(o); (err == nil) != ok {
			t.Errorf("validateOrigin(%q) = %v, want ok %v", o, err, ok)
		}
	}
}
