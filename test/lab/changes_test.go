package lab

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/test/testcert"
	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

// The kinds of held connections.
const (
	heldL4   = "L4"
	heldWS   = "WebSocket"
	heldFeed = "streaming"
)

// oldShutdownTimeout is how long nginx's old workers used to keep what they held
// after a reload (worker_shutdown_timeout 60s) before they closed it: the tests
// hold their connections longer than that past the first reload.
const oldShutdownTimeout = 60 * time.Second

// heldConn is one connection a test holds through a VIP while the
// configuration changes.
type heldConn struct {
	kind string
	// idle connections say nothing between their first and their last check
	// (a held upgraded one still gets the backend's heartbeats).
	idle      bool
	edge, pod string // where the first exchange went
	check     func() error
	close     func()
	// failed is when a check first failed, and err why; a failed connection
	// is not asked again.
	failed time.Time
	err    error
}

func (h *heldConn) String() string {
	s := fmt.Sprintf("%s via %s to %s", h.kind, h.edge, h.pod)
	if h.idle {
		s += " (idle)"
	}
	return s
}

type heldConns []*heldConn

// holdL4 opens n connections to an L4 Service's addr, of which the last idle
// are idle; each exchange must reach the first one's pod through its edge.
func (l *Lab) holdL4(ctx context.Context, addr string, n, idle int) (heldConns, error) {
	var hs heldConns
	for i := range n {
		c, r, first, err := l.tcpLine(ctx, addr)
		if err != nil {
			hs.close()
			return nil, fmt.Errorf("hold %s: %w", addr, err)
		}
		hs = append(hs, &heldConn{kind: heldL4, idle: i >= n-idle, edge: first.Peer, pod: first.Pod,
			check: func() error {
				rep, err := lineOn(c, r)
				if err == nil && (rep.Pod != first.Pod || rep.Peer != first.Peer) {
					err = fmt.Errorf("answered by %s via %s", rep.Pod, rep.Peer)
				}
				return err
			},
			close: func() { c.Close() }})
	}
	return hs, nil
}

// holdUpgraded opens n upgraded connections to host+path, of which the last
// idle are idle; each exchange must reach the first one's pod through its edge.
func (l *Lab) holdUpgraded(ctx context.Context, host, path string, n, idle int) (heldConns, error) {
	var hs heldConns
	for i := range n {
		u, err := l.OpenUpgraded(ctx, host, path, 3*time.Second)
		if err != nil {
			hs.close()
			return nil, err
		}
		hs = append(hs, &heldConn{kind: heldWS, idle: i >= n-idle, edge: u.First.Edge, pod: u.First.Pod,
			check: func() error {
				r, err := u.Exchange(3 * time.Second)
				if err == nil && (r.Pod != u.First.Pod || r.Edge != u.First.Edge) {
					err = fmt.Errorf("answered by %s via %s", r.Pod, r.Edge)
				}
				return err
			},
			close: func() { u.Close() }})
	}
	return hs, nil
}

// holdFeeds opens n streaming responses from host; each must have delivered a
// line within the last 3 s (they come every 500 ms) whenever it is checked.
func (l *Lab) holdFeeds(ctx context.Context, host string, n int) (heldConns, error) {
	var hs heldConns
	for range n {
		f, err := l.OpenFeed(ctx, host, "/feed", 3*time.Second)
		if err != nil {
			hs.close()
			return nil, err
		}
		hs = append(hs, &heldConn{kind: heldFeed, edge: f.First.Edge, pod: f.First.Pod,
			check: func() error { return f.Check(3 * time.Second) },
			close: func() { f.Close() }})
	}
	return hs, nil
}

func (hs heldConns) close() {
	for _, h := range hs {
		h.close()
	}
}

// check checks, at once, every connection that has not failed: the idle ones
// too when all.
func (hs heldConns) check(all bool) {
	var wg sync.WaitGroup
	for _, h := range hs {
		if h.err != nil || (h.idle && !all) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := h.check(); err != nil {
				h.failed, h.err = time.Now(), err
			}
		}()
	}
	wg.Wait()
}

// watch checks the active connections every 5 s, for at most d, until the
// returned stop, which waits for a check in progress.
func (hs heldConns) watch(d time.Duration) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(5 * time.Second)
		defer tick.Stop()
		end := time.After(d)
		for {
			select {
			case <-quit:
				return
			case <-end:
				return
			case <-tick.C:
			}
			hs.check(false)
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(quit) })
		<-done
	}
}

