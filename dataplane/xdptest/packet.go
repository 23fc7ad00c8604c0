// Package xdptest builds the frames that xdp_lb's fixtures, fuzz target and
// benchmarks feed through BPF_PROG_TEST_RUN, and runs them. Frames are assembled
// field by field here, independently of the program, so an expected output packet
// is written by hand, not derived from what the program did. The portico binary
// links it (portico bench xdp), so it never imports package testing; tests skip
// without privileges through bpftest.
package xdptest

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// IP protocol numbers.
const (
	ICMP   = 1
	TCP    = 6
	UDP    = 17
	ICMPv6 = 58
)

// TCP flags.
const (
	FIN = 0x01
	SYN = 0x02
	RST = 0x04
	PSH = 0x08
	ACK = 0x10
)

// Packet describes one Ethernet frame carrying IPv4 or IPv6 with TCP or UDP.
type Packet struct {
	SrcMAC, DstMAC net.HardwareAddr
	Src, Dst       netip.Addr // IPv4 or IPv6, both the same family
	Proto          uint8      // TCP or UDP
	SPort, DPort   uint16
	Flags          uint8  // TCP flags
	Ack            uint32 // TCP acknowledgment number with ACK (2000 when 0)
	Payload        []byte // L4 payload
	IPOptions      []byte // IPv4 options, a multiple of 4 bytes
	FragOffset     uint16 // IPv4 fragment offset in 8-byte units
	MoreFragments  bool
}

// Bytes returns the frame.
func (p Packet) Bytes() []byte {
	l4 := p.l4()
	if p.Src.Is4() {
		return ether(p.DstMAC, p.SrcMAC, 0x0800, ipv4(p.Src, p.Dst, p.Proto, p.IPOptions, p.FragOffset, p.MoreFragments, l4))
	}
	return ether(p.DstMAC, p.SrcMAC, 0x86dd, ipv6(p.Src, p.Dst, p.Proto, l4))
}

// IP returns the packet without its Ethernet header (what an ICMP error quotes).
func (p Packet) IP() []byte { return p.Bytes()[14:] }

// WithMACs returns a copy of p with other Ethernet addresses.
func (p Packet) WithMACs(src, dst net.HardwareAddr) Packet {
	p.SrcMAC, p.DstMAC = src, dst
	return p
}

func (p Packet) l4() []byte {
	var h []byte
	switch p.Proto {
	case TCP:
		h = make([]byte, 20)
		binary.BigEndian.PutUint16(h[0:], p.SPort)
		binary.BigEndian.PutUint16(h[2:], p.DPort)
		binary.BigEndian.PutUint32(h[4:], 1000) // sequence number
		if p.Flags&ACK != 0 {
			ack := p.Ack
			if ack == 0 {
				ack = 2000
			}
			binary.BigEndian.PutUint32(h[8:], ack)
		}
		h[12] = 5 << 4
		h[13] = p.Flags
		binary.BigEndian.PutUint16(h[14:], 65535) // window
	case UDP:
		h = make([]byte, 8)
		binary.BigEndian.PutUint16(h[0:], p.SPort)
		binary.BigEndian.PutUint16(h[2:], p.DPort)
		binary.BigEndian.PutUint16(h[4:], uint16(8+len(p.Payload)))
	default:
		h = nil
	}
	seg := append(h, p.Payload...)
	if p.Proto == TCP || p.Proto == UDP {
		off := 16
		if p.Proto == UDP {
			off = 6
		}
		binary.BigEndian.PutUint16(seg[off:], l4Checksum(p.Src, p.Dst, p.Proto, seg))
	}
	return seg
}

// ICMPError builds an ICMPv4 (type 3, 11) or ICMPv6 (type 1, 2, 3) error from src
// to dst quoting the start of quoted's IP packet. mtu goes in the PTB/frag-needed
// field.
func ICMPError(srcMAC, dstMAC net.HardwareAddr, src, dst netip.Addr, typ, code uint8, mtu uint32, quoted []byte) []byte {
	body := make([]byte, 8, 8+len(quoted))
	body[0], body[1] = typ, code
	body = append(body, quoted...)
	if src.Is4() {
		binary.BigEndian.PutUint16(body[6:], uint16(mtu))
		binary.BigEndian.PutUint16(body[2:], checksum(body, 0))
		return ether(dstMAC, srcMAC, 0x0800, ipv4(src, dst, ICMP, nil, 0, false, body))
	}
	binary.BigEndian.PutUint32(body[4:], mtu)
	binary.BigEndian.PutUint16(body[2:], l4Checksum(src, dst, ICMPv6, body))
	return ether(dstMAC, srcMAC, 0x86dd, ipv6(src, dst, ICMPv6, body))
}

