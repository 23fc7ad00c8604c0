package dataplane

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/portico-edge/portico/dataplane/bpftest"
)

// loadForTest loads xdp_lb with small maps pinned in a directory of its own,
// uninstalled when the test ends.
func loadForTest(t testing.TB) *Dataplane {
	t.Helper()
	bpftest.Require(t)
	pin := testPinPath()
	d, err := Load(Options{PinPath: pin, RingSize: testRing, FlowEntries: 4096})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() {
		d.Close()
		if err := Uninstall(pin); err != nil {
			t.Errorf("uninstall: %v", err)
		}
	})
	return d
}

// testPinPath is a fresh pin directory for one test's maps.
func testPinPath() string { return fmt.Sprintf("/sys/fs/bpf/portico-test-%08x", rand.Uint32()) }