// kept counts the connections of kind that have not failed, of how many.
func (hs heldConns) kept(kind string) (kept, of int) {
	for _, h := range hs {
		if h.kind == kind {
			of++
			if h.err == nil {
				kept++
			}
		}
	}
	return kept, of
}

// spread counts the connections of kind per edge.
func (hs heldConns) spread(kind string) map[string]int {
	out := map[string]int{}
	for _, h := range hs {
		if h.kind == kind {
			out[h.edge]++
		}
	}
	return out
}

// failures describes the failed connections (at most max, earliest first),
// each with when its failure was seen after since, which event names.
func (hs heldConns) failures(since time.Time, event string, max int) string {
	var failed heldConns
	for _, h := range hs {
		if h.err != nil {
			failed = append(failed, h)
		}
	}
	slices.SortStableFunc(failed, func(a, b *heldConn) int { return a.failed.Compare(b.failed) })
	var b strings.Builder
	for i, h := range failed {
		if i == max {
			fmt.Fprintf(&b, "\n  ... and %d more", len(failed)-max)
			break
		}
		fmt.Fprintf(&b, "\n  %s: failed, seen %v after %s: %v", h, h.failed.Sub(since).Round(100*time.Millisecond), event, h.err)
	}
	return b.String()
}

// waitL4 waits up to d until 30 new connections in a row to addr are answered
// and their answers pass check.
func (l *Lab) waitL4(ctx context.Context, d time.Duration, addr string, check func([]traffic.Reply) error) error {
	_, err := testenv.Poll(ctx, d, 100*time.Millisecond, func() error {
		var reps []traffic.Reply
		for range 30 {
			c, _, rep, err := l.tcpLine(ctx, addr)
			if err != nil {
				return err
			}
			c.Close()
			reps = append(reps, rep)
		}
		return check(reps)
	})
	return err
}

// waitUpgrades waits up to d until 30 new upgraded connections in a row to
// host+path are answered and their first answers pass check.
func (l *Lab) waitUpgrades(ctx context.Context, d time.Duration, host, path string, check func([]traffic.Reply) error) error {
	_, err := testenv.Poll(ctx, d, 100*time.Millisecond, func() error {
		var reps []traffic.Reply
		for range 30 {
			u, err := l.OpenUpgraded(ctx, host, path, 2*time.Second)
			if err != nil {
				return err
			}
			u.Close()
			reps = append(reps, u.First)
		}
		return check(reps)
	})
	return err
}

// reached checks that answers came through every edge and only from pods.
func (l *Lab) reached(edges, pods []string, want ...*Node) error {
	if seen := slices.Compact(slices.Sorted(slices.Values(edges))); len(seen) != len(l.Edges) {
		return fmt.Errorf("answers came through %v, want every edge", seen)
	}
	for _, p := range pods {
		if !slices.Contains(names(want), p) {
			return fmt.Errorf("an answer came from %s, want only %v", p, names(want))
		}
	}
	return nil
}

// reloads reads every edge's count of successful nginx reloads and the time of
// the last one.
func (l *Lab) reloads(t *testing.T) (counts []int, last time.Time) {
	t.Helper()
	for i := range l.Edges {
		n, err := l.Metric(i, `portico_nginx_reloads_total{result="success"}`)
		if err != nil {
			t.Fatal(err)
		}
		at, err := l.Metric(i, "portico_nginx_last_reload_success_timestamp_seconds")
		if err != nil {
			t.Fatal(err)
		}
		counts = append(counts, int(n))
		if ts := time.Unix(0, int64(at*1e9)); ts.After(last) {
			last = ts
		}
	}
	return counts, last
}

// vrrpTransitions reads how often each edge's VRRP routers made the transitions
// that match labels (`to="master"`).
func (l *Lab) vrrpTransitions(t *testing.T, labels string) []float64 {
	t.Helper()
	var out []float64
	for i := range l.Edges {
		n, err := l.MetricSum(i, "portico_vrrp_transitions_total", labels)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, n)
	}
	return out
}

// vrrpRestarts reads how often each edge's VRRP routers stopped or started
// (transitions to and from init): what rebuilding the announcer does, which
// makes the master give the VIPs up at once (priority 0).
func (l *Lab) vrrpRestarts(t *testing.T) []float64 {
	t.Helper()
	out := l.vrrpTransitions(t, `to="init"`)
	for i, n := range l.vrrpTransitions(t, `from="init"`) {
		out[i] += n
	}
	return out
}

