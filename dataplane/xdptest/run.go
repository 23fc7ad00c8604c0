package xdptest

import (
	"fmt"

	"github.com/cilium/ebpf"
)

// XDP verdicts, by name.
const (
	Aborted = 0
	Drop    = 1
	Pass    = 2
	TX      = 3
	Redir   = 4
)

// VerdictName names an XDP return code.
func VerdictName(v uint32) string {
	switch v {
	case Aborted:
		return "XDP_ABORTED"
	case Drop:
		return "XDP_DROP"
	case Pass:
		return "XDP_PASS"
	case TX:
		return "XDP_TX"
	case Redir:
		return "XDP_REDIRECT"
	}
	return fmt.Sprintf("verdict(%d)", v)
}

// Run runs prog once on frame with BPF_PROG_TEST_RUN and returns the verdict and
// the frame as the program left it.
func Run(prog *ebpf.Program, frame []byte) (uint32, []byte, error) {
	opts := ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256), Repeat: 1}
	ret, err := prog.Run(&opts)
	if err != nil {
		return 0, nil, err
	}
	return ret, opts.DataOut, nil
}
