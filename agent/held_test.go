package agent

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/dataplane"
)

// TestParseHeld: a peer's list as /held serves it; what is not a TCP
// connection or UDP flow between two addresses of one family is counted and skipped, and
// the rest is kept.
func TestParseHeld(t *testing.T) {
	holder := netip.MustParseAddr("10.0.0.2")
	in := strings.Join([]string{
		"tcp 198.51.100.7:40000 192.0.2.10:80",
		"tcp [2001:db8::7]:40001 [2001:db8::10]:443",
		"udp 198.51.100.7:40000 192.0.2.10:53",      // a UDP flow
		"sctp 198.51.100.7:40000 192.0.2.10:53",     // neither TCP nor UDP
		"tcp 198.51.100.7:40000 [2001:db8::10]:443", // families differ
		"tcp 198.51.100.7 192.0.2.10:80",            // no port
		"tcp 198.51.100.7:0 192.0.2.10:80",          // port 0
		"garbage",
		"",
		"tcp [::ffff:198.51.100.8]:40002 192.0.2.10:80", // a v4-mapped address is the v4 one
	}, "\n")
	held, malformed, err := parseHeld(strings.NewReader(in), holder)
	if err != nil {
		t.Fatal(err)
	}
	flowOf := func(proto uint8, src, dst string) dataplane.Held {
		s, d := netip.MustParseAddrPort(src), netip.MustParseAddrPort(dst)
		return dataplane.Held{Holder: holder, Flow: dataplane.Flow{Src: s.Addr(), Dst: d.Addr(), SPort: s.Port(), DPort: d.Port(), Protocol: proto}}
	}
	flow := func(src, dst string) dataplane.Held { return flowOf(6, src, dst) }
	want := []dataplane.Held{
		flow("198.51.100.7:40000", "192.0.2.10:80"),
		flow("[2001:db8::7]:40001", "[2001:db8::10]:443"),
		flowOf(17, "198.51.100.7:40000", "192.0.2.10:53"),
		flow("198.51.100.8:40002", "192.0.2.10:80"),
	}
	if diff := cmp.Diff(want, held, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" || malformed != 5 {
		t.Errorf("parseHeld: %d malformed (want 5), held (-want +got):\n%s", malformed, diff)
	}
}

// TestServeHeld: /held serves what publish made to the group's replicas (and
// loopback) alone, and a fetch that names the list's ETag gets 304 and no body;
// publish's output parses back to its input.
func TestServeHeld(t *testing.T) {
	h := &heldReports{}
	own := []dataplane.Flow{
		{Src: netip.MustParseAddr("198.51.100.7"), Dst: netip.MustParseAddr("192.0.2.10"), SPort: 40000, DPort: 80, Protocol: 6},
		{Src: netip.MustParseAddr("2001:db8::7"), Dst: netip.MustParseAddr("2001:db8::10"), SPort: 40001, DPort: 443, Protocol: 6},
	}
	replica := netip.MustParseAddr("10.0.0.2")
	h.publish(own, []netip.Addr{replica}, true)
	get := func(from string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, heldPath, nil)
		r.RemoteAddr = from
		return r
	}
	for _, from := range []string{"192.0.2.1:1234", "10.0.0.3:1234", "garbage"} {
		rec := httptest.NewRecorder()
		h.serveHTTP(rec, get(from))
		if rec.Code != http.StatusForbidden {
			t.Errorf("GET /held from %s: %d, want 403", from, rec.Code)
		}
	}
	rec := httptest.NewRecorder()
	h.serveHTTP(rec, get("[::1]:1234"))
	if rec.Code != http.StatusOK {
		t.Errorf("GET /held from loopback: %d", rec.Code)
	}
	rec = httptest.NewRecorder()
	h.serveHTTP(rec, get("10.0.0.2:1234"))
	etag := rec.Header().Get("ETag")
	if rec.Code != http.StatusOK || etag == "" {
		t.Fatalf("GET /held: %d, ETag %q", rec.Code, etag)
	}
	holder := netip.MustParseAddr("10.0.0.1")
	held, malformed, err := parseHeld(rec.Body, holder)
	if err != nil || malformed != 0 || len(held) != 2 || held[0].Flow != own[0] || held[1].Flow != own[1] {
		t.Errorf("served list parses to %v (%d malformed, %v), want %v", held, malformed, err, own)
	}
	req := get("10.0.0.2:1234")
	req.Header.Set("If-None-Match", etag)
	rec = httptest.NewRecorder()
	h.serveHTTP(rec, req)
	if rec.Code != http.StatusNotModified || rec.Body.Len() != 0 {
		t.Errorf("GET /held with its ETag: %d, %d bytes; want 304 and none", rec.Code, rec.Body.Len())
	}
	// A list that failed leaves the last one served.
	h.publish(nil, []netip.Addr{replica}, false)
	rec = httptest.NewRecorder()
	h.serveHTTP(rec, req)
	if rec.Code != http.StatusNotModified || h.listed() != 2 {
		t.Errorf("GET /held after a failed list: %d, %d listed; want 304 and the last list's 2", rec.Code, h.listed())
	}
	h.publish(own[:1], []netip.Addr{replica}, true)
	rec = httptest.NewRecorder()
	h.serveHTTP(rec, req)
	if rec.Code != http.StatusOK || rec.Header().Get("ETag") == etag {
		t.Errorf("GET /held with the old ETag after a change: %d, ETag %q", rec.Code, rec.Header().Get("ETag"))
	}
}