// settledReloads returns every edge's count of nginx reloads once it stays the
// same for longer than a reload's debounce window (the L4 Service a test just
// made reloads each edge once, a moment after the edge took it).
func (l *Lab) settledReloads(t *testing.T) []int {
	t.Helper()
	last, _ := l.reloads(t)
	for range 20 {
		time.Sleep(time.Second)
		now, _ := l.reloads(t)
		if slices.Equal(now, last) {
			return now
		}
		last = now
	}
	t.Fatalf("nginx reloads per edge still changing after 20 s: %v", last)
	return nil
}

// holdPast keeps the connections, checking the active ones every 5 s, until
// oldShutdownTimeout and 5 s more have passed since since (and at least until
// now); then it checks every one.
func (l *Lab) holdPast(held heldConns, since time.Time) {
	stop := held.watch(2 * oldShutdownTimeout)
	defer stop()
	time.Sleep(time.Until(since.Add(oldShutdownTimeout + 5*time.Second)))
	stop()
	held.check(true)
}

// TestConfigChangesKeepConnections: with 20 L4 TCP connections, 20 upgraded
// (WebSocket-style) connections and 20 streaming responses held through the
// VIPs, half of the L4 and upgraded ones idle, 100 unrelated changes in 3
// minutes (Ingresses created, extended and deleted; TLS Secrets of new
// Ingresses created and rotated; backend Services and EndpointSlices of other
// Ingresses created and changed; new L4 Services on new VIPs) are each served
// through the VIP within 10 s, and every held connection still works: the active
// ones at every check on the way, the idle ones at the end. The new UDP L4
// Services reload nginx (the TCP ones are routes to its steered listeners): the
// held connections stay in workers a reload replaced, more than
// oldShutdownTimeout past the first reload.
func TestConfigChangesKeepConnections(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	l.serveL4(t)
	holdAddr := netip.AddrPortFrom(netip.MustParseAddr("192.0.2.90"), 7000)
	if err := l.l4Service(ctx, "hold", holdAddr.Addr(), corev1.ProtocolTCP, int32(holdAddr.Port()), l4TCPPort); err != nil {
		t.Fatal(err)
	}
	if err := l.Ingress(ctx, "hold", "hold.lab", "echo"); err != nil {
		t.Fatal(err)
	}
	if err := l.waitL4(ctx, 30*time.Second, holdAddr.String(), func(reps []traffic.Reply) error {
		var edges, pods []string
		for _, r := range reps {
			edges, pods = append(edges, r.Peer), append(pods, r.Pod)
		}
		return l.reached(edges, pods, l.Pods...)
	}); err != nil {
		t.Fatalf("L4 Service hold: %v", err)
	}
	if err := l.waitUpgrades(ctx, 30*time.Second, "hold.lab", "/ws", func(reps []traffic.Reply) error {
		var edges, pods []string
		for _, r := range reps {
			edges, pods = append(edges, r.Edge), append(pods, r.Pod)
		}
		return l.reached(edges, pods, l.Pods...)
	}); err != nil {
		t.Fatalf("upgrades of hold.lab: %v", err)
	}

	var held heldConns
	t.Cleanup(func() { held.close() })
	for _, open := range []func() (heldConns, error){
		func() (heldConns, error) { return l.holdL4(ctx, holdAddr.String(), 20, 10) },
		func() (heldConns, error) { return l.holdUpgraded(ctx, "hold.lab", "/ws", 20, 10) },
		func() (heldConns, error) { return l.holdFeeds(ctx, "hold.lab", 20) },
	} {
		hs, err := open()
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, hs...)
	}
	for _, k := range []string{heldL4, heldWS, heldFeed} {
		t.Logf("20 %s connections held, per edge %v", k, held.spread(k))
	}

	reloads0, _ := l.reloads(t)
	masters0, restarts0 := l.vrrpTransitions(t, `to="master"`), l.vrrpRestarts(t)
	stopWatch := held.watch(6 * time.Minute)
	defer stopWatch()
	cs := &changeSet{l: l}
	results := cs.run(ctx, t, 100, 1800*time.Millisecond)
	first, lastWrite := results[0].written, results[len(results)-1].written
	reloads1, _ := l.reloads(t)
	stopWatch()
	t.Logf("100 changes from %s to %s; nginx reloads per edge meanwhile: %v",
		first.Format("15:04:05.000"), lastWrite.Format("15:04:05.000"), diff(reloads1, reloads0))
	firstReload := lastWrite
	for _, r := range results {
		if r.kind == "l4-udp" {
			firstReload = r.written
			break
		}
	}
	l.holdPast(held, firstReload)
	for i, n := range diff(reloads1, reloads0) {
		if n == 0 {
			t.Errorf("edge %s did not reload nginx for the new UDP L4 Services: the test shows nothing about reloads", l.Edges[i].Name)
		}
	}
	// A new L4 Service adds a VIP to the group: the VRRP routers take it in
	// place. No router stops or starts for it: a rebuilt announcer gave every
	// VIP up at once (priority 0) and moved the owner at each new L4 Service.
	// (An owner can still move on a loaded machine, a backup missing three
	// 100 ms adverts: that is VRRP's timing, logged, not a change's doing.)
	if restarts1 := l.vrrpRestarts(t); !slices.Equal(restarts0, restarts1) {
		t.Errorf("VRRP routers stopped or started per edge: %v, then %v during the changes: a new VIP restarted the announcer", restarts0, restarts1)
	}
	t.Logf("VRRP transitions to master per edge: %v before the changes, %v after", masters0, l.vrrpTransitions(t, `to="master"`))
	// What the workers those reloads replaced cost while they hold the connections.
	for i, e := range l.Edges {
		n, err1 := l.Metric(i, "portico_nginx_draining_workers")
		b, err2 := l.Metric(i, "portico_nginx_draining_workers_bytes")
		if err := errors.Join(err1, err2); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %v draining nginx workers hold connections, %.1f MiB of private memory", e.Name, n, b/(1<<20))
	}

	// The changes.
	var served []time.Duration
	byKind := map[string][]time.Duration{}
	var unserved []string
	for i, r := range results {
		if r.err != nil {
			unserved = append(unserved, fmt.Sprintf("\n  change %d, %s: %v", i, r.what, r.err))
			continue
		}
		served = append(served, r.served)
		byKind[r.kind] = append(byKind[r.kind], r.served)
	}
	for _, k := range slices.Sorted(maps.Keys(byKind)) {
		ds := byKind[k]
		t.Logf("%-13s %3d served: p50 %v, max %v", k, len(ds), pct(ds, 50), pct(ds, 100))
	}
	summary := fmt.Sprintf("%d of %d changes served, change-to-served p50 %v, p95 %v, max %v",
		len(served), len(results), pct(served, 50), pct(served, 95), pct(served, 100))

	// The held connections.
	kl4, nl4 := held.kept(heldL4)
	kws, nws := held.kept(heldWS)
	kfd, nfd := held.kept(heldFeed)
	report := fmt.Sprintf("L4 %d/%d, WebSocket %d/%d, streaming %d/%d survived; %s", kl4, nl4, kws, nws, kfd, nfd, summary)
	t.Log(report)
	if kl4+kws+kfd != len(held) {
		t.Errorf("held connections died: %s. nginx reloaded %v times per edge during the changes (for the new L4 Services). Failures:%s",
			report, diff(reloads1, reloads0), held.failures(first, "the first change", 15))
	}
	if len(unserved) > 0 {
		t.Errorf("%d of %d changes not served within 10 s:%s", len(unserved), len(results), strings.Join(unserved, ""))
	}
}

