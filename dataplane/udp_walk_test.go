package dataplane

import (
	"encoding/binary"
	"testing"

	"github.com/portico-edge/portico/dataplane/xdptest"
)

// udpMarkOf reads a UDP frame's walk mark (bpf/encap.h): IPv4, the reserved
// flag with the identification's top 4 bits; IPv6, the flow label's top 4
// bits. ok is false for an IPv4 frame without the reserved flag.
func udpMarkOf(frame []byte) (mark int, ok bool) {
	if binary.BigEndian.Uint16(frame[12:]) == 0x0800 {
		return int(frame[14+4] >> 4), frame[14+6]&0x80 != 0
	}
	return int(frame[14+1] & 0x0f), true
}

// withUDPMark writes a UDP walk's mark into a frame as an edge does.
func withUDPMark(frame []byte, mark int) []byte {
	out := append([]byte(nil), frame...)
	if binary.BigEndian.Uint16(out[12:]) == 0x0800 {
		out[14+4] = out[14+4]&0x0f | byte(mark)<<4
		out[14+6] |= 0x80
		binary.BigEndian.PutUint16(out[14+10:], 0)
		binary.BigEndian.PutUint16(out[14+10:], ipv4Checksum(out[14:34]))
		return out
	}
	out[14+1] = out[14+1]&0xf0 | byte(mark)
	return out
}

