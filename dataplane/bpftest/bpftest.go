// Package bpftest gates the tests that load BPF programs: they skip where the
// process may not, and fail under CI, where they must run. It is apart from
// xdptest, whose frames and runner the portico binary links (portico bench xdp),
// so that the binary never links package testing.
package bpftest

import (
	"errors"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"

	"github.com/portico-edge/portico/test/testenv"
)

// Require skips t unless the process can load BPF programs (root or
// CAP_BPF+CAP_NET_ADMIN). Under CI, where the tests run as root, a missing
// capability is a failure instead.
func Require(t testing.TB) {
	t.Helper()
	testenv.RequireRoot(t, "loading BPF programs")
	if err := rlimit.RemoveMemlock(); err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
		t.Fatalf("remove memlock rlimit: %v", err)
	}
}