// TestRouteChangeKeepsHeldWebSocket: the path of an Ingress moves from Service
// A to Service B: new upgraded connections reach B's pod through every edge,
// and the upgraded connections held before keep working with their A pods. Held
// L4 connections keep their pods likewise while an endpoint none of them uses
// joins their Service and leaves it again, and a new TCP L4 Service is served
// by every edge. None of it reloads nginx.
func TestRouteChangeKeepsHeldWebSocket(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces, XDP, VRRP")
	l := startLabWith(t, Options{Portico: porticoBin, Pods: 3})
	ctx := context.Background()
	l.serveL4(t)
	podsA, podsB := l.Pods[:2], l.Pods[2:]
	for name, pods := range map[string][]*Node{"ws-a": podsA, "ws-b": podsB} {
		if err := l.Backend(ctx, name, pods...); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.IngressRoutes(ctx, "ws", "ws.lab", "", Route{Path: "/ws", Service: "ws-a"}); err != nil {
		t.Fatal(err)
	}
	l4Addr := netip.AddrPortFrom(netip.MustParseAddr("192.0.2.95"), 7000)
	if err := l.l4Service(ctx, "ws-l4", l4Addr.Addr(), corev1.ProtocolTCP, int32(l4Addr.Port()), l4TCPPort); err != nil {
		t.Fatal(err)
	}
	if err := l.setSlice(ctx, AppNamespace, "ws-l4", podsA...); err != nil {
		t.Fatal(err)
	}
	upgradesTo := func(want []*Node) func([]traffic.Reply) error {
		return func(reps []traffic.Reply) error {
			var edges, pods []string
			for _, r := range reps {
				edges, pods = append(edges, r.Edge), append(pods, r.Pod)
			}
			return l.reached(edges, pods, want...)
		}
	}
	l4To := func(want []*Node) func([]traffic.Reply) error {
		return func(reps []traffic.Reply) error {
			var edges, pods []string
			for _, r := range reps {
				edges, pods = append(edges, r.Peer), append(pods, r.Pod)
			}
			return l.reached(edges, pods, want...)
		}
	}
	if err := l.waitUpgrades(ctx, 30*time.Second, "ws.lab", "/ws", upgradesTo(podsA)); err != nil {
		t.Fatalf("ws.lab/ws to %v: %v", names(podsA), err)
	}
	if err := l.waitL4(ctx, 30*time.Second, l4Addr.String(), l4To(podsA)); err != nil {
		t.Fatalf("L4 Service ws-l4 to %v: %v", names(podsA), err)
	}

	var held heldConns
	t.Cleanup(func() { held.close() })
	for _, open := range []func() (heldConns, error){
		func() (heldConns, error) { return l.holdUpgraded(ctx, "ws.lab", "/ws", 6, 0) },
		func() (heldConns, error) { return l.holdL4(ctx, l4Addr.String(), 6, 0) },
	} {
		hs, err := open()
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, hs...)
	}
	t.Logf("held: 6 upgraded connections per edge %v, 6 L4 connections per edge %v", held.spread(heldWS), held.spread(heldL4))
	stopWatch := held.watch(4 * time.Minute)
	defer stopWatch()
	reloads0 := l.settledReloads(t)

	// The route moves to B.
	moved := time.Now()
	if err := l.SetRoute(ctx, "ws", Route{Path: "/ws", Service: "ws-b"}); err != nil {
		t.Fatal(err)
	}
	if err := l.waitUpgrades(ctx, 15*time.Second, "ws.lab", "/ws", upgradesTo(podsB)); err != nil {
		t.Fatalf("after the route moved, new upgrades did not all reach %v within 15 s: %v", names(podsB), err)
	}
	t.Logf("30 new upgrades in a row reached %v through every edge %v after the route moved", names(podsB), time.Since(moved).Round(time.Millisecond))

	// An endpoint none of the held L4 connections uses joins their Service
	// and leaves it.
	added := time.Now()
	if err := l.setSlice(ctx, AppNamespace, "ws-l4", l.Pods...); err != nil {
		t.Fatal(err)
	}
	if err := l.waitL4(ctx, 15*time.Second, l4Addr.String(), func(reps []traffic.Reply) error {
		if !slices.ContainsFunc(reps, func(r traffic.Reply) bool { return r.Pod == podsB[0].Name }) {
			return fmt.Errorf("30 new connections, none to %s", podsB[0].Name)
		}
		return nil
	}); err != nil {
		t.Fatalf("%s joined ws-l4: %v", podsB[0].Name, err)
	}
	t.Logf("%s joined ws-l4: new connections reached it %v later", podsB[0].Name, time.Since(added).Round(time.Millisecond))
	removed := time.Now()
	if err := l.setSlice(ctx, AppNamespace, "ws-l4", podsA...); err != nil {
		t.Fatal(err)
	}
	if err := l.waitL4(ctx, 15*time.Second, l4Addr.String(), l4To(podsA)); err != nil {
		t.Fatalf("%s left ws-l4: %v", podsB[0].Name, err)
	}
	t.Logf("%s left ws-l4: 30 new connections in a row avoided it %v later", podsB[0].Name, time.Since(removed).Round(time.Millisecond))

	// A new TCP L4 Service on a VIP of its own: a route to nginx's steered
	// listeners, served by every edge without a reload.
	newL4 := netip.AddrPortFrom(netip.MustParseAddr("192.0.2.96"), 7001)
	created := time.Now()
	if err := l.l4Service(ctx, "ws-l4-new", newL4.Addr(), corev1.ProtocolTCP, int32(newL4.Port()), l4TCPPort); err != nil {
		t.Fatal(err)
	}
	if err := l.waitL4(ctx, 15*time.Second, newL4.String(), l4To(l.Pods)); err != nil {
		t.Fatalf("new L4 Service ws-l4-new: %v", err)
	}
	t.Logf("new TCP L4 Service ws-l4-new on %s: new connections reached every pod through every edge %v after it was created", newL4, time.Since(created).Round(time.Millisecond))

	stopWatch()
	held.check(true)
	if reloads1, _ := l.reloads(t); !slices.Equal(reloads0, reloads1) {
		t.Errorf("nginx reloads per edge went from %v to %v: a route, endpoint or TCP L4 Service change reloaded nginx", reloads0, reloads1)
	}
	kws, nws := held.kept(heldWS)
	kl4, nl4 := held.kept(heldL4)
	t.Logf("%d/%d held upgraded connections still answer from their pods of ws-a, %d/%d held L4 connections from theirs, %v after the route moved",
		kws, nws, kl4, nl4, time.Since(moved).Round(time.Second))
	if kws+kl4 != len(held) {
		t.Errorf("held connections died across the route change and the endpoint changes: WebSocket %d/%d, L4 %d/%d kept. Failures:%s",
			kws, nws, kl4, nl4, held.failures(moved, "the route moved", 12))
	}
}