// ICMPEcho builds an echo request (IPv4 or IPv6).
func ICMPEcho(srcMAC, dstMAC net.HardwareAddr, src, dst netip.Addr) []byte {
	body := []byte{8, 0, 0, 0, 0, 1, 0, 1, 'p', 'i', 'n', 'g'}
	if src.Is4() {
		binary.BigEndian.PutUint16(body[2:], checksum(body, 0))
		return ether(dstMAC, srcMAC, 0x0800, ipv4(src, dst, ICMP, nil, 0, false, body))
	}
	body[0] = 128
	binary.BigEndian.PutUint16(body[2:], l4Checksum(src, dst, ICMPv6, body))
	return ether(dstMAC, srcMAC, 0x86dd, ipv6(src, dst, ICMPv6, body))
}

// ARPRequest builds a who-has for target from sender.
func ARPRequest(srcMAC net.HardwareAddr, sender, target netip.Addr) []byte {
	b := make([]byte, 28)
	binary.BigEndian.PutUint16(b[0:], 1)      // Ethernet
	binary.BigEndian.PutUint16(b[2:], 0x0800) // IPv4
	b[4], b[5] = 6, 4
	binary.BigEndian.PutUint16(b[6:], 1) // request
	copy(b[8:], srcMAC)
	s, t := sender.As4(), target.As4()
	copy(b[14:], s[:])
	copy(b[24:], t[:])
	return ether(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, srcMAC, 0x0806, b)
}

func ether(dst, src net.HardwareAddr, typ uint16, payload []byte) []byte {
	b := make([]byte, 14, 14+len(payload))
	copy(b[0:6], dst)
	copy(b[6:12], src)
	binary.BigEndian.PutUint16(b[12:], typ)
	return append(b, payload...)
}

func ipv4(src, dst netip.Addr, proto uint8, options []byte, fragOff uint16, mf bool, payload []byte) []byte {
	hl := 20 + len(options)
	b := make([]byte, hl, hl+len(payload))
	b[0] = 0x40 | byte(hl/4)
	binary.BigEndian.PutUint16(b[2:], uint16(hl+len(payload)))
	binary.BigEndian.PutUint16(b[4:], 0x1234) // id
	frag := fragOff & 0x1fff
	if mf {
		frag |= 0x2000
	}
	if frag == 0 {
		frag = 0x4000 // DF
	}
	binary.BigEndian.PutUint16(b[6:], frag)
	b[8] = 64
	b[9] = proto
	s, d := src.As4(), dst.As4()
	copy(b[12:], s[:])
	copy(b[16:], d[:])
	copy(b[20:], options)
	binary.BigEndian.PutUint16(b[10:], checksum(b, 0))
	return append(b, payload...)
}

func ipv6(src, dst netip.Addr, next uint8, payload []byte) []byte {
	b := make([]byte, 40, 40+len(payload))
	b[0] = 0x60
	binary.BigEndian.PutUint16(b[4:], uint16(len(payload)))
	b[6] = next
	b[7] = 64
	s, d := src.As16(), dst.As16()
	copy(b[8:], s[:])
	copy(b[24:], d[:])
	return append(b, payload...)
}

func l4Checksum(src, dst netip.Addr, proto uint8, seg []byte) uint16 {
	var sum uint32
	var pseudo []byte
	if src.Is4() {
		s, d := src.As4(), dst.As4()
		pseudo = append(append(append(pseudo, s[:]...), d[:]...), 0, proto, byte(len(seg)>>8), byte(len(seg)))
	} else {
		s, d := src.As16(), dst.As16()
		pseudo = append(append(pseudo, s[:]...), d[:]...)
		pseudo = binary.BigEndian.AppendUint32(pseudo, uint32(len(seg)))
		pseudo = append(pseudo, 0, 0, 0, proto)
	}
	sum = partial(pseudo, 0)
	c := checksum(seg, sum)
	if c == 0 && proto == UDP {
		c = 0xffff
	}
	return c
}

func partial(b []byte, sum uint32) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	return sum
}

func checksum(b []byte, initial uint32) uint16 {
	sum := partial(b, initial)
	for sum>>16 != 0 {
		sum = (sum & 0xffff) + sum>>16
	}
	return ^uint16(sum)
}

// tcpOffset is where the TCP header of an IPv4 or IPv6 TCP frame begins, or -1.
func tcpOffset(frame []byte) int {
	if len(frame) < 14 {
		return -1
	}
	off := -1
	switch binary.BigEndian.Uint16(frame[12:]) {
	case 0x0800:
		if len(frame) >= 34 && frame[23] == TCP {
			off = 14 + int(frame[14]&0x0f)*4
		}
	case 0x86dd:
		if len(frame) >= 54 && frame[20] == TCP {
			off = 54
		}
	}
	if off < 0 || len(frame) < off+20 {
		return -1
	}
	return off
}

// markFinal is the mark of a frame an edge is to serve (LB_MARK_FINAL).
const markFinal = 255

