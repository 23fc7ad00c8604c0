package dataplane

import (
	"encoding/json"
	"os/exec"
	"testing"

	"github.com/portico-edge/portico/test/testenv"
)

// TestBpftoolShowsNamedFields: an operator's `bpftool map dump pinned ...` prints
// the maps with their C field names (BTF travels with the pinned maps).
func TestBpftoolShowsNamedFields(t *testing.T) {
	d := loadForTest(t)
	testenv.RequireProgram(t, "bpftool")
	if _, err := d.Apply(desired(r1, r3)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		m      string
		fields []string // fields of the formatted key and value
	}{
		{lbMapVips, []string{"addr", "port", "proto", "vip_id"}},
		{lbMapBackends, []string{"addr", "mac", "flags", "vip_id", "weight"}},
		{lbMapLbCfg, []string{"seed", "ring_size", "generation", "mac"}},
	} {
		t.Run(tc.m, func(t *testing.T) {
			out, err := exec.Command("bpftool", "-j", "map", "dump", "pinned", pinOf(t, d, tc.m)).Output()
			if err != nil {
				t.Fatalf("bpftool: %v", err)
			}
			var entries []struct {
				Formatted struct {
					Key   any            `json:"key"`
					Value map[string]any `json:"value"`
				} `json:"formatted"`
			}
			if err := json.Unmarshal(out, &entries); err != nil {
				t.Fatalf("parse bpftool output: %v\n%s", err, out)
			}
			if len(entries) == 0 {
				t.Fatalf("bpftool printed no entries:\n%s", out)
			}
			seen := map[string]bool{}
			for _, e := range entries {
				for k := range e.Formatted.Value {
					seen[k] = true
				}
				if key, ok := e.Formatted.Key.(map[string]any); ok {
					for k := range key {
						seen[k] = true
					}
				}
			}
			for _, f := range tc.fields {
				if !seen[f] {
					t.Errorf("field %q not in bpftool's formatted output:\n%s", f, out)
				}
			}
		})
	}
}