// changeSet makes TestConfigChangesKeepConnections's changes, each unrelated
// to the held connections, and remembers what they made.
type changeSet struct {
	l     *Lab
	hosts []*changed // Ingresses of one host with a route of /base, and added paths
	tls   []*changed // Ingresses with TLS from a Secret of their own
	svcs  []*changed // Ingresses of a backend Service of their own
	l4    int        // L4 Services made
}

// changed is an object of a changeSet.
type changed struct {
	name, host string
	// touched is the number of the change that last wrote it.
	touched int
	paths   int  // hosts: paths added
	pod     int  // svcs: its endpoint, a pod's index
	alt     bool // svcs: its Service has the port "alt"
}

// change is one configuration change: what it writes, and a probe that
// answers nil once its effect is served through the VIP.
type change struct {
	kind, what string
	write      func(context.Context) error
	probe      func(context.Context) error
}

// changeResult is what became of a change.
type changeResult struct {
	change
	written time.Time
	served  time.Duration // from written to the probe's first success
	err     error         // why it was not served
}

// changePattern is the order of the kinds of change, repeated. A change that
// needs an earlier object that is not settled (see settled) makes a new
// Ingress instead.
var changePattern = []string{
	"ingress", "tls", "service", "path", "ingress", "endpoints", "rotate", "delete", "ingress", "service-port",
	"path", "l4", "ingress", "tls", "service", "path", "ingress", "endpoints", "rotate", "delete",
}

