package cluster

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/test/netlab"
	"github.com/portico-edge/portico/test/traffic"
)

// Long-lived connections as the failure tests hold them: HTTP/1.1 keep-alive
// connections to nginx through the group's VIPs (IPv4 and IPv6), and TCP
// connections through an L4 Service's VIPs to the backends (nginx's stream proxy),
// which may stay idle for as long as a database client's would (nginx closes an
// idle HTTP connection after keepalive_timeout, 75 s; the stream proxy's idle
// limit is an hour).

var (
	// GroupVIP6 is the group's IPv6 VIP, beside GroupVIP (on-link in Prefix6).
	GroupVIP6 = netip.MustParseAddr("fd00:251::200")
	// HoldVIP and HoldVIP6 are the VIPs of the hold Service (DeployHold).
	HoldVIP  = netip.MustParseAddr("10.251.0.201")
	HoldVIP6 = netip.MustParseAddr("fd00:251::201")
)

const (
	// HoldPort is the hold Service's port.
	HoldPort = 7000
	// LivenessPort is where every edge's nginx answers the liveness checks (the
	// chart's liveness.port).
	LivenessPort = 10247
)

// holdYAML is an L4 Service of class portico.io/vip served by the chart's group,
// and the operator's VIPPool that lets its namespace have those addresses:
// TCP port HoldPort on HoldVIP and HoldVIP6 to the holdweb pods. (Its own
// backends, on a node that is never drained: a change of an L4 Service's
// endpoints still reloads nginx, which closes idle HTTP connections.)
var holdYAML = fmt.Sprintf(`
apiVersion: portico.io/v1alpha1
kind: VIPPool
metadata: {name: hold}
spec:
  addresses: [%s/32, %s/128]
  autoAssign: false
  serviceAllocation: {namespaces: [default]}
---
apiVersion: v1
kind: Service
metadata:
  name: hold
  namespace: default
  annotations: {portico.io/group: %s/edge, portico.io/vip: "%s,%s"}
spec:
  type: LoadBalancer
  loadBalancerClass: portico.io/vip
  allocateLoadBalancerNodePorts: false
  selector: {app: holdweb}
  ports: [{name: hold, port: %d, targetPort: 8080, protocol: TCP}]
`, HoldVIP, HoldVIP6, PorticoNamespace, HoldVIP, HoldVIP6, HoldPort)

// DeployHold creates the hold Service with one backend on node, and waits until
// both its VIPs answer through every edge of edges.
func (p *Portico) DeployHold(ctx context.Context, node *Node, edges []*Node) error {
	if err := p.C.Apply(ctx, fmt.Sprintf(BackendYAML, "holdweb", 1, node.Name)+"---"+holdYAML); err != nil {
		return err
	}
	for _, vip := range []netip.Addr{HoldVIP, HoldVIP6} {
		t := traffic.Target{NS: p.NS, VIP: vip, Port: HoldPort}
		if err := until(ctx, time.Now().Add(time.Minute), func() error {
			seen := map[string]bool{}
			for range 30 {
				k, err := t.OpenKeepConn(ctx, "hold")
				if err != nil {
					return err
				}
				k.Close()
				seen[k.Edge] = true
			}
			for _, e := range edges {
				if !seen[e.IP.String()] {
					return fmt.Errorf("%s: 30 connections, none through %s", vip, e.Name)
				}
			}
			return nil
		}); err != nil {
			return fmt.Errorf("the hold Service: %w", err)
		}
	}
	return nil
}

// HeldConn is one long-lived connection and where it lives.
type HeldConn struct {
	*traffic.KeepConn
	Kind  string // "http v4", "tcp v6", ...
	Agent string // the agent pod on its edge when it opened
	// Opened is when it was opened: a reload of its edge's nginx after that
	// closes it if it is an idle HTTP connection (issue 22), not the data plane.
	Opened time.Time
	host   string
}

func (h *HeldConn) String() string { return fmt.Sprintf("%s via %s", h.Kind, h.Edge) }

// Held is a set of long-lived connections.
type Held []*HeldConn