// TestUDPWalk: in a transition a UDP datagram of a moved slot is walked along
// its chain as a TCP packet is, its mark in the IP header (UDP has no bits a
// stack ignores): the replica that served the flow (udp_seen) keeps it, one
// that did not sends it on with one hand-off more, the chain's end sends it to
// the current ring's replica to be served there (a new flow), and every
// receiver clears the mark before its stack sees the frame. An IPv4 mark from
// no peer (a new peer's, or a stranger's: no client sets the reserved flag)
// buys one hand-off at most; an IPv6 client's flow label is no mark.
func TestUDPWalk(t *testing.T) {
	defer onOneCPU(t)()
	for _, fam := range []struct {
		name string
		mk   func(uint16) xdptest.Packet
	}{{"v4", udp4}, {"v6", udp6}} {
		t.Run(fam.name, func(t *testing.T) {
			d := loadForTest(t)
			must(t, d.SetMAC(nicMAC))
			if _, err := d.Apply(desired(r1)); err != nil {
				t.Fatal(err)
			}
			// A flow whose slot moves from r1 to r2: its chain names both.
			p := fam.mk(sportFor(t, fam.mk, r2, r1, r2))
			if _, err := d.Apply(desired(r1, r2)); err != nil {
				t.Fatal(err)
			}
			run := func(_ string, in []byte) (uint32, []byte, map[int]uint64) {
				t.Helper()
				return runCounted(t, d, in)
			}
			intact := func(what string, got []byte) {
				t.Helper()
				if !pccIntact(got, p.WithMACs(nicMAC, nicMAC).Bytes()) {
					t.Errorf("%s: the stack gets\n% x\nwant the client's datagram\n% x", what, got[12:], p.Bytes()[12:])
				}
				if m, ok := udpMarkOf(got); got[12] == 0x08 && ok || got[12] == 0x86 && m != 0 {
					t.Errorf("%s: the mark (%d) is left in the frame", what, m)
				}
			}

			// The director: the first replica of the chain (r1, the lower
			// address) is asked, walked (one hand-off).
			verdict, out, _ := run("the director", p.Bytes())
			if m, ok := udpMarkOf(out); verdict != xdptest.TX || !macIs(out, r1MAC) || !ok || m != 1 {
				t.Fatalf("the director: %s to %x, mark %d (%v), want TX to r1 walked (mark 1)", xdptest.VerdictName(verdict), out[:6], m, ok)
			}
			if out[12] == 0x08 && ipv4Checksum(out[14:34]) != 0 {
				t.Fatalf("the director: IPv4 header checksum wrong after the mark")
			}
			// r1 did not serve it: on to r2, one hand-off more.
			verdict, out2, _ := run("a peer without the flow", withMACs(out, r1MAC, nicMAC))
			if m, _ := udpMarkOf(out2); verdict != xdptest.TX || !macIs(out2, r2MAC) || m != 2 {
				t.Fatalf("a peer without the flow: %s to %x, mark %d, want TX to r2 with mark 2", xdptest.VerdictName(verdict), out2[:6], m)
			}
			// No hand-off left (or nothing above): the current ring's
			// replica (r2) serves it, a new flow.
			verdict, out3, reasons := run("the walk's end", withMACs(withUDPMark(p.Bytes(), 6), r1MAC, nicMAC))
			if m, _ := udpMarkOf(out3); verdict != xdptest.TX || !macIs(out3, r2MAC) || m != 15 || reasons[int(lbReasonREASON_UDP_NEW)] != 1 {
				t.Fatalf("the walk's end: %s to %x, mark %d, reasons %v, want TX to r2 to be served (mark 15, udp_new)", xdptest.VerdictName(verdict), out3[:6], m, reasons)
			}
			// "Serve it": served here, unmarked, and it is this node's now.
			verdict, got, _ := run("a frame to be served", withMACs(withUDPMark(p.Bytes(), 15), r2MAC, nicMAC))
			if verdict != xdptest.Pass {
				t.Fatalf("a frame to be served: %s, want PASS", xdptest.VerdictName(verdict))
			}
			intact("a frame to be served", got)
			// Now seen here: a walked frame of it stays.
			verdict, got, _ = run("a walked frame of a flow served here", withMACs(withUDPMark(p.Bytes(), 1), r1MAC, nicMAC))
			if verdict != xdptest.Pass {
				t.Fatalf("a walked frame of a flow served here: %s, want PASS", xdptest.VerdictName(verdict))
			}
			intact("a walked frame of a flow served here", got)

			q := fam.mk(sportFrom(t, p.SPort+1, fam.mk, r2, r1, r2))
			verdict, out, reasons = run("a stranger's mark", withUDPMark(q.Bytes(), 2))
			if fam.name == "v4" {
				// The reserved flag, which no client sets: a new peer's
				// walk (or a stranger's), one hand-off at most: to the
				// current ring's replica, to be served.
				if m, _ := udpMarkOf(out); reasons[int(lbReasonREASON_STRANGER_MARK)] != 1 || verdict != xdptest.TX || m != 15 || !macIs(out, r2MAC) {
					t.Fatalf("a stranger's IPv4 mark: %s to %x mark %d, reasons %v, want one stranger_mark and TX to r2 to be served (mark 15)", xdptest.VerdictName(verdict), out[:6], m, reasons)
				}
			} else {
				// A client's flow label (its tag names no edge this node
				// knows): steered as any datagram, the director's own
				// mark written over it.
				if m, _ := udpMarkOf(out); reasons[int(lbReasonREASON_STRANGER_MARK)] != 0 || verdict != xdptest.TX || m != 1 {
					t.Fatalf("an IPv6 client's flow label: %s mark %d, reasons %v, want TX walked by the director (mark 1)", xdptest.VerdictName(verdict), m, reasons)
				}
			}
			// A datagram of a slot that did not move goes to its ring's
			// replica: an IPv4 stranger's mark to be served there, an
			// IPv6 client's flow label with no mark.
			r := fam.mk(sportFrom(t, q.SPort+1, fam.mk, r1, r1, r2))
			verdict, out, _ = run("a stranger's mark bits, unmoved slot", withUDPMark(r.Bytes(), 3))
			want := map[string]int{"v4": 15, "v6": 0}[fam.name]
			if m, _ := udpMarkOf(out); verdict != xdptest.TX || !macIs(out, r1MAC) || m != want {
				t.Fatalf("a stranger's mark bits in an unmoved slot: %s to %x mark %d, want TX to r1 with mark %d", xdptest.VerdictName(verdict), out[:6], m, want)
			}
		})
	}
}

func macIs(frame []byte, mac []byte) bool { return string(frame[:6]) == string(mac) }
