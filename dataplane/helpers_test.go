package dataplane

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/portico-edge/portico/dataplane/bpftest"
	"github.com/portico-edge/portico/dataplane/xdptest"
)

// loadForTest loads xdp_lb with small maps pinned in a directory of its own,
// uninstalled when the test ends.
func loadForTest(t testing.TB) *Dataplane {
	t.Helper()
	return loadWith(t, Options{RingSize: testRing, FlowEntries: 4096})
}

// loadWith is loadForTest with opts (its PinPath is set here).
func loadWith(t testing.TB, opts Options) *Dataplane {
	t.Helper()
	bpftest.Require(t)
	opts.PinPath = testPinPath()
	// Registered before Load: a load that fails (the verifier refuses the
	// program) has pinned maps already, and they go too.
	t.Cleanup(func() {
		if err := Uninstall(opts.PinPath); err != nil {
			t.Errorf("uninstall: %v", err)
		}
	})
	d, err := Load(opts)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// testPinPath is a fresh pin directory for one test's maps.
func testPinPath() string { return fmt.Sprintf("/sys/fs/bpf/portico-test-%08x", rand.Uint32()) }

// onOneCPU keeps the test on one CPU until the returned function is called:
// BPF_PROG_TEST_RUN runs on the caller's CPU, and xdp_lb keeps per-CPU state.
func onOneCPU(t *testing.T) func() {
	t.Helper()
	runtime.LockOSThread()
	var was, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &was); err != nil {
		t.Fatalf("get CPU affinity: %v", err)
	}
	cpu := 0
	for !was.IsSet(cpu) {
		cpu++
	}
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatalf("set CPU affinity: %v", err)
	}
	return func() {
		if err := unix.SchedSetaffinity(0, &was); err != nil {
			t.Errorf("restore CPU affinity: %v", err)
		}
		runtime.UnlockOSThread()
	}
}

// pinOf is the path of the pin of map name that d loaded.
func pinOf(t testing.TB, d *Dataplane, name string) string {
	t.Helper()
	for _, r := range d.PinnedMaps() {
		if r.Map == name {
			return r.To
		}
	}
	t.Fatalf("map %s is not pinned", name)
	return ""
}

// runCounted runs a frame through d's program once and returns its verdict,
// the frame it leaves, and by how much each reason counter grew.
func runCounted(t *testing.T, d *Dataplane, in []byte) (uint32, []byte, map[int]uint64) {
	t.Helper()
	before, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	verdict, out, err := xdptest.Run(d.Program(), in)
	if err != nil {
		t.Fatal(err)
	}
	after, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	delta := map[int]uint64{}
	for r := range after.Reasons {
		if n := after.Reasons[r] - before.Reasons[r]; n > 0 {
			delta[r] = n
		}
	}
	return verdict, out, delta
}
