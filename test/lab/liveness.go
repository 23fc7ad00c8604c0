package lab

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/test/netlab"
)

// pinDir is where node n's agent pins its maps.
func (l *Lab) pinDir(n *Node) string { return "/sys/fs/bpf/" + l.Net.Prefix + n.Name }

// Replicas reads node n's pinned maps: the replicas its data plane steers the
// VIP's new flows to (those holding slots of its ring: not draining, not dead),
// and the table digest.
func (l *Lab) Replicas(n *Node) (addrs []netip.Addr, digest string, err error) {
	in, err := dataplane.OpenPinned(l.pinDir(n))
	if err != nil {
		return nil, "", err
	}
	defer in.Close()
	vips, err := in.VIPs()
	if err != nil {
		return nil, "", err
	}
	for _, v := range vips {
		if v.Addr != VIP {
			continue
		}
		for _, b := range v.Backends {
			if b.Slots > 0 {
				addrs = append(addrs, b.Addr)
			}
		}
		digest = v.Digest
	}
	sort.Slice(addrs, func(i, j int) bool { return addrs[i].Less(addrs[j]) })
	return addrs, digest, nil
}

// InRing reports whether node n's data plane steers to replica r.
func (l *Lab) InRing(n, r *Node) (bool, error) {
	addrs, _, err := l.Replicas(n)
	if err != nil {
		return false, err
	}
	for _, a := range addrs {
		if a == r.Addr.Addr() {
			return true, nil
		}
	}
	return false, nil
}

// DigestsAgree reports whether every given node's table digest is the same.
func (l *Lab) DigestsAgree(nodes []*Node) error {
	seen := map[string][]string{}
	for _, n := range nodes {
		_, d, err := l.Replicas(n)
		if err != nil {
			return err
		}
		seen[d] = append(seen[d], n.Name)
	}
	if len(seen) != 1 {
		return fmt.Errorf("table digests differ: %v", seen)
	}
	return nil
}

// KillEdge kills node n's agent (-9) and cuts its link: a dead edge. It keeps
// the node's gatewayed routes (the link going down drops them) for reviveEdge.
func (l *Lab) KillEdge(n *Node) error {
	if err := l.Agent(l.EdgeNo(n)).Kill(syscall.SIGKILL, 5*time.Second); err != nil {
		return err
	}
	out, err := exec.Command("ip", "-n", n.NS, "route", "show").Output()
	if err != nil {
		return fmt.Errorf("routes of %s: %w", n.Name, err)
	}
	var routes []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, " via ") {
			routes = append(routes, strings.TrimSpace(line))
		}
	}
	l.mu.Lock()
	if l.routes == nil {
		l.routes = map[*Node][]string{}
	}
	l.routes[n] = routes
	l.mu.Unlock()
	return netlab.IP("-n", n.NS, "link", "set", "eth0", "down")
}

// NonOwner returns an edge that does not own the VIP.
func (l *Lab) NonOwner() (*Node, error) {
	owner, err := l.Owner()
	if err != nil {
		return nil, err
	}
	for _, e := range l.Edges {
		if e != owner {
			return e, nil
		}
	}
	return nil, fmt.Errorf("no edge but the owner")
}

// LivenessTransitions counts node n's agent's log lines saying, at since or
// later, that replica r went to state ("dead" or "live").
func (l *Lab) LivenessTransitions(n, r *Node, to string, since time.Time) int {
	count := 0
	for _, line := range strings.Split(l.Agent(l.EdgeNo(n)).Log(), "\n") {
		var e struct {
			TS      float64 `json:"ts"`
			Msg     string  `json:"msg"`
			Backend string  `json:"backend"`
			To      string  `json:"to"`
		}
		if json.Unmarshal([]byte(line), &e) != nil || e.Msg != "replica liveness changed" {
			continue
		}
		at := time.Unix(0, int64(e.TS*1e9))
		if e.Backend == r.Addr.Addr().String() && e.To == to && !at.Before(since) {
			count++
		}
	}
	return count
}

// NginxPIDs lists the nginx processes (master and workers) of node n's agent.
func (l *Lab) NginxPIDs(n *Node) ([]int, error) {
	a := l.Agent(l.EdgeNo(n))
	b, err := os.ReadFile(filepath.Join(a.Dir, "nginx", "nginx.pid"))
	if err != nil {
		return nil, err
	}
	master, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("nginx pid file: %w", err)
	}
	pids := []int{master}
	out, err := exec.Command("pgrep", "-P", fmt.Sprint(master)).Output()
	if err != nil {
		return nil, fmt.Errorf("nginx workers of %d: %w", master, err)
	}
	for _, f := range strings.Fields(string(out)) {
		var p int
		if _, err := fmt.Sscan(f, &p); err == nil {
			pids = append(pids, p)
		}
	}
	return pids, nil
}

// SignalAll sends sig to every pid.
func SignalAll(pids []int, sig syscall.Signal) error {
	for _, p := range pids {
		if err := syscall.Kill(p, sig); err != nil {
			return fmt.Errorf("signal %d: %w", p, err)
		}
	}
	return nil
}

// FlowsFrom describes, for each edge, the flow table entry of the client's
// connection from port to the VIP, if it has one: where that edge steers it.
func (l *Lab) FlowsFrom(port uint16) string {
	var out []string
	for _, e := range l.Edges {
		in, err := dataplane.OpenPinned(l.pinDir(e))
		if err != nil {
			out = append(out, e.Name+": "+err.Error())
			continue
		}
		flows, err := in.Flows(0)
		in.Close()
		if err != nil {
			out = append(out, e.Name+": "+err.Error())
			continue
		}
		for _, f := range flows {
			if f.Flow.SPort == port && f.Flow.Dst == VIP {
				out = append(out, fmt.Sprintf("%s steers it to %v (seen %v ago)", e.Name, f.Backend, f.Age.Round(time.Millisecond)))
			}
		}
	}
	if len(out) == 0 {
		return "no edge has its flow"
	}
	return strings.Join(out, "; ")
}
