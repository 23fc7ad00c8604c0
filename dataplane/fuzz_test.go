package dataplane

import (
	"bytes"
	"net"
	"testing"

	"github.com/portico-edge/portico/dataplane/xdptest"
)

// FuzzXDP feeds arbitrary frames to xdp_lb, seeded with every fixture's input,
// and checks its promises: never XDP_ABORTED (nor anything but PASS or TX); a
// passed frame is byte-identical, or a hand-off from another edge with only its
// mark cleared (and the IPv4 checksum with it); a transmitted frame differs from its
// input only in the two MAC addresses, which are a backend's and the NIC's.
func FuzzXDP(f *testing.F) {
	d := loadForTest(f)
	if err := d.SetMAC(nicMAC); err != nil {
		f.Fatal(err)
	}
	// A state with remote, local and draining backends on both VIPs.
	if _, err := d.Apply(desired(r1, draining(r2), r3)); err != nil {
		f.Fatal(err)
	}
	for _, fx := range fixtures() {
		for _, s := range fx.steps(f) {
			f.Add(s.in)
		}
	}
	backendMACs := map[string]bool{r1MAC.String(): true, r2MAC.String(): true}
	f.Fuzz(func(t *testing.T, frame []byte) {
		if len(frame) < 14 || len(frame) > 1514 {
			return // BPF_PROG_TEST_RUN wants an Ethernet header and one page at most
		}
		in := bytes.Clone(frame)
		verdict, out, err := xdptest.Run(d.Program(), frame)
		if err != nil {
			t.Fatalf("run: %v", err)
		}
		switch verdict {
		case xdptest.Pass:
			// A frame from another edge may have been handed off: then only its
			// mark is cleared (if it was one xdp_lb steers at all).
			if !bytes.Equal(out, in) && !(handedOff(in, backendMACs) && bytes.Equal(out, unmarked(in))) {
				t.Fatalf("XDP_PASS changed the frame:\nin  %x\nout %x", in, out)
			}
		case xdptest.TX:
			if len(out) != len(in) || !bytes.Equal(out[12:], in[12:]) {
				t.Fatalf("XDP_TX changed more than the MACs:\nin  %x\nout %x", in, out)
			}
			if dst := net.HardwareAddr(out[0:6]).String(); !backendMACs[dst] {
				t.Fatalf("XDP_TX to %s, not a backend's MAC", dst)
			}
			if !bytes.Equal(out[6:12], nicMAC) {
				t.Fatalf("XDP_TX from %s, not the NIC's MAC", net.HardwareAddr(out[6:12]))
			}
		default:
			t.Fatalf("verdict %s on %x", xdptest.VerdictName(verdict), in)
		}
	})
}

// handedOff reports whether frame is an IPv4 frame from another edge (one of
// peers) with the hand-off mark (the reserved flag bit) set.
func handedOff(frame []byte, peers map[string]bool) bool {
	return len(frame) >= 34 && frame[12] == 0x08 && frame[13] == 0x00 &&
		peers[net.HardwareAddr(frame[6:12]).String()] && frame[20]&0x80 != 0
}

// unmarked is frame with the hand-off mark cleared and the IPv4 header checksum
// updated for it (RFC 1624), as the receiving edge passes it on.
func unmarked(frame []byte) []byte {
	out := bytes.Clone(frame)
	old := uint32(out[20])<<8 | uint32(out[21])
	out[20] &^= 0x80
	nw := uint32(out[20])<<8 | uint32(out[21])
	sum := uint32(^(uint16(out[24])<<8 | uint16(out[25]))) + uint32(^uint16(old)) + nw
	sum = sum&0xffff + sum>>16
	sum = sum&0xffff + sum>>16
	c := ^uint16(sum)
	out[24], out[25] = byte(c>>8), byte(c)
	return out
}
