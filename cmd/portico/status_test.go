package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/portico-edge/portico/api/agentstatus"
)

// A replica that the liveness checks took out is in no ring but still listed,
// with what Kubernetes says of it and each node's verdict.
func TestPrintStatusLiveness(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	since := now.Add(-12 * time.Second)
	replicas := func(cLive string) []agentstatus.ReplicaLiveness {
		return []agentstatus.ReplicaLiveness{
			{Addr: "10.0.0.1", Kubernetes: "ready", Live: "live", Since: now.Add(-time.Hour)},
			{Addr: "10.0.0.2", Kubernetes: "ready", Live: "live", Since: now.Add(-time.Hour)},
			{Addr: "10.0.0.3", Kubernetes: "ready", Live: cLive, Since: since},
		}
	}
	vip := agentstatus.VIPState{VIP: "192.0.2.80", Digest: "abc", Replicas: []agentstatus.ReplicaState{
		{Addr: "10.0.0.1", State: "ready", Share: 0.5, MACKnown: true, Local: true},
		{Addr: "10.0.0.2", State: "ready", Share: 0.5, MACKnown: true},
	}}
	states := []agentstatus.State{
		{Node: "edge-1", Addrs: []string{"10.0.0.1", "192.0.2.80"}, Group: "g/e", Healthy: true, VRRP: map[string]string{"g/e/v4": "master"},
			VIPs: []agentstatus.VIPState{vip}, Replicas: replicas("dead"), Updated: now},
		{Node: "edge-2", Addrs: []string{"10.0.0.2"}, Group: "g/e", Healthy: true, VRRP: map[string]string{"g/e/v4": "backup"},
			VIPs: []agentstatus.VIPState{vip}, Replicas: replicas("dead"), Updated: now},
		{Node: "edge-3", Addrs: []string{"10.0.0.3"}, Group: "g/e", Healthy: false, Reason: "stale report", Updated: now.Add(-time.Minute)},
	}
	var out bytes.Buffer
	if err := printStatus(&out, states, map[string]bool{"edge-3": true}, now); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	t.Logf("\n%s", got)
	var row string
	for _, l := range strings.Split(got, "\n") {
		if strings.Contains(l, "10.0.0.3") {
			row = l
		}
	}
	for _, want := range []string{"edge-3", "ready", "dead for 12s on edge-1,edge-2", "stale report", "-"} {
		if !strings.Contains(row, want) {
			t.Errorf("row of the dead replica %q lacks %q", row, want)
		}
	}
	if !strings.Contains(got, "live for 1h0m0s on edge-1,edge-2") {
		t.Errorf("no live verdicts in\n%s", got)
	}
	if !strings.Contains(got, "all nodes agree") {
		t.Errorf("digests should agree:\n%s", got)
	}
}

// A dead owner's last report (stale) claims master, an old digest and its own view:
// none of it counts. The live owner's view, digest and counters are shown.
func TestPrintStatusIgnoresStaleReports(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	old := agentstatus.VIPState{VIP: "192.0.2.80", Digest: "old", Replicas: []agentstatus.ReplicaState{
		{Addr: "10.0.0.1", State: "ready", Share: 0.5, MACKnown: true, Local: true},
		{Addr: "10.0.0.2", State: "ready", Share: 0.5, MACKnown: true},
	}}
	cur := agentstatus.VIPState{VIP: "192.0.2.80", Digest: "new", Replicas: []agentstatus.ReplicaState{
		{Addr: "10.0.0.2", State: "ready", Share: 1, MACKnown: true, Local: true, Packets: 4242},
	}}
	states := []agentstatus.State{
		{Node: "edge-1", Addrs: []string{"10.0.0.1"}, Group: "g/e", Healthy: true, VRRP: map[string]string{"g/e/v4": "master"},
			VIPs: []agentstatus.VIPState{old}, Updated: now.Add(-time.Minute)},
		{Node: "edge-2", Addrs: []string{"10.0.0.2", "192.0.2.80"}, Group: "g/e", Healthy: true, VRRP: map[string]string{"g/e/v4": "master"},
			VIPs: []agentstatus.VIPState{cur}, Updated: now},
	}
	var out bytes.Buffer
	if err := printStatus(&out, states, map[string]bool{"edge-1": true}, now); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	t.Logf("\n%s", got)
	for _, want := range []string{"owner edge-2\n", "new on edge-2 (all nodes agree)", "100.00%", "4242"} {
		if !strings.Contains(got, want) {
			t.Errorf("status lacks %q", want)
		}
	}
	for _, bad := range []string{"split brain", "DISAGREE", "old on"} {
		if strings.Contains(got, bad) {
			t.Errorf("status says %q: the stale report counted", bad)
		}
	}
}