// TestHeldEvery: the reports come well inside a transition, at most every 5 s
// and at least every 250 ms.
func TestHeldEvery(t *testing.T) {
	for _, tc := range []struct{ transition, want time.Duration }{
		{0, 5 * time.Second}, // the default transition, 2 min
		{2 * time.Minute, 5 * time.Second},
		{20 * time.Second, 2500 * time.Millisecond},
		{3 * time.Second, 375 * time.Millisecond},
		{time.Second, 250 * time.Millisecond},
	} {
		if got := heldEvery(tc.transition); got != tc.want {
			t.Errorf("heldEvery(%v) = %v, want %v", tc.transition, got, tc.want)
		}
	}
}

// TestHeldBound: the lists together are trimmed to the budget, holders in
// address order, and the trim is counted; lists within it are left as they are.
func TestHeldBound(t *testing.T) {
	h := &heldReports{budget: 5, met: newHeldMetrics()}
	list := func(holder string, n int) *peerHeld {
		p := &peerHeld{etag: holder}
		for i := range n {
			p.held = append(p.held, dataplane.Held{Holder: netip.MustParseAddr(holder),
				Flow: dataplane.Flow{Src: netip.MustParseAddr("198.51.100.7"), Dst: netip.MustParseAddr("192.0.2.10"), SPort: uint16(1000 + i), DPort: 80, Protocol: 6}})
		}
		return p
	}
	a, b, c := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")
	lists := map[netip.Addr]*peerHeld{c: list("10.0.0.3", 2), a: list("10.0.0.1", 2), b: list("10.0.0.2", 3)}
	keep := lists[a]
	h.bound(lists)
	if lists[a] != keep || len(lists[b].held) != 3 || len(lists[c].held) != 0 {
		t.Errorf("bound to 5: %d, %d, %d connections (a kept as it was: %v); want 2, 3, 0", len(lists[a].held), len(lists[b].held), len(lists[c].held), lists[a] == keep)
	}
	if got := testutil.ToFloat64(h.met.errors.WithLabelValues("truncated")); got != 1 {
		t.Errorf("portico_held_errors_total{reason=truncated} = %v, want 1", got)
	}
	// UDP flows go first, whoever holds them: a spoofed source makes them.
	udp := list("10.0.0.1", 3)
	for i := range udp.held {
		udp.held[i].Flow.Protocol = 17
	}
	lists = map[netip.Addr]*peerHeld{a: udp, b: list("10.0.0.2", 3), c: list("10.0.0.3", 1)}
	h.bound(lists)
	if len(lists[a].held) != 1 || len(lists[b].held) != 3 || len(lists[c].held) != 1 {
		t.Errorf("bound to 5 with a's 3 UDP flows: %d, %d, %d listed, want 1 (UDP), 3, 1 (TCP)", len(lists[a].held), len(lists[b].held), len(lists[c].held))
	}
}

// TestUDPIdle: a group's UDP flows are listed while they may still be in an
// nginx session: the longest idle timeout of its L4 Services' UDP ports.
func TestUDPIdle(t *testing.T) {
	snap := model.Snapshot{Services: []model.Service{
		{Name: "a/tcp", Group: "edge/web", Ports: []model.ServicePort{{Protocol: model.TCP, Port: 5432}}, UDPIdleTimeout: 3600},
		{Name: "a/dns", Group: "edge/web", Ports: []model.ServicePort{{Protocol: model.UDP, Port: 53}}},
		{Name: "a/game", Group: "edge/web", Ports: []model.ServicePort{{Protocol: model.UDP, Port: 7777}}, UDPIdleTimeout: 120},
		{Name: "b/game", Group: "edge/other", Ports: []model.ServicePort{{Protocol: model.UDP, Port: 7777}}, UDPIdleTimeout: 900},
	}}
	if got := udpIdle(snap, "edge/web"); got != 2*time.Minute {
		t.Errorf("edge/web: %v, want 2m (a/game's; a/tcp has no UDP port)", got)
	}
	snap.Services = snap.Services[:2]
	if got := udpIdle(snap, "edge/web"); got != model.DefaultUDPIdleTimeout*time.Second {
		t.Errorf("edge/web with a/dns alone: %v, want the default %ds", got, model.DefaultUDPIdleTimeout)
	}
	if got := udpIdle(snap, "edge/none"); got != 0 {
		t.Errorf("a group without UDP: %v, want 0", got)
	}
}
