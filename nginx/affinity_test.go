package nginx

import (
	"context"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/portico-edge/portico/controlplane/model"
)

// affinitySnapshot serves s.test: "/" with cookie affinity ("sess"), "/plain"
// without, both on the upstream t-s-80 with endpoints eps.
func affinitySnapshot(eps ...netip.AddrPort) model.Snapshot {
	return model.Snapshot{
		Servers: []model.Server{{Host: "s.test", Locations: []model.Location{
			{Path: "/", Type: model.PathPrefix, Upstream: "t-s-80", Source: "t/sticky", Affinity: model.CookieAffinity{Cookie: "sess", MaxAge: 600}},
			{Path: "/plain", Type: model.PathPrefix, Upstream: "t-s-80", Source: "t/plain"},
		}}},
		Upstreams: []model.Upstream{{Name: "t-s-80", Endpoints: eps}},
	}
}

// stickyGet requests url with the cookie sess=cookie ("" for none) on a new
// connection, and returns the backend that answered and the sess cookie the
// response set ("" for none).
func stickyGet(t *testing.T, c *http.Client, url, cookie string) (backend, set string) {
	t.Helper()
	var hdr []string
	if cookie != "" {
		hdr = []string{"Cookie", "theme=dark; sess=" + cookie + "; x=1"}
	}
	resp, body := get(t, c, url, hdr...)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %d %q", url, resp.StatusCode, body)
	}
	for _, h := range resp.Header.Values("Set-Cookie") {
		if v, ok := strings.CutPrefix(h, "sess="); ok {
			if !strings.HasSuffix(v, "; Path=/; HttpOnly; Max-Age=600") {
				t.Errorf("Set-Cookie %q, want Path=/, HttpOnly and Max-Age=600", h)
			}
			set, _, _ = strings.Cut(v, ";")
		}
	}
	return strings.Fields(body)[0], set
}

// TestServeCookieAffinity: clients with the affinity cookie stay on their
// endpoint, request after request on new connections; an endpoint change that
// nginx takes without a reload moves only the clients whose endpoint left, once;
// a location without affinity still spreads and sets no cookie.
func TestServeCookieAffinity(t *testing.T) {
	_, epA := backend(t, "A")
	_, epB := backend(t, "B")
	_, epC := backend(t, "C")
	_, epD := backend(t, "D")
	n := startNginx(t, affinitySnapshot(epA, epB, epC))
	c := n.client(false)

	plain := map[string]int{}
	for range 12 {
		b, set := stickyGet(t, c, "http://s.test/plain", "")
		plain[b]++
		if set != "" {
			t.Fatalf("/plain, without affinity, set the cookie %q", set)
		}
	}
	if len(plain) != 3 {
		t.Errorf("/plain reached %v, want all three endpoints", plain)
	}

	type client struct{ cookie, backend string }
	clients := make([]client, 15)
	per := map[string]int{}
	for i := range clients {
		b, set := stickyGet(t, c, "http://s.test/", "")
		if set == "" {
			t.Fatalf("client %d: the first answer (from %s) set no cookie", i, b)
		}
		clients[i] = client{set, b}
		per[b]++
	}
	t.Logf("15 clients' first requests: per endpoint %v", per)
	if per["C"] == 0 || per["A"]+per["B"] == 0 {
		t.Fatalf("clients landed on %v: the test needs some on C, which leaves, and some on A or B, which stay", per)
	}
	for i, cl := range clients {
		for range 4 {
			b, set := stickyGet(t, c, "http://s.test/x", cl.cookie)
			if b != cl.backend || set != "" {
				t.Fatalf("client %d (cookie %s, on %s) reached %s, set %q", i, cl.cookie, cl.backend, b, set)
			}
		}
	}

	workers := workerPIDs(t, n)
	res, err := n.r.ApplyNow(context.Background(), affinitySnapshot(epA, epB, epD))
	if err != nil || res.Result != ResultTable {
		t.Fatalf("endpoint change: %s, %v; want %s (no reload)", res.Result, err, ResultTable)
	}
	kept, moved := 0, 0
	for i, cl := range clients {
		b, set := stickyGet(t, c, "http://s.test/", cl.cookie)
		switch {
		case cl.backend != "C" && (b != cl.backend || set != ""):
			t.Errorf("client %d on %s, which stayed, reached %s (set %q)", i, cl.backend, b, set)
		case cl.backend != "C":
			kept++
		case set == "" || b == "C":
			t.Errorf("client %d on C, which left, reached %s and got cookie %q, want a new endpoint and its cookie", i, b, set)
		default:
			moved++
			for range 3 {
				if again, set2 := stickyGet(t, c, "http://s.test/", set); again != b || set2 != "" {
					t.Errorf("client %d, moved to %s, then reached %s (set %q)", i, b, again, set2)
				}
			}
		}
	}
	t.Logf("after C was replaced by D: %d clients kept their endpoint, %d moved once and stuck", kept, moved)
	if got := workerPIDs(t, n); !slices.Equal(got, workers) {
		t.Errorf("workers %v, want still %v: the endpoint change reloaded nginx", got, workers)
	}
}