// OpenHeld opens n HTTP connections to web.example through the group's VIPs and
// idle TCP connections through the hold Service's, half of each over IPv6, each
// with one request (which tells its edge), and notes each edge's agent pod: the
// one nginx that can have accepted it (none while a rollout replaces it: the
// old pod's nginx serves until it stops, the new one's from its start).
func (p *Portico) OpenHeld(ctx context.Context, http, idle int) (Held, error) {
	byIP, err := p.soleAgents(ctx)
	if err != nil {
		return nil, err
	}
	var held Held
	open := func(kind string, t traffic.Target, host string, n int) error {
		for range n {
			k, err := t.OpenKeepConn(ctx, host)
			if err != nil {
				return fmt.Errorf("%s: %w", kind, err)
			}
			held = append(held, &HeldConn{KeepConn: k, Kind: kind, Agent: byIP[k.Edge], Opened: time.Now(), host: host})
		}
		return nil
	}
	for _, o := range []struct {
		kind string
		t    traffic.Target
		host string
		n    int
	}{
		{"http v4", traffic.Target{NS: p.NS, VIP: GroupVIP}, "web.example", http - http/2},
		{"http v6", traffic.Target{NS: p.NS, VIP: GroupVIP6}, "web.example", http / 2},
		{"tcp v4", traffic.Target{NS: p.NS, VIP: HoldVIP, Port: HoldPort}, "hold", idle - idle/2},
		{"tcp v6", traffic.Target{NS: p.NS, VIP: HoldVIP6, Port: HoldPort}, "hold", idle / 2},
	} {
		if err := open(o.kind, o.t, o.host, o.n); err != nil {
			held.Close()
			return nil, err
		}
	}
	return held, nil
}

// soleAgents maps each node's address to its agent pod, where the node has one
// agent pod, ready and not terminating.
func (p *Portico) soleAgents(ctx context.Context) (map[string]string, error) {
	pods, err := p.C.Kube.CoreV1().Pods(PorticoNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=portico-agent"})
	if err != nil {
		return nil, err
	}
	count, ready := map[string]int{}, map[string]string{}
	for _, pod := range pods.Items {
		count[pod.Spec.NodeName]++
		if pod.DeletionTimestamp == nil && slices.ContainsFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool {
			return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
		}) {
			ready[pod.Spec.NodeName] = pod.Name
		}
	}
	out := map[string]string{}
	for _, n := range p.C.Nodes {
		if count[n.Name] == 1 && ready[n.Name] != "" {
			out[n.IP.String()] = ready[n.Name]
		}
	}
	return out, nil
}

// Close closes every connection.
func (h Held) Close() {
	for _, c := range h {
		c.Close()
	}
}

// HeldCheck is what a request on every held connection found.
type HeldCheck struct {
	// Total is how many connections were asked: those on a surviving replica
	// (not on an excluded node, and on an edge whose agent pod is the one that
	// accepted it; a replaced agent's nginx closed its connections, as nginx's
	// graceful stop does). Kept is how many answered in time.
	Total, Kept int
	// Gone counts the connections not asked: on an excluded node or a replaced
	// agent (or opened while its agent was being replaced).
	Gone int
	// Reloaded counts the HTTP connections not asked because their edge's
	// nginx reloaded since they opened: its old workers closed them, idle (a
	// configuration change's cut, issue 22, not the data plane's).
	Reloaded int
	// Failed says which did not answer, and why; FailedConns are they.
	Failed      []string
	FailedConns Held
}

func (c HeldCheck) String() string {
	s := fmt.Sprintf("%d of %d kept (%d on a dead or replaced replica not asked)", c.Kept, c.Total, c.Gone)
	if c.Reloaded > 0 {
		s += fmt.Sprintf(" (%d HTTP connections not asked: their nginx reloaded since they opened, issue 22)", c.Reloaded)
	}
	return s
}

