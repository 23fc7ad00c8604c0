package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/portico-edge/portico/test/testenv"
)

// dsrSysctls are the sysctls an agent sets on its node (agent/host.go
// dsrSysctls, for the nodes' eth0).
var dsrSysctls = []string{
	"net/ipv4/conf/all/arp_ignore", "net/ipv4/conf/all/arp_announce",
	"net/ipv4/conf/eth0/arp_ignore", "net/ipv4/conf/eth0/arp_announce", "net/ipv4/conf/eth0/rp_filter",
}

// stateDir is the agents' record of what they changed, the chart's hostPath.
const stateDir = "/run/portico"

// nodeState is what an agent changes on its node, as the node's own namespaces
// show it.
type nodeState struct {
	XDP      bool     // a program attached to eth0
	PinDir   bool     // pinPath exists
	Pins     []string // what is in it
	Lookup   int      // sk_lookup links in the node's network namespace (L4 steering)
	Lo, Eth0 []string // the addresses of lo and eth0
	Sysctls  map[string]string
	State    []string          // files in stateDir
	Orig     map[string]string // stateDir/sysctl.orig: the values an agent recorded as the node's own
}

// readNodeState reads n's state through its namespaces (n.Exec).
func readNodeState(n *Node) (nodeState, error) {
	var s nodeState
	out, err := n.Exec("ip", "-j", "-d", "link", "show", "dev", "eth0")
	if err != nil {
		return s, err
	}
	var links []map[string]any
	if err := json.Unmarshal([]byte(out), &links); err != nil || len(links) != 1 {
		return s, fmt.Errorf("ip link show eth0 on %s: %v: %s", n.Name, err, out)
	}
	_, s.XDP = links[0]["xdp"]
	for dev, addrs := range map[string]*[]string{"lo": &s.Lo, "eth0": &s.Eth0} {
		out, err := n.Exec("ip", "-j", "addr", "show", "dev", dev)
		if err != nil {
			return s, err
		}
		var as []struct {
			AddrInfo []struct {
				Local     string `json:"local"`
				PrefixLen int    `json:"prefixlen"`
			} `json:"addr_info"`
		}
		if err := json.Unmarshal([]byte(out), &as); err != nil {
			return s, fmt.Errorf("ip addr show %s on %s: %w: %s", dev, n.Name, err, out)
		}
		for _, a := range as {
			for _, ai := range a.AddrInfo {
				*addrs = append(*addrs, fmt.Sprintf("%s/%d", ai.Local, ai.PrefixLen))
			}
		}
		slices.Sort(*addrs)
	}
	out, err = n.Exec("sh", "-c", "test -d "+pinPath+" && echo dir && ls -A "+pinPath+"; true")
	if err != nil {
		return s, err
	}
	if lines := strings.Fields(out); len(lines) > 0 && lines[0] == "dir" {
		s.PinDir, s.Pins = true, lines[1:]
	}
	if out, err = n.Exec("sh", "-c", "ls -A "+stateDir+" 2>/dev/null; true"); err != nil {
		return s, err
	}
	s.State = strings.Fields(out)
	s.Sysctls = map[string]string{}
	for _, k := range dsrSysctls {
		out, err := n.Exec("cat", "/proc/sys/"+k)
		if err != nil {
			return s, err
		}
		s.Sysctls[k] = strings.TrimSpace(out)
	}
	if slices.Contains(s.State, "sysctl.orig") {
		out, err := n.Exec("cat", stateDir+"/sysctl.orig")
		if err != nil {
			return s, err
		}
		s.Orig = map[string]string{}
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if k, v, ok := strings.Cut(l, " "); ok {
				s.Orig[k] = v
			}
		}
	}
	// The kernel is every node's: bpftool lists every netns link; the node's
	// are those of its network namespace.
	ino, err := n.Exec("stat", "-L", "-c", "%i", "/proc/self/ns/net")
	if err != nil {
		return s, err
	}
	if out, err = n.Exec("bpftool", "-j", "link", "show"); err != nil {
		return s, err
	}
	var bl []map[string]any
	if err := json.Unmarshal([]byte(out), &bl); err != nil {
		return s, fmt.Errorf("bpftool link show on %s: %w", n.Name, err)
	}
	for _, l := range bl {
		if v, ok := l["netns_ino"].(float64); ok && strconv.FormatFloat(v, 'f', 0, 64) == strings.TrimSpace(ino) && l["attach_type"] == "sk_lookup" {
			s.Lookup++
		}
	}
	return s, nil
}

// readNodeStates reads the state of every node of c, by name.
func readNodeStates(t *testing.T, c *Cluster) map[string]nodeState {
	t.Helper()
	out := map[string]nodeState{}
	for _, n := range c.Nodes {
		s, err := readNodeState(n)
		if err != nil {
			t.Fatal(err)
		}
		out[n.Name] = s
	}
	return out
}

