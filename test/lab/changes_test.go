package lab

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/portico-edge/portico/test/traffic"
)

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