// TCPMark is the hand-off mark edges write into a TCP frame they hand to each
// other, and whether frame is TCP: 0 for none; the receiver's place in the
// flow's chain plus one, with the hand-offs so far in the next 4 bits and the
// walk's downs (a filter of the replicas its edges call down) in the 4 above
// them (reserved bits 001, the mark in the urgent pointer; 011 and MarkTagged:
// the director's tag in the IP header); or 255 (to be served: reserved bits
// 111, or a mark that names no place).
func TCPMark(frame []byte) (int, bool) {
	off := tcpOffset(frame)
	if off < 0 {
		return 0, false
	}
	bits, hops, place := int(frame[off+12]&0x0e)>>1, int(frame[off+18]), int(frame[off+19])
	switch {
	case bits == 0:
		return 0, true
	case (bits != 1 && bits != 3) || place == 0 || place > 16 || hops&0x0f > 8:
		return markFinal, true
	case bits == 3:
		return MarkTagged | hops<<8 | place, true
	}
	return hops<<8 | place, true
}

// WithTCPMark is a copy of a TCP frame with its hand-off mark set to mark (0
// clears it, 255 asks to serve it) and its TCP checksum updated for it (RFC
// 1624), as an edge writes it; other frames are returned as they are.
func WithTCPMark(frame []byte, mark int) []byte {
	out := append([]byte(nil), frame...)
	off := tcpOffset(out)
	if off < 0 {
		return out
	}
	oldW, oldU := binary.BigEndian.Uint16(out[off+12:]), binary.BigEndian.Uint16(out[off+18:])
	newW, newU := oldW&^0x0e00, oldU
	// A class the frame carried (hand-off bits, no URG) is in its urgent
	// pointer: an edge clears it before it marks the frame anew.
	carried := (oldW&0x0e00 == 0x0200 || oldW&0x0e00 == 0x0600) && out[off+13]&0x20 == 0
	switch {
	case mark == markFinal:
		newW |= 0x0e00
		if carried {
			newU = 0
		}
	case mark != 0:
		newW |= 0x0200
		if mark&MarkTagged != 0 {
			newW |= 0x0600
		}
		newU = uint16(mark)
	case carried:
		newU = 0
	}
	sum := binary.BigEndian.Uint16(out[off+16:])
	sum = csum16(csum16(sum, oldW, newW), oldU, newU)
	binary.BigEndian.PutUint16(out[off+12:], newW)
	binary.BigEndian.PutUint16(out[off+18:], newU)
	binary.BigEndian.PutUint16(out[off+16:], sum)
	return out
}

// MarkTagged, in a mark given to WithTCPMark, says the frame carries its
// director's tag in the IP header (WithTag).
const MarkTagged = 1 << 16

// WithTag returns a copy of an IPv4 or IPv6 frame with tag where xdp_lb's walk
// carries its director's: the IPv4 identification (the header checksum kept
// right) or the low 16 bits of the IPv6 flow label.
func WithTag(frame []byte, tag uint16) []byte {
	out := append([]byte(nil), frame...)
	if len(out) < 14+40 {
		return out
	}
	switch binary.BigEndian.Uint16(out[12:]) {
	case 0x0800:
		old := binary.BigEndian.Uint16(out[14+4:])
		binary.BigEndian.PutUint16(out[14+10:], csum16(binary.BigEndian.Uint16(out[14+10:]), old, tag))
		binary.BigEndian.PutUint16(out[14+4:], tag)
	case 0x86dd:
		binary.BigEndian.PutUint16(out[14+2:], tag)
	}
	return out
}

// csum16 updates an Internet checksum for a 16-bit word changed (RFC 1624).
func csum16(check, old, new uint16) uint16 {
	if old == new {
		return check
	}
	sum := uint32(^check) + uint32(^old) + uint32(new)
	sum = sum&0xffff + sum>>16
	sum = sum&0xffff + sum>>16
	return ^uint16(sum)
}

// TCPChecksumOK reports whether a TCP frame's checksum is right (true for
// frames that are not TCP).
func TCPChecksumOK(frame []byte) bool {
	off := tcpOffset(frame)
	if off < 0 {
		return true
	}
	var src, dst netip.Addr
	var seg []byte
	if frame[12] == 0x08 {
		src = netip.AddrFrom4([4]byte(frame[26:30]))
		dst = netip.AddrFrom4([4]byte(frame[30:34]))
		seg = frame[off : 14+int(binary.BigEndian.Uint16(frame[16:]))]
	} else {
		src = netip.AddrFrom16([16]byte(frame[22:38]))
		dst = netip.AddrFrom16([16]byte(frame[38:54]))
		seg = frame[off : 54+int(binary.BigEndian.Uint16(frame[18:]))]
	}
	return l4Checksum(src, dst, TCP, seg) == 0
}
