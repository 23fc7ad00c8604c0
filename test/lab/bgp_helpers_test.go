package lab

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/portico-edge/portico/test/frr"
	"github.com/portico-edge/portico/test/testenv"
)

// startBGPLab is startLab for the BGP lab: the client behind an FRR router, the
// agents with --announce=bgp and BFD at bfd x 3.
func startBGPLab(t *testing.T, bfd time.Duration) *Lab {
	t.Helper()
	return startBGPLabWith(t, BGPOptions{BFD: bfd})
}

// startBGPLabWith is startBGPLab with more options (o.T is set here).
func startBGPLabWith(t *testing.T, o BGPOptions) *Lab {
	t.Helper()
	testenv.RequireRoot(t, "network namespaces, XDP, FRR")
	if _, err := os.Stat(filepath.Join(frr.Dir, "bgpd")); err != nil {
		testenv.Unavailable(t, "FRR is not installed (%v); hack/deps.sh installs it", err)
	}
	o.T = t
	return startLabWith(t, Options{Portico: porticoBin, BGP: &o})
}
