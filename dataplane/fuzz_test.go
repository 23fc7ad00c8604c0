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
	// UDP datagrams another edge walked here, and one to be served.
	for _, mk := range []func(uint16) xdptest.Packet{udp4, udp6} {
		f.Add(withMACs(withUDPMark(mk(41000).Bytes(), 2), r1MAC, nicMAC))
		f.Add(withMACs(withUDPMark(mk(41001).Bytes(), 15), r1MAC, nicMAC))
	}
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
			// another edge, or bits a client set there), or a UDP walk's
			// (bpf/encap.h).
			if !bytes.Equal(out, in) && !bytes.Equal(out, xdptest.WithTCPMark(in, 0)) && !(bytes.Equal(out[:12], in[:12]) && sameButUDPMark(t, in[12:], out[12:])) {
				t.Fatalf("XDP_PASS changed the frame:\nin  %x\nout %x", in, out)
			}
		case xdptest.TX:
			// Besides the MACs, only the hand-off mark of a TCP frame may
			// change (a director clears what a client set there), or a UDP
			// walk's.
			m, _ := xdptest.TCPMark(out)
			if len(out) != len(in) || !bytes.Equal(out[12:], xdptest.WithTCPMark(in, m)[12:]) && !sameButUDPMark(t, in[12:], out[12:]) {
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

// sameButUDPMark reports whether two frames (from their EtherType on) are one
// UDP datagram but for where a UDP walk's mark and tag go (bpf/encap.h): in
// IPv4 the identification, the reserved flag and the header checksum, which
// must stay right if it was; in IPv6 the flow label.
func sameButUDPMark(t *testing.T, in, out []byte) bool {
	t.Helper()
	if len(in) != len(out) || len(in) < 2 {
		return false
	}
	a, b := bytes.Clone(in), bytes.Clone(out)
	switch {
	case a[0] == 0x08 && a[1] == 0x00 && len(a) >= 2+20 && a[2] == 0x45 && a[2+9] == 17:
		if ipv4Checksum(in[2:22]) == 0 && ipv4Checksum(out[2:22]) != 0 {
			t.Errorf("the IPv4 header checksum went wrong:\nin  %x\nout %x", in, out)
		}
		for _, i := range []int{2 + 4, 2 + 5, 2 + 10, 2 + 11} {
			a[i], b[i] = 0, 0
		}
		a[2+6] &^= 0x80
		b[2+6] &^= 0x80
	case a[0] == 0x86 && a[1] == 0xdd && len(a) >= 2+40 && a[2+6] == 17:
		a[2+1] &^= 0x0f
		b[2+1] &^= 0x0f
		for _, i := range []int{2 + 2, 2 + 3} {
			a[i], b[i] = 0, 0
		}
	default:
		return false
	}
	return bytes.Equal(a, b)
}
