package lab

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

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
