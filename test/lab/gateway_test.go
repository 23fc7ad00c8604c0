package lab

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"net/netip"

	"github.com/portico-edge/portico/test/netlab"
	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

// gatewayVIP is the lab Gateway's own address: one the lab's VIPPool lets
// the applications' namespace have.
var gatewayVIP = netip.MustParseAddr("192.0.2.100")

// gatewayYAML is a GatewayClass of the lab's group, a Gateway of the
// applications' namespace on gatewayVIP and an HTTPRoute of it, ws.gw.lab/ws
// to Service backend.
func gatewayYAML(backend string) string {
	return `
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: portico-lab}
spec:
  controllerName: portico.io/gateway-controller
  parametersRef: {group: "", kind: Service, name: ` + GroupName + `, namespace: ` + GroupNamespace + `}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: ` + AppNamespace + `}
spec:
  gatewayClassName: portico-lab
  addresses: [{type: IPAddress, value: "` + gatewayVIP.String() + `"}]
  listeners:
  - {name: http, protocol: HTTP, port: 80}
---
` + gatewayRoute("ws", "ws.gw.lab", "/ws", backend)
}

// gatewayRoute is an HTTPRoute of the lab's Gateway: host's path to backend.
func gatewayRoute(name, host, path, backend string) string {
	return `apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: ` + name + `, namespace: ` + AppNamespace + `}
spec:
  parentRefs: [{name: gw}]
  hostnames: ["` + host + `"]
  rules:
  - matches: [{path: {type: PathPrefix, value: ` + path + `}}]
    backendRefs: [{name: ` + backend + `, port: 80}]
`
}

