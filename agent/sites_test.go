package agent

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/portico-edge/portico/api/sites"
)

// TestSitesReload: a changed file is followed; an invalid one is reported and
// the last good peers kept.
func TestSitesReload(t *testing.T) {
	p := filepath.Join(t.TempDir(), "peers.yaml")
	write := func(body string, stamp time.Time) {
		t.Helper()
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, stamp, stamp); err != nil {
			t.Fatal(err)
		}
	}
	s := &peerSites{path: p, log: zap.NewNop()}
	now := time.Now()
	write("site: b\npeers:\n- {name: a, edges: [10.0.0.1]}\n", now)
	if !s.reload() || !slices.Equal(s.edges, []sites.Edge{{Site: "a", Addr: netip.MustParseAddr("10.0.0.1")}}) {
		t.Fatalf("first read: %v", s.edges)
	}
	if s.reload() {
		t.Error("an unchanged file counted as a change")
	}
	write("site: b\npeers:\n- {name: a, edges: [nonsense]}\n", now.Add(time.Second))
	if s.reload() || len(s.edges) != 1 {
		t.Errorf("an invalid file changed the peers to %v", s.edges)
	}
	write("site: b\npeers:\n- {name: a, edges: [10.0.0.1, 10.0.0.2]}\n", now.Add(2*time.Second))
	if !s.reload() || len(s.edges) != 2 {
		t.Errorf("a good file after a bad one: %v", s.edges)
	}
}

// TestSitesDrain: a site drains from drainFrom on; its peers see it draining at
// once.
func TestSitesDrain(t *testing.T) {
	p := filepath.Join(t.TempDir(), "peers.yaml")
	from := time.Date(2026, 11, 26, 2, 0, 0, 0, time.UTC)
	body := "site: b\ndraining: true\ndrainFrom: " + from.Format(time.RFC3339) + "\npeers:\n- {name: a, edges: [10.0.0.1], draining: true}\n- {name: c, edges: [10.0.0.2]}\n"
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	s := &peerSites{path: p, log: zap.NewNop()}
	s.reload()
	if d, _ := s.drainingNow(from.Add(-time.Second)); d {
		t.Error("draining a second before drainFrom")
	}
	if d, w := s.drainingNow(from.Add(time.Hour)); !d || w {
		t.Errorf("an hour into the drain, no grace: draining %v, withdrawn %v; want true, false", d, w)
	}
	body = strings.Replace(body, "draining: true\n", "draining: true\ndrainGrace: 10m\n", 1)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p, from.Add(time.Minute), from.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	s.reload()
	if d, w := s.drainingNow(from.Add(9 * time.Minute)); !d || w {
		t.Errorf("9 min into the drain, grace 10 min: draining %v, withdrawn %v; want true, false", d, w)
	}
	if d, w := s.drainingNow(from.Add(10 * time.Minute)); !d || !w {
		t.Errorf("10 min into the drain, grace 10 min: draining %v, withdrawn %v; want true, true", d, w)
	}
	if got := s.draining(); !slices.Equal(got, []string{"a"}) {
		t.Errorf("peers draining: %v, want [a]", got)
	}
}
