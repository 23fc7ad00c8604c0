package dataplane

import (
	"net"
	"net/netip"
	"slices"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/dataplane/xdptest"
)

// The fixtures' world: a client, an edge node running xdp_lb (nicMAC), and three
// replicas, r3 being the edge node itself.
var (
	clientMAC = mustMAC("02:00:00:00:00:01")
	nicMAC    = mustMAC("02:00:00:00:00:0e")
	r1MAC     = mustMAC("02:00:00:00:01:01")
	r2MAC     = mustMAC("02:00:00:00:01:02")

	vip4    = netip.MustParseAddr("192.0.2.10")
	vip6    = netip.MustParseAddr("2001:db8::10")
	other4  = netip.MustParseAddr("192.0.2.99")
	client4 = netip.MustParseAddr("198.51.100.7")
	client6 = netip.MustParseAddr("2001:db8:1::7")
	router4 = netip.MustParseAddr("198.51.100.1")
	router6 = netip.MustParseAddr("2001:db8:1::1")

	r1 = Backend{Addr: netip.MustParseAddr("10.0.0.11"), MAC: r1MAC}
	r2 = Backend{Addr: netip.MustParseAddr("10.0.0.12"), MAC: r2MAC}
	r3 = Backend{Addr: netip.MustParseAddr("10.0.0.13"), Local: true}
)

const (
	testSeed = 0x5eed
	testRing = 251
)

func mustMAC(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

func draining(b Backend) Backend { b.Draining = true; return b }

func down(b Backend) Backend { b.Down = true; return b }

// desired is one group serving vip4 and vip6 on TCP 80 and UDP 53.
func desired(bs ...Backend) Desired {
	return Desired{Seed: testSeed, Groups: []Group{{
		Name:     "edge/web",
		VIPs:     []netip.Addr{vip4, vip6},
		Ports:    []model.Port{{Protocol: model.TCP, Port: 80}, {Protocol: model.UDP, Port: 53}},
		Backends: bs,
	}}}
}

// tcp4 is a client's TCP segment to the v4 VIP on port 80.
func tcp4(sport uint16, flags uint8) xdptest.Packet {
	return xdptest.Packet{SrcMAC: clientMAC, DstMAC: nicMAC, Src: client4, Dst: vip4, Proto: xdptest.TCP,
		SPort: sport, DPort: 80, Flags: flags, Payload: []byte("GET / HTTP/1.1\r\n\r\n")}
}

func tcp6(sport uint16, flags uint8) xdptest.Packet {
	p := tcp4(sport, flags)
	p.Src, p.Dst = client6, vip6
	return p
}

func udp4(sport uint16) xdptest.Packet {
	return xdptest.Packet{SrcMAC: clientMAC, DstMAC: nicMAC, Src: client4, Dst: vip4, Proto: xdptest.UDP,
		SPort: sport, DPort: 53, Payload: []byte("query")}
}

func udp6(sport uint16) xdptest.Packet {
	p := udp4(sport)
	p.Src, p.Dst = client6, vip6
	return p
}

// to returns the frame xdp_lb must send to a remote backend: the input with the
// destination MAC set to the backend's and the source MAC to the NIC's.
func to(p xdptest.Packet, b Backend) []byte { return p.WithMACs(nicMAC, b.MAC).Bytes() }

// inTransition is a TCP packet p a director steered to b in its VIP's
// transition: marked to be walked from the chain's start where b does not have
// it (the fixtures' director has no replica of its own, so no tag).
func inTransition(p xdptest.Packet, b Backend) []byte {
	return xdptest.WithTCPMark(to(p, b), 1<<8|int(lbLbLimitsLB_MARK_PROBE))
}

// verdictFor, outFor and reasonsFor describe what sending p to backend b looks like.
func verdictFor(b Backend) uint32 {
	if b.Local {
		return xdptest.Pass
	}
	return xdptest.TX
}

func outFor(p xdptest.Packet, b Backend) []byte {
	if b.Local {
		return nil
	}
	return to(p, b)
}

func reasonsFor(b Backend) map[Reason]uint64 {
	if b.Local {
		return reasons(rLocal, 1)
	}
	return reasons(rTX, 1)
}

func reasons(kv ...any) map[Reason]uint64 {
	m := map[Reason]uint64{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i].(Reason)] = uint64(kv[i+1].(int))
	}
	return m
}

const (
	rNotIP     = lbReasonREASON_NOT_IP
	rNotVIP    = lbReasonREASON_NOT_VIP
	rVIPClosed = lbReasonREASON_VIP_CLOSED
	rMalformed = lbReasonREASON_MALFORMED
	rFragment  = lbReasonREASON_FRAGMENT
	rOptions   = lbReasonREASON_IP_OPTIONS
	rV6Ext     = lbReasonREASON_IPV6EXT
	rICMP      = lbReasonREASON_ICMP_STEERED
	rICMPOther = lbReasonREASON_ICMP_OTHER
	rNoBackend = lbReasonREASON_NO_BACKEND
	rLocal     = lbReasonREASON_LOCAL
	rTX        = lbReasonREASON_TX
	rRepick    = lbReasonREASON_FLOW_REPICK
	rOtherHost = lbReasonREASON_OTHER_HOST
	rFromPeer  = lbReasonREASON_FROM_PEER
	rPinned    = lbReasonREASON_PINNED
	rNewPinned = lbReasonREASON_NEW_PINNED
	rHandoff   = lbReasonREASON_HANDOFF
	rHandoffIn = lbReasonREASON_HANDOFF_IN
)

func withMACs(frame []byte, src, dst net.HardwareAddr) []byte {
	out := slices.Clone(frame)
	copy(out[0:6], dst)
	copy(out[6:12], src)
	return out
}

// ipv4Checksum is the Internet checksum over an IPv4 header: 0 when it is right.
func ipv4Checksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}