// The node table says which mode xdp_lb runs in on each node, and "-" for an
// agent that does not say (one older than the field).
func TestPrintStatusXDPMode(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	states := []agentstatus.State{
		{Node: "edge-1", Group: "g/e", Healthy: true, VRRP: map[string]string{"g/e/v4": "master"}, XDPAttachMode: "native", Updated: now},
		{Node: "edge-2", Group: "g/e", Healthy: true, VRRP: map[string]string{"g/e/v4": "backup"}, XDPAttachMode: "generic", Updated: now},
		{Node: "edge-3", Group: "g/e", Healthy: true, VRRP: map[string]string{"g/e/v4": "backup"}, Updated: now.Add(-2 * time.Second)},
	}
	var out bytes.Buffer
	if err := printStatus(&out, states, nil, now); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"NODE    GROUP  HEALTH  VRRP       XDP      REPORTED  ",
		"edge-1  g/e    ok      v4=master  native   0s ago    ",
		"edge-2  g/e    ok      v4=backup  generic  0s ago    ",
		"edge-3  g/e    ok      v4=backup  -        2s ago    ",
	}
	got := strings.Split(out.String(), "\n")
	if len(got) > len(want) {
		got = got[:len(want)]
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("node table (-want +got):\n%s", d)
	}
}

// portico status -o json|yaml: every agent's state by node name, with its
// staleness, in the wire format's names.
func TestPrintStatusDoc(t *testing.T) {
	states := []agentstatus.State{{Node: "n2", Group: "g", Healthy: true, XDPAttachMode: "native"}, {Node: "n1", Group: "g", Reason: "nginx down"}}
	var js bytes.Buffer
	if err := printStatusDoc(&js, "json", states, map[string]bool{"n1": true}); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Agents []map[string]any `json:"agents"`
	}
	if err := json.Unmarshal(js.Bytes(), &doc); err != nil {
		t.Fatalf("%v\n%s", err, js.String())
	}
	if len(doc.Agents) != 2 || doc.Agents[0]["node"] != "n1" || doc.Agents[0]["stale"] != true || doc.Agents[1]["stale"] != false ||
		doc.Agents[1]["xdpAttachMode"] != "native" || doc.Agents[1]["healthy"] != true {
		t.Errorf("json:\n%s", js.String())
	}
	var ym bytes.Buffer
	if err := printStatusDoc(&ym, "yaml", states, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ym.String(), "agents:\n- ") || !strings.Contains(ym.String(), "node: n1\n") {
		t.Errorf("yaml:\n%s", ym.String())
	}
	var empty bytes.Buffer
	if err := printStatusDoc(&empty, "json", nil, nil); err != nil || !strings.Contains(empty.String(), `"agents": []`) {
		t.Errorf("no agents: %v %s", err, empty.String())
	}
}

// statusConfig: a kubeconfig's context is chosen by -context, and KUBECONFIG is
// kubectl's; -apiserver goes with the in-cluster config alone.
func TestStatusConfig(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	kc := filepath.Join(t.TempDir(), "config")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters:
- name: a
  cluster: {server: "https://a.example:6443"}
- name: b
  cluster: {server: "https://b.example:6443"}
users:
- name: u
  user: {token: t}
contexts:
- name: a
  context: {cluster: a, user: u}
- name: b
  context: {cluster: b, user: u}
current-context: a
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, ctx, env, want string }{
		{kc, "", "", "https://a.example:6443"},
		{kc, "b", "", "https://b.example:6443"},
		{"", "b", kc, "https://b.example:6443"},
	} {
		t.Setenv("KUBECONFIG", tc.env)
		c, err := statusConfig(tc.path, tc.ctx, "")
		if err != nil || c.Host != tc.want {
			t.Errorf("statusConfig(%q, %q) with KUBECONFIG=%q: %v %v, want %s", tc.path, tc.ctx, tc.env, c, err, tc.want)
		}
	}
	if _, err := statusConfig(kc, "", "https://x:6443"); err == nil {
		t.Error("-apiserver with a kubeconfig: want an error")
	}
	if _, err := statusConfig(kc, "nope", ""); err == nil {
		t.Error("a context the kubeconfig lacks: want an error")
	}
}