// testUninstall: helm uninstall (with the IngressClaim deleted just before it, as
// values.yaml says to) leaves every node that ran an agent as it was before the
// install: no XDP program on eth0, no pins, no sk_lookup link, lo and eth0 with
// their own addresses alone, the sysctls at their values from before the first
// agent (which a rolling update since, with new pods, must not have forgotten),
// nothing left in the agents' state directory. A node that died earlier cannot run
// anything and is left out. before holds every node's state before the install.
func testUninstall(t *testing.T, ctx context.Context, p *Portico, before map[string]nodeState) {
	c := p.C
	var live []*Node
	for _, n := range c.Nodes {
		if n.kubelet != nil && n.kubelet.alive() {
			live = append(live, n)
		} else {
			t.Logf("%s is dead: not checked", n.Name)
		}
	}
	agents := map[string]bool{} // the live nodes that run an agent
	for _, ds := range []string{"portico-agent", "shop"} {
		pods, err := p.Agents(ctx, ds)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range live {
			agents[n.Name] = agents[n.Name] || pods[n.Name] != ""
		}
	}
	maps.DeleteFunc(agents, func(_ string, on bool) bool { return !on })
	// What the agents changed, and the record of the nodes' own values that
	// every agent since the install's (the rolling update replaced them all) kept.
	during := readNodeStates(t, c)
	for _, n := range live {
		s, b := during[n.Name], before[n.Name]
		if !agents[n.Name] {
			continue
		}
		if !s.XDP || len(s.Pins) == 0 || s.Lookup == 0 || len(s.Lo) <= len(b.Lo) || maps.Equal(s.Sysctls, b.Sysctls) {
			t.Errorf("%s runs an agent but shows little of it: XDP %v, pins %v, sk_lookup links %d, lo %v, sysctls %v (before the install: lo %v, sysctls %v)",
				n.Name, s.XDP, s.Pins, s.Lookup, s.Lo, s.Sysctls, b.Lo, b.Sysctls)
		}
		if !maps.Equal(s.Orig, b.Sysctls) {
			t.Errorf("%s: the agents' record of the original sysctls is %v, the node had %v", n.Name, s.Orig, b.Sysctls)
		}
	}
	if len(agents) < 2 {
		t.Fatalf("agents on the live nodes %v: want an edge's and the claim's at least", slices.Sorted(maps.Keys(agents)))
	}
	logs := []*LogRecorder{p.RecordAgentLogs(ctx, "portico-agent"), p.RecordAgentLogs(ctx, "shop")}
	defer func() {
		for _, l := range logs {
			l.Stop()
		}
	}()
	time.Sleep(time.Second) // the recorders follow every running agent

	start := time.Now()
	if _, err := c.Kubectl(ctx, nil, "-n", PorticoNamespace, "delete", "ingressclaim", "shop", "--wait=false"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Helm(ctx, "uninstall", "portico", "-n", PorticoNamespace); err != nil {
		t.Fatal(err)
	}
	t.Logf("helm uninstall: %.1f s", time.Since(start).Seconds())
	var after map[string]nodeState
	_, err := testenv.Poll(ctx, 2*time.Minute, 500*time.Millisecond, func() error {
		after = map[string]nodeState{}
		var left []string
		for _, n := range live {
			s, err := readNodeState(n)
			if err != nil {
				return err
			}
			after[n.Name] = s
			if d := nodeLeft(s, before[n.Name]); d != "" {
				left = append(left, n.Name+": "+d)
			}
		}
		if len(left) > 0 {
			return errors.New(strings.Join(left, "\n"))
		}
		return nil
	})
	if err != nil {
		t.Errorf("after helm uninstall, left on the nodes:\n%v", err)
		for _, n := range live {
			t.Logf("%s before the install %+v, now %+v", n.Name, before[n.Name], after[n.Name])
		}
		for _, l := range logs {
			t.Logf("what the agents said as they stopped:\n%s", l.Lines("stopp", "undo", "owner", "DaemonSet", `"level":"error"`))
		}
		return
	}
	t.Logf("every live node as before the install %.1f s after helm uninstall began: %v, with an agent until then", time.Since(start).Seconds(), slices.Sorted(maps.Keys(agents)))
}

// nodeLeft says what of an agent's changes node state s still shows, compared
// with b, its state before the install ("" if nothing).
func nodeLeft(s, b nodeState) string {
	var left []string
	if s.XDP {
		left = append(left, "a program on eth0")
	}
	if s.PinDir {
		left = append(left, fmt.Sprintf("%s with %v", pinPath, s.Pins))
	}
	if s.Lookup > 0 {
		left = append(left, fmt.Sprintf("%d sk_lookup links", s.Lookup))
	}
	if !slices.Equal(s.Lo, b.Lo) {
		left = append(left, fmt.Sprintf("lo holds %v, held %v", s.Lo, b.Lo))
	}
	if !slices.Equal(s.Eth0, b.Eth0) {
		left = append(left, fmt.Sprintf("eth0 holds %v, held %v", s.Eth0, b.Eth0))
	}
	if !maps.Equal(s.Sysctls, b.Sysctls) {
		left = append(left, fmt.Sprintf("sysctls %v, were %v", s.Sysctls, b.Sysctls))
	}
	if len(s.State) > 0 {
		left = append(left, fmt.Sprintf("%s holds %v", stateDir, s.State))
	}
	return strings.Join(left, "; ")
}
