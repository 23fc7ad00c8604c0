package dataplane

import (
	"testing"

	"github.com/portico-edge/portico/controlplane/model"
)

// The build keeps every group within what xdp_lb's maps hold (model's
// MaxGroup* limits): they must be the program's own.
func TestModelLimitsAreTheProgram(t *testing.T) {
	for _, c := range []struct {
		name       string
		model, bpf int
	}{
		{"VIP addresses", model.MaxGroupVIPs, int(lbLbLimitsLB_MAX_VIPS)},
		{"VIP keys", model.MaxGroupVIPKeys, int(lbLbLimitsLB_MAX_VIP_KEYS)},
		{"backends (id 0 unused)", model.MaxGroupBackends, int(lbLbLimitsLB_MAX_BACKENDS) - 1},
	} {
		if c.model != c.bpf {
			t.Errorf("%s: model says %d, xdp_lb holds %d", c.name, c.model, c.bpf)
		}
	}
}