// TestGatewayRouteChangesAndDeath: a Gateway with an address of its own is
// served by every edge on that address alone; upgraded connections held
// through it (some idle) survive ten route changes of the Gateway with the
// VIP owner killed after the fifth, and the move of their own route to
// another Service: every one held by a surviving edge answers, from its pod.
// Each change's time from the API write to the first answer through each
// live edge is measured (issue 25's route-change-to-every-edge latency).
func TestGatewayRouteChangesAndDeath(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces, XDP, VRRP")
	l := startLabWith(t, Options{Portico: porticoBin, Pods: 3, GatewayAPI: true})
	ctx := context.Background()
	podsA, podsB := l.Pods[:2], l.Pods[2:]
	for name, pods := range map[string][]*Node{"gw-a": podsA, "gw-b": podsB} {
		if err := l.Backend(ctx, name, pods...); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.ApplyYAML(ctx, "the lab's Gateway", []byte(gatewayYAML("gw-a"))); err != nil {
		t.Fatal(err)
	}
	// The client reaches the Gateway's address on-link, as the group's VIP.
	if err := netlab.IP("-n", l.Client.NS, "route", "replace", gatewayVIP.String()+"/32", "dev", "eth0"); err != nil {
		t.Fatal(err)
	}
	groupVIP := l.Target.VIP
	l.Target.VIP = gatewayVIP // the helpers' traffic goes to the Gateway
	t.Cleanup(func() { l.Target.VIP = groupVIP })
	upgradesTo := func(edges []*Node, want []*Node) func([]traffic.Reply) error {
		return func(reps []traffic.Reply) error {
			seen := map[string]bool{}
			for _, r := range reps {
				seen[r.Edge] = true
				if !slices.Contains(names(want), r.Pod) {
					return fmt.Errorf("an answer came from %s, want only %v", r.Pod, names(want))
				}
			}
			for _, e := range edges {
				if !seen[e.Addr.Addr().String()] {
					return fmt.Errorf("no answer through %s in %d", e.Name, len(reps))
				}
			}
			return nil
		}
	}
	if err := l.waitUpgrades(ctx, 60*time.Second, "ws.gw.lab", "/ws", upgradesTo(l.Edges, podsA)); err != nil {
		t.Fatalf("ws.gw.lab/ws through the Gateway's address to %v: %v", names(podsA), err)
	}
	// The group's own VIP does not serve the Gateway's host.
	own := traffic.Target{NS: l.Client.NS, VIP: groupVIP}
	if r, err := own.Get(ctx, own.HTTPClient(false, 2*time.Second), "ws.gw.lab", "/ws"); err == nil {
		t.Errorf("the group's VIP %s answered the Gateway's host: %+v", groupVIP, r)
	}

	held, err := l.holdUpgraded(ctx, "ws.gw.lab", "/ws", 18, 6)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(held.close)
	t.Logf("held: 18 upgraded connections through the Gateway (6 idle), per edge %v", held.spread(heldWS))
	stopWatch := held.watch(4 * time.Minute)
	defer stopWatch()

	victim, err := l.Owner()
	if err != nil {
		t.Fatal(err)
	}
	live := slices.DeleteFunc(slices.Clone(l.Edges), func(e *Node) bool { return e == victim })
	var lat []time.Duration
	var killed time.Time
	for i := range 10 {
		edges := l.Edges
		if i == 5 {
			killed = time.Now()
			if err := l.KillEdge(victim); err != nil {
				t.Fatal(err)
			}
			t.Logf("killed the VIP owner %s", victim.Name)
		}
		if i >= 5 {
			edges = live
		}
		host := fmt.Sprintf("r-%d.gw.lab", i)
		ds, err := l.gatewayChangeToServed(ctx, fmt.Sprintf("r-%d", i), host, edges)
		if err != nil {
			t.Fatalf("change %d: %v", i+1, err)
		}
		lat = append(lat, ds...)
	}
	slices.Sort(lat)
	q := func(p int) time.Duration { return lat[(len(lat)-1)*p/100].Round(time.Millisecond) }
	t.Logf("HTTPRoute change to served through the Gateway's address, %d measurements (10 changes x live edges, the VIP owner killed before the sixth): p50 %v  p95 %v  max %v",
		len(lat), q(50), q(95), q(100))

	// The held connections' own route moves to gw-b: new upgrades reach its
	// pods, the held ones stay with theirs.
	moved := time.Now()
	if err := l.ServerSideApply(ctx, "the ws route, to gw-b", []byte(gatewayRoute("ws", "ws.gw.lab", "/ws", "gw-b"))); err != nil {
		t.Fatal(err)
	}
	if err := l.waitUpgrades(ctx, 30*time.Second, "ws.gw.lab", "/ws", upgradesTo(live, podsB)); err != nil {
		t.Fatalf("after the route moved, new upgrades did not all reach %v: %v", names(podsB), err)
	}
	t.Logf("new upgrades reached %v through every live edge %v after the route moved", names(podsB), time.Since(moved).Round(time.Millisecond))
	stopWatch()
	held.check(true)
	survivors, kept := 0, 0
	for _, h := range held {
		if h.edge == victim.Addr.Addr().String() {
			continue
		}
		survivors++
		if h.err == nil {
			kept++
		}
	}
	t.Logf("held connections on surviving edges: %d of %d answer from their pods (%d were on the killed owner)", kept, survivors, len(held)-survivors)
	if kept != survivors {
		t.Errorf("held connections on surviving edges died: %d of %d kept. Failures:%s", kept, survivors, held.failures(killed, "the owner was killed", 12))
	}
}

// gatewayChangeToServed creates an HTTPRoute for host and returns, for each of
// edges, the time from the API write until that edge first answered it
// through the Gateway's address. New connections, one every 2 ms, for at most
// 10 s.
func (l *Lab) gatewayChangeToServed(ctx context.Context, name, host string, edges []*Node) ([]time.Duration, error) {
	c := l.HTTPClient(false, time.Second)
	start := time.Now()
	if err := l.ApplyYAML(ctx, "route "+name, []byte(gatewayRoute(name, host, "/", "gw-a"))); err != nil {
		return nil, err
	}
	first := map[string]time.Duration{}
	for time.Since(start) < 10*time.Second && len(first) < len(edges) {
		if r, err := l.Get(ctx, c, host, "/"); err == nil && r.Host == host {
			if _, ok := first[r.Edge]; !ok {
				first[r.Edge] = time.Since(start)
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	var out []time.Duration
	for _, e := range edges {
		d, ok := first[e.Addr.Addr().String()]
		if !ok {
			return nil, fmt.Errorf("%s not served through %s after 10 s (answers through %v)", host, e.Name, first)
		}
		out = append(out, d)
	}
	return out, nil
}