// Check sends a request on every held connection on a surviving replica (an
// edge of p.Edges: a node that died left it) at once; each must be answered
// within timeout.
func (p *Portico) Check(ctx context.Context, held Held, timeout time.Duration, excluded ...*Node) HeldCheck {
	agents, err := p.Agents(ctx, "portico-agent")
	if err != nil {
		return HeldCheck{Failed: []string{err.Error()}}
	}
	var c HeldCheck
	reloads := p.lastReloads()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, h := range held {
		dead := slices.ContainsFunc(excluded, func(n *Node) bool { return n.IP.String() == h.Edge }) ||
			!slices.ContainsFunc(p.Edges, func(n *Node) bool { return n.IP.String() == h.Edge })
		replaced := h.Agent == "" || !slices.ContainsFunc(p.C.Nodes, func(n *Node) bool { return n.IP.String() == h.Edge && agents[n.Name] == h.Agent })
		if dead || replaced {
			c.Gone++
			continue
		}
		if strings.HasPrefix(h.Kind, "http") && reloads[h.Edge].After(h.Opened) {
			c.Reloaded++
			continue
		}
		c.Total++
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := h.Do(h.host, "/held", timeout)
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				c.Kept++
			} else {
				c.Failed = append(c.Failed, fmt.Sprintf("%s: %v", h, err))
				c.FailedConns = append(c.FailedConns, h)
			}
		}()
	}
	wg.Wait()
	slices.Sort(c.Failed)
	return c
}

// BlockProbes makes the liveness checks of node n fail for d, as a lost link or a
// stalled nginx would, while n keeps serving everything else: its eth0 drops
// every TCP segment to the liveness port (iptables in the node's namespace).
func (p *Portico) BlockProbes(n *Node, d time.Duration) error {
	rule := []string{"INPUT", "-i", "eth0", "-p", "tcp", "--dport", fmt.Sprint(LivenessPort), "-j", "DROP"}
	if _, err := netlab.Exec(n.Net.NS, "iptables", append([]string{"-I"}, rule...)...); err != nil {
		return err
	}
	time.Sleep(d)
	_, err := netlab.Exec(n.Net.NS, "iptables", append([]string{"-D"}, rule...)...)
	return err
}

// WaitConfigQuiet waits until no edge of p.Edges has reloaded nginx for quiet
// (each agent's portico_nginx_last_reload_success_timestamp_seconds). A reload
// closes the idle HTTP connections the old workers hold, as nginx's graceful stop
// does: until configuration changes need no reload, a test of the data plane's
// promise holds its connections once the configuration is quiet.
func (p *Portico) WaitConfigQuiet(ctx context.Context, quiet, timeout time.Duration) error {
	return until(ctx, time.Now().Add(timeout), func() error {
		for _, n := range p.Edges {
			at, err := p.lastReload(n)
			if err != nil {
				return err
			}
			if since := time.Since(at); since < quiet {
				return fmt.Errorf("%s reloaded nginx %v ago", n.Name, since.Round(time.Millisecond))
			}
		}
		return nil
	})
}

// lastReload is when node n's agent last reloaded nginx
// (portico_nginx_last_reload_success_timestamp_seconds).
func (p *Portico) lastReload(n *Node) (time.Time, error) {
	const metric = "portico_nginx_last_reload_success_timestamp_seconds "
	body, err := get(HTTPClient(p.NS, 2*time.Second), "http://"+net.JoinHostPort(n.IP.String(), "9101")+"/metrics")
	if err != nil {
		return time.Time{}, err
	}
	_, v, ok := strings.Cut(body, "\n"+metric)
	if !ok {
		return time.Time{}, fmt.Errorf("%s: no %s", n.Name, metric)
	}
	v, _, _ = strings.Cut(v, "\n")
	sec, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: %s%q: %w", n.Name, metric, v, err)
	}
	return time.Unix(0, int64(sec*1e9)), nil
}

// lastReloads is lastReload of every edge it can ask, by address.
func (p *Portico) lastReloads() map[string]time.Time {
	out := map[string]time.Time{}
	for _, n := range p.Edges {
		if at, err := p.lastReload(n); err == nil {
			out[n.IP.String()] = at
		}
	}
	return out
}

// SettledOwner waits until the same edge has owned GroupVIP (the client's view)
// for stable, and returns it.
func (p *Portico) SettledOwner(ctx context.Context, stable, timeout time.Duration) (*Node, error) {
	var last *Node
	var since time.Time
	err := until(ctx, time.Now().Add(timeout), func() error {
		n, err := p.Owner(GroupVIP)
		if err != nil {
			return err
		}
		if n != last {
			last, since = n, time.Now()
		}
		if time.Since(since) < stable {
			return fmt.Errorf("%s owns %s since %v", n.Name, GroupVIP, time.Since(since).Round(time.Millisecond))
		}
		return nil
	})
	return last, err
}