// run makes n changes, one every every, probing each one's effect for up to 10
// s beside the changes that follow. The order and the objects depend only on n.
func (cs *changeSet) run(ctx context.Context, t *testing.T, n int, every time.Duration) []changeResult {
	t.Helper()
	results := make([]changeResult, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(i) * every)))
		c := cs.next(i)
		r := &results[i]
		r.change, r.written = c, time.Now()
		if err := c.write(ctx); err != nil {
			r.err = fmt.Errorf("write: %w", err)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, r.err = testenv.Poll(ctx, 10*time.Second, 100*time.Millisecond, func() error { return c.probe(ctx) })
			r.served = time.Since(r.written)
		}()
	}
	wg.Wait()
	return results
}

// settled picks, of objs, the one written longest ago whose last change's
// probe has ended for sure (6 changes ago, at 1.8 s each, is more than its 10
// s), among those ok accepts.
func settled(objs []*changed, i int, ok func(*changed) bool) *changed {
	var pick *changed
	for _, o := range objs {
		if o.touched <= i-6 && (ok == nil || ok(o)) && (pick == nil || o.touched < pick.touched) {
			pick = o
		}
	}
	return pick
}

// next is change i.
func (cs *changeSet) next(i int) change {
	l := cs.l
	switch kind := changePattern[i%len(changePattern)]; kind {
	case "path":
		if o := settled(cs.hosts, i, nil); o != nil {
			o.touched, o.paths = i, o.paths+1
			path := fmt.Sprintf("/p%d", o.paths)
			return change{kind, fmt.Sprintf("Ingress %s gains %s", o.name, path),
				func(ctx context.Context) error { return l.SetRoute(ctx, o.name, Route{Path: path, Service: "echo"}) },
				func(ctx context.Context) error { return l.answers(ctx, o.host, path, nil) }}
		}
	case "delete":
		if o := settled(cs.hosts, i, nil); o != nil {
			cs.hosts = slices.DeleteFunc(cs.hosts, func(x *changed) bool { return x == o })
			return change{kind, "Ingress " + o.name + " deleted",
				func(ctx context.Context) error {
					return l.Kube.NetworkingV1().Ingresses(AppNamespace).Delete(ctx, o.name, metav1.DeleteOptions{})
				},
				func(ctx context.Context) error { return l.refused(ctx, o.host) }}
		}
	case "tls":
		o := &changed{name: fmt.Sprintf("tls-%d", i), host: fmt.Sprintf("tls-%d.changes.lab", i), touched: i}
		cs.tls = append(cs.tls, o)
		var cert []byte
		return change{kind, "TLS Secret and Ingress " + o.name,
			func(ctx context.Context) error {
				c, key, err := testcert.ECDSA(o.host)
				if err != nil {
					return err
				}
				cert = c
				if err := l.TLSSecret(ctx, o.name, cert, key); err != nil {
					return err
				}
				return l.IngressRoutes(ctx, o.name, o.host, o.name, Route{Path: "/base", Service: "echo"})
			},
			func(ctx context.Context) error { return l.answersTLS(ctx, o.host, cert) }}
	case "rotate":
		if o := settled(cs.tls, i, nil); o != nil {
			o.touched = i
			var cert []byte
			return change{kind, "TLS Secret " + o.name + " rotated",
				func(ctx context.Context) error {
					c, key, err := testcert.ECDSA(o.host)
					if err != nil {
						return err
					}
					cert = c
					return l.updateTLSSecret(ctx, o.name, c, key)
				},
				func(ctx context.Context) error { return l.answersTLS(ctx, o.host, cert) }}
		}
	case "service":
		o := &changed{name: fmt.Sprintf("svc-%d", i), host: fmt.Sprintf("svc-%d.changes.lab", i), touched: i}
		cs.svcs = append(cs.svcs, o)
		return change{kind, "Service, EndpointSlice and Ingress " + o.name,
			func(ctx context.Context) error {
				if err := l.twoPortBackend(ctx, o.name, l.Pods[0]); err != nil {
					return err
				}
				return l.IngressRoutes(ctx, o.name, o.host, "", Route{Path: "/", Service: o.name}, Route{Path: "/alt", Service: o.name, Port: "alt"})
			},
			func(ctx context.Context) error { return l.answers(ctx, o.host, "/", l.Pods[:1]) }}
	case "endpoints":
		if o := settled(cs.svcs, i, nil); o != nil {
			o.touched, o.pod = i, (o.pod+1)%len(l.Pods)
			pod := l.Pods[o.pod]
			return change{kind, fmt.Sprintf("EndpointSlice of %s to %s", o.name, pod.Name),
				func(ctx context.Context) error { return l.setSlice(ctx, AppNamespace, o.name, pod) },
				func(ctx context.Context) error { return l.answers(ctx, o.host, "/", []*Node{pod}) }}
		}
	case "service-port":
		if o := settled(cs.svcs, i, func(o *changed) bool { return !o.alt }); o != nil {
			o.touched, o.alt = i, true
			return change{kind, "Service " + o.name + " gains the port alt",
				func(ctx context.Context) error { return l.addServicePort(ctx, o.name, "alt", 81) },
				func(ctx context.Context) error { return l.answers(ctx, o.host, "/alt", nil) }}
		}
	case "l4":
		cs.l4++
		addr := netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(100 + cs.l4)}), uint16(7100+cs.l4))
		name := fmt.Sprintf("l4-%d", i)
		if cs.l4%2 == 1 {
			// A UDP port is a listening socket of its own: a reload. Its
			// sessions idle out in 1 s, so that the lab's agents, whose
			// graceful stop waits for them, stop in time at the end.
			return change{"l4-udp", fmt.Sprintf("UDP L4 Service %s on %s", name, addr),
				func(ctx context.Context) error {
					return l.l4Service(ctx, name, addr.Addr(), corev1.ProtocolUDP, int32(addr.Port()), l4UDPPort,
						"portico.io/udp-idle-timeout", "1s")
				},
				func(ctx context.Context) error {
					_, err := l.udpQuery(addr.String())
					return err
				}}
		}
		// A TCP port is a route to nginx's steered listeners: no reload.
		return change{"l4-tcp", fmt.Sprintf("TCP L4 Service %s on %s", name, addr),
			func(ctx context.Context) error {
				return l.l4Service(ctx, name, addr.Addr(), corev1.ProtocolTCP, int32(addr.Port()), l4TCPPort)
			},
			func(ctx context.Context) error {
				c, _, _, err := l.tcpLine(ctx, addr.String())
				if err == nil {
					c.Close()
				}
				return err
			}}
	}
	// "ingress", and any change with nothing settled to change.
	o := &changed{name: fmt.Sprintf("host-%d", i), host: fmt.Sprintf("host-%d.changes.lab", i), touched: i}
	cs.hosts = append(cs.hosts, o)
	return change{"ingress", "Ingress " + o.name,
		func(ctx context.Context) error {
			return l.IngressRoutes(ctx, o.name, o.host, "", Route{Path: "/base", Service: "echo"})
		},
		func(ctx context.Context) error { return l.answers(ctx, o.host, "/base", nil) }}
}

