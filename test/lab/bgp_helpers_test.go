package lab

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/portico-edge/portico/test/frr"
	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
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
		testenv.Unavailable(t, "FRR is not installed (%v); test/setup/deps.sh installs it", err)
	}
	o.T = t
	return startLabWith(t, Options{Portico: porticoBin, BGP: &o})
}

// checkKeepConns sends a request on every held connection: how many answered, of
// how many, and the failures.
func checkKeepConns(held traffic.KeepConns, path string) (kept, total int, failed []string) {
	for _, k := range held {
		total++
		if _, err := k.Do("echo.lab", path, 3*time.Second); err == nil {
			kept++
		} else {
			failed = append(failed, k.Edge+": "+err.Error())
		}
	}
	return kept, total, failed
}
