package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/agent/lease"
	"github.com/portico-edge/portico/dataplane/pins"
	"github.com/portico-edge/portico/test/traffic"
)

// Owner returns the node whose MAC address the client has for the VIP: the one its
// traffic goes to (the VRRP owner's, from its gratuitous ARP or the client's
// question).
func (p *Portico) Owner(vip netip.Addr) (*Node, error) {
	out, err := exec.Command("ip", "-n", p.NS, "-j", "neigh", "show", vip.String()).Output()
	if err != nil {
		return nil, fmt.Errorf("ip neigh in %s: %w", p.NS, err)
	}
	var neigh []struct {
		LLAddr string   `json:"lladdr"`
		State  []string `json:"state"`
	}
	if err := json.Unmarshal(out, &neigh); err != nil {
		return nil, fmt.Errorf("ip neigh: %w", err)
	}
	for _, e := range neigh {
		for _, n := range p.C.Nodes {
			if strings.EqualFold(e.LLAddr, n.Net.MAC.String()) {
				return n, nil
			}
		}
	}
	return nil, fmt.Errorf("the client has no MAC of a node for %s: %s", vip, out)
}

// EdgeOf returns the node whose nginx sent a backend the request a reply answers:
// the reply's edge address is that node's (or, for a backend pod on the same node,
// the node's pod gateway).
func (p *Portico) EdgeOf(r traffic.Reply) string {
	ip, err := netip.ParseAddr(r.Edge)
	if err != nil {
		return ""
	}
	for i, n := range p.C.Nodes {
		if ip == n.IP || ip == PodCIDR(i+1).Addr().Next() {
			return n.Name
		}
	}
	return ""
}

// XDPLink is the pinned BPF link by which an edge node's xdp_lb is attached, the
// program it runs, and the pinned maps every program of it uses (rings, flows).
type XDPLink struct{ ID, ProgID, RingsID, FlowsID int }

// XDPLink reads the link pinned in node n's bpffs (bpftool in the node's
// namespaces, where the agent pod's hostPath sees it).
func (p *Portico) XDPLink(n *Node) (XDPLink, error) {
	out, err := n.Exec("bpftool", "-j", "link", "show", "pinned", pinPath+"/link")
	if err != nil {
		return XDPLink{}, err
	}
	var l struct {
		ID     int `json:"id"`
		ProgID int `json:"prog_id"`
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		return XDPLink{}, fmt.Errorf("bpftool link show on %s: %w: %s", n.Name, err, out)
	}
	x := XDPLink{ID: l.ID, ProgID: l.ProgID}
	for m, id := range map[string]*int{"rings": &x.RingsID, "flows": &x.FlowsID} {
		// Pins carry their layout (rings@<entry>-<shape>): one per map once
		// an agent has started.
		out, err := n.Exec("sh", "-c", "bpftool -j map show pinned "+pinPath+"/"+m+pins.Sep+"*")
		if err != nil {
			return x, err
		}
		var v struct {
			ID int `json:"id"`
		}
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			return x, fmt.Errorf("bpftool map show on %s: %w: %s", n.Name, err, out)
		}
		*id = v.ID
	}
	return x, nil
}

// Agents returns the name of the agent pod on each node, for DaemonSet name.
func (p *Portico) Agents(ctx context.Context, name string) (map[string]string, error) {
	pods, err := p.C.Kube.CoreV1().Pods(PorticoNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, pod := range pods.Items {
		if ownedBy(&pod, name) && pod.DeletionTimestamp == nil {
			out[pod.Spec.NodeName] = pod.Name
		}
	}
	return out, nil
}

// AgentLogs returns the lines of every running agent's log (DaemonSet name) that
// match one of the words, for a failing test to show what the agents saw.
func (p *Portico) AgentLogs(ctx context.Context, name string, words ...string) string {
	agents, err := p.Agents(ctx, name)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for node, pod := range agents {
		out, err := p.C.Kubectl(ctx, nil, "-n", PorticoNamespace, "logs", pod, "--tail=400")
		if err != nil {
			fmt.Fprintf(&b, "--- %s (%s): %v\n", pod, node, err)
			continue
		}
		fmt.Fprintf(&b, "--- %s (%s)\n", pod, node)
		for _, l := range strings.Split(out, "\n") {
			if slices.ContainsFunc(words, func(w string) bool { return strings.Contains(l, w) }) {
				b.WriteString(l + "\n")
			}
		}
	}
	return b.String()
}

// AgentCommand runs `portico args...` in every agent pod it can reach and returns
// the outputs, for a failure's report (what xdp_lb counted, which flows it pinned).
func (p *Portico) AgentCommand(ctx context.Context, name string, args ...string) string {
	agents, err := p.Agents(ctx, name)
	if err != nil {
		return err.Error()
	}
	nodes := slices.Sorted(maps.Keys(agents))
	var b strings.Builder
	for _, node := range nodes {
		pod := agents[node]
		out, err := p.C.Kubectl(ctx, nil, append([]string{"-n", PorticoNamespace, "exec", pod, "-c", "agent", "--", "portico"}, args...)...)
		if err != nil {
			fmt.Fprintf(&b, "--- %s (%s): portico %s: %v\n", pod, node, strings.Join(args, " "), err)
			continue
		}
		fmt.Fprintf(&b, "--- %s (%s): portico %s\n%s\n", pod, node, strings.Join(args, " "), out)
	}
	return b.String()
}

// WaitDraining waits until every edge's agent reports (its status Lease, what
// portico status reads) that its data plane holds node n's replica as draining for
// the group's VIP, and returns when it saw that: from then on no director gives n
// new flows.
func (p *Portico) WaitDraining(ctx context.Context, n *Node, timeout time.Duration) (time.Time, error) {
	var seen time.Time
	err := until(ctx, time.Now().Add(timeout), func() error {
		states, stale, err := lease.ReadStates(ctx, p.C.Kube, PorticoNamespace)
		if err != nil {
			return err
		}
		reported := 0
		for _, st := range states {
			if stale[st.Node] || !slices.ContainsFunc(p.Edges, func(e *Node) bool { return e.Name == st.Node }) {
				continue
			}
			reported++
			draining := false
			for _, v := range st.VIPs {
				for _, r := range v.Replicas {
					if v.VIP == GroupVIP.String() && r.Addr == n.IP.String() && r.State == "draining" {
						draining = true
					}
				}
			}
			if !draining {
				return fmt.Errorf("%s does not hold %s as draining yet", st.Node, n.Name)
			}
		}
		if reported != len(p.Edges) {
			return fmt.Errorf("%d of %d edges reported", reported, len(p.Edges))
		}
		seen = time.Now()
		return nil
	})
	return seen, err
}

// InTransition returns the edges that report a ring transition of the group's
// VIP under way, with how long it lasts still.
func (p *Portico) InTransition(ctx context.Context) ([]string, error) {
	states, stale, err := lease.ReadStates(ctx, p.C.Kube, PorticoNamespace)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, st := range states {
		if stale[st.Node] {
			continue
		}
		for _, v := range st.VIPs {
			if v.VIP == GroupVIP.String() && v.TransitionSeconds > 0 {
				out = append(out, fmt.Sprintf("%s (%.0f s more)", st.Node, v.TransitionSeconds))
			}
		}
	}
	return out, nil
}