// answers gets host+path through the VIP (a new connection): it must be
// answered by that route, and by one of pods unless pods is nil.
func (l *Lab) answers(ctx context.Context, host, path string, pods []*Node) error {
	r, err := l.Get(ctx, l.HTTPClient(false, time.Second), host, path)
	if err != nil {
		return err
	}
	if r.Host != host || r.Path != path {
		return fmt.Errorf("%s%s answered for %s%s", host, path, r.Host, r.Path)
	}
	if pods != nil && !slices.Contains(names(pods), r.Pod) {
		return fmt.Errorf("%s%s answered by %s, want %v", host, path, r.Pod, names(pods))
	}
	return nil
}

// answersTLS gets https://host/base through the VIP, trusting only cert, which
// the server must present.
func (l *Lab) answersTLS(ctx context.Context, host string, cert []byte) error {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(cert) {
		return errors.New("no certificate")
	}
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{DialContext: l.Dial, DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{ServerName: host, RootCAs: pool}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+VIP.String()+"/base", nil)
	if err != nil {
		return err
	}
	req.Host = host
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("https://%s/base: %s", host, resp.Status)
	}
	r, err := traffic.ParseReply(string(body))
	if err == nil && r.Host != host {
		err = fmt.Errorf("https://%s/base answered for %s", host, r.Host)
	}
	return err
}

