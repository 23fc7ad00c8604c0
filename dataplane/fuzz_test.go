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
// input only in the two MAC addresses, which are a backend's and the NIC's; a
// dropped one went to a port its VIP does not serve, or was walked along a chain.
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
	// A frame walked along a chain, marked with a place.
	f.Add(xdptest.WithTCPMark(tcp4(40000, xdptest.ACK).Bytes(), 1<<8|2))
	backendMACs := map[string]bool{r1MAC.String(): true, r2MAC.String(): true}
	f.Fuzz(func(t *testing.T, frame []byte) {
		if len(frame) < 14 || len(frame) > 1514 {
			return // BPF_PROG_TEST_RUN wants an Ethernet header and one page at most
		}
		in := bytes.Clone(frame)
		before := closedCount(t, d)
		verdict, out, err := xdptest.Run(d.Program(), frame)
		if err != nil {
			t.Fatalf("run: %v", err)
		}
		closed := closedCount(t, d) > before
		switch verdict {
		case xdptest.Pass:
			// Only the hand-off mark of a TCP frame may be cleared (one from
			// another edge, or bits a client set there).
			if !bytes.Equal(out, in) && !bytes.Equal(out, xdptest.WithTCPMark(in, 0)) {
				t.Fatalf("XDP_PASS changed the frame:\nin  %x\nout %x", in, out)
			}
		case xdptest.TX:
			// Besides the MACs, only the hand-off mark of a TCP frame may
			// change (a director clears what a client set there).
			m, _ := xdptest.TCPMark(out)
			if len(out) != len(in) || !bytes.Equal(out[12:], xdptest.WithTCPMark(in, m)[12:]) {
				t.Fatalf("XDP_TX changed more than the MACs and the mark:\nin  %x\nout %x", in, out)
			}
			if dst := net.HardwareAddr(out[0:6]).String(); !backendMACs[dst] {
				t.Fatalf("XDP_TX to %s, not a backend's MAC", dst)
			}
			if !bytes.Equal(out[6:12], nicMAC) {
				t.Fatalf("XDP_TX from %s, not the NIC's MAC", net.HardwareAddr(out[6:12]))
			}
		case xdptest.Drop:
			// Only a frame to a port a VIP does not serve, and a frame
			// walked along a chain (marked with a place) that this node has
			// no connection for, and whose rings give no chain for it, are
			// dropped (TCP sends the latter again).
			if m, _ := xdptest.TCPMark(in); !closed && (m == 0 || m == 255) {
				t.Fatalf("XDP_DROP of a frame without a hand-off place: %x", in)
			}
		default:
			t.Fatalf("verdict %s on %x", xdptest.VerdictName(verdict), in)
		}
	})
}

// closedCount reads the vip_closed counter alone (every counter, read around
// each frame, halved the fuzzer's speed).
func closedCount(t *testing.T, d *Dataplane) uint64 {
	t.Helper()
	var per []uint64
	if err := d.objs.ReasonStats.Lookup(rVIPClosed, &per); err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n
}
