package main

import (
	"bytes"
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