// refused sends a request for host through the VIP: nginx must close the
// connection without an answer, as it does for a host no Ingress has.
func (l *Lab) refused(ctx context.Context, host string) error {
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	c, err := l.Dial(dctx, "tcp", net.JoinHostPort(VIP.String(), "80"))
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := fmt.Fprintf(c, "GET /base HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host); err != nil {
		return err
	}
	b, err := io.ReadAll(io.LimitReader(c, 512))
	var ne net.Error
	switch {
	case len(b) > 0:
		first, _, _ := strings.Cut(string(b), "\r\n")
		return fmt.Errorf("%s still answered: %s", host, first)
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("%s: no answer, and the connection not closed", host)
	}
	return nil
}

// twoPortBackend creates Service name with the port "http" (80) and its
// EndpointSlice, which has both "http" and "alt" to the pod's BackendPort: the
// port alt is served once the Service has it too (addServicePort).
func (l *Lab) twoPortBackend(ctx context.Context, name string, pod *Node) error {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: AppNamespace, Name: name},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
	if _, err := l.Kube.CoreV1().Services(AppNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create service %s: %w", name, err)
	}
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: AppNamespace, Name: name + "-lab", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr("http"), Port: ptr(int32(BackendPort)), Protocol: ptr(corev1.ProtocolTCP)},
			{Name: ptr("alt"), Port: ptr(int32(BackendPort)), Protocol: ptr(corev1.ProtocolTCP)},
		},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{pod.Addr.Addr().String()}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}}},
	}
	if _, err := l.Kube.DiscoveryV1().EndpointSlices(AppNamespace).Create(ctx, es, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create endpoints of %s: %w", name, err)
	}
	return nil
}

// addServicePort adds a TCP port to Service name.
func (l *Lab) addServicePort(ctx context.Context, name, port string, number int32) error {
	c := l.Kube.CoreV1().Services(AppNamespace)
	svc, err := c.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: port, Port: number, Protocol: corev1.ProtocolTCP})
	_, err = c.Update(ctx, svc, metav1.UpdateOptions{})
	return err
}

// updateTLSSecret replaces the certificate and key of Secret name.
func (l *Lab) updateTLSSecret(ctx context.Context, name string, certPEM, keyPEM []byte) error {
	c := l.Kube.CoreV1().Secrets(AppNamespace)
	sec, err := c.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	sec.Data = map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}
	_, err = c.Update(ctx, sec, metav1.UpdateOptions{})
	return err
}

// pct is the p-th percentile of ds (nearest rank; 100 is the maximum), rounded.
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(ds))
	i := (len(s)*p + 99) / 100
	return s[max(i-1, 0)].Round(time.Millisecond)
}

// diff is a-b, element by element.
func diff(a, b []int) []int {
	out := make([]int, len(a))
	for i := range a {
		out[i] = a[i] - b[i]
	}
	return out
}
