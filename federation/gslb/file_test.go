package gslb

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"github.com/portico-edge/portico/agent/lease"
	"github.com/portico-edge/portico/api/agentstatus"
)

func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte(`self: east
names: [shop.example.com]
ttl: 10s
interval: 500ms
failAfter: 4
sites:
- {name: east, addrs: [192.0.2.10, "2001:db8::10"], subnets: [10.1.0.0/16], health: "http://192.0.2.11:8053/health"}
- {name: west, addrs: [198.51.100.10], health: "http://198.51.100.11:8053/health"}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := LoadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	c.OwnHealth = healthy
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.TTL != 10*time.Second || c.Interval != 500*time.Millisecond || c.FailAfter != 4 || c.RiseAfter != 2 ||
		len(c.Sites) != 2 || c.Sites[0].Addrs[1].String() != "2001:db8::10" || c.Sites[0].Subnets[0].String() != "10.1.0.0/16" {
		t.Errorf("loaded %+v", c)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("self: east\nsitez: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadFile(bad); err == nil || !strings.Contains(err.Error(), "sitez") {
		t.Errorf("unknown field: err = %v", err)
	}
}

// TestAgentsHealth: the own site is healthy while a renewed agent report announces
// as preferred (BGP) or owns the VIPs (VRRP); de-preferenced, withdrawn or stale
// reports do not count.
func TestAgentsHealth(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	write := func(node string, st agentstatus.State, ttl time.Duration) {
		t.Helper()
		st.Node = node
		b, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Write(ctx, client, "portico-system", node, b, ttl); err != nil {
			t.Fatal(err)
		}
	}
	bgpState := func(pref string) *agentstatus.BGPState {
		return &agentstatus.BGPState{Preference: pref, Announced: []agentstatus.BGPAnnouncement{{}}}
	}
	health := AgentsHealth(client, "portico-system")
	if r := health(ctx); r.Healthy {
		t.Errorf("no agents: %+v", r)
	}
	write("edge-1", agentstatus.State{BGP: bgpState("depreferenced")}, time.Minute)
	write("edge-2", agentstatus.State{BGP: bgpState("withdrawn")}, time.Minute)
	if r := health(ctx); r.Healthy || !strings.Contains(r.Reason, "edge-1, edge-2") {
		t.Errorf("de-preferenced and withdrawn: %+v", r)
	}
	write("edge-2", agentstatus.State{BGP: bgpState("normal")}, time.Minute)
	if r := health(ctx); !r.Healthy {
		t.Errorf("one edge announcing: %+v", r)
	}
	write("edge-2", agentstatus.State{BGP: bgpState("normal")}, time.Nanosecond) // stale at once
	time.Sleep(1100 * time.Millisecond)
	if r := health(ctx); r.Healthy {
		t.Errorf("the announcing edge's report is stale: %+v", r)
	}
	write("edge-3", agentstatus.State{VRRP: map[string]string{"v4": "master"}}, time.Minute)
	if r := health(ctx); !r.Healthy {
		t.Errorf("a VRRP master: %+v", r)
	}
}

// TestDeployedConfig: the example configuration in deploy/federation/dns.yaml loads
// and validates.
func TestDeployedConfig(t *testing.T) {
	b, err := os.ReadFile("../../deploy/federation/dns.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var cm struct {
			Kind string            `json:"kind"`
			Data map[string]string `json:"data"`
		}
		if err := yaml.Unmarshal([]byte(doc), &cm); err != nil {
			t.Fatal(err)
		}
		if cm.Kind != "ConfigMap" {
			continue
		}
		found = true
		p := filepath.Join(t.TempDir(), "sites.yaml")
		if err := os.WriteFile(p, []byte(cm.Data["sites.yaml"]), 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := LoadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		c.OwnHealth = healthy
		if err := c.Validate(); err != nil {
			t.Fatalf("the deployed example: %v", err)
		}
	}
	if !found {
		t.Fatal("no ConfigMap in deploy/federation/dns.yaml")
	}
}
