package sites

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestLoad: the peers' edges, sorted and without duplicates; a bad file
// is an error naming what is wrong.
func TestLoad(t *testing.T) {
	dir := t.TempDir()
	for name, tc := range map[string]struct {
		body  string
		edges []string
		err   string
	}{
		"two sites":            {"site: b\npeers:\n- {name: a, edges: [10.0.0.2, 10.0.0.1, 10.0.0.2]}\n- {name: c, edges: [10.1.0.1]}\n", []string{"a/10.0.0.1", "a/10.0.0.2", "c/10.1.0.1"}, ""},
		"an edge in two sites": {"site: b\npeers:\n- {name: a, edges: [10.0.0.1]}\n- {name: c, edges: [10.0.0.1]}\n", nil, "in sites a and c"},
		"no peers":             {"site: b\n", nil, ""},
		"IPv6 edge":            {"site: b\npeers:\n- {name: a, edges: ['2001:db8::1']}\n", nil, "not an IPv4 address"},
		"this site":            {"site: b\npeers:\n- {name: b, edges: [10.0.0.1]}\n", nil, "not this site's"},
		"unknown field":        {"site: b\npeer: []\n", nil, "unknown field"},
	} {
		p := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
		if err := os.WriteFile(p, []byte(tc.body), 0o644); err != nil {
			t.Fatal(err)
		}
		_, edges, err := Load(p)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want one saying %q", name, err, tc.err)
			}
			continue
		}
		var got []string
		for _, e := range edges {
			got = append(got, e.Site+"/"+e.Addr.String())
		}
		if err != nil || !slices.Equal(got, tc.edges) {
			t.Errorf("%s: %v, %v; want %v", name, got, err, tc.edges)
		}
	}
}

// TestLoadOverflow: an overflow must name a peer, a positive capacity and a
// limit in range.
func TestLoadOverflow(t *testing.T) {
	dir := t.TempDir()
	for name, tc := range map[string]struct{ body, err string }{
		"good":        {"site: b\noverflow: {capacityPerEdge: 100, to: a, limit: 0.4}\npeers:\n- {name: a, edges: [10.0.0.1]}\n", ""},
		"not a peer":  {"site: b\noverflow: {capacityPerEdge: 100, to: c}\npeers:\n- {name: a, edges: [10.0.0.1]}\n", "not a peer"},
		"no capacity": {"site: b\noverflow: {to: a}\npeers:\n- {name: a, edges: [10.0.0.1]}\n", "positive rate"},
		"limit":       {"site: b\noverflow: {capacityPerEdge: 1, to: a, limit: 0.95}\npeers:\n- {name: a, edges: [10.0.0.1]}\n", "want 0 to"},
	} {
		p := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
		if err := os.WriteFile(p, []byte(tc.body), 0o644); err != nil {
			t.Fatal(err)
		}
		_, _, err := Load(p)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: %v, want %q", name, err, tc.err)
		}
	}
}
