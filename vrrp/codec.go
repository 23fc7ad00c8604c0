package vrrp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// IPProtocol is the IP protocol number of VRRP.
const IPProtocol = 112

// The VRRP multicast groups (RFC 5798 §5.1.1.2 and §5.1.2.2).
var (
	GroupIPv4 = netip.MustParseAddr("224.0.0.18")
	GroupIPv6 = netip.MustParseAddr("ff02::12")
)

const (
	typeAdvertisement = 1
	headerLen         = 8
	v2AuthLen         = 8
	// requiredHopLimit is the TTL / hop limit every advert must carry, so that an
	// advert cannot have crossed a router (RFC 5798 §5.1.1.3).
	requiredHopLimit = 255
)

// Advert is one decoded VRRP advertisement.
type Advert struct {
	// Version is 2 (RFC 3768, IPv4 only) or 3 (RFC 5798).
	Version uint8
	// VRID is the virtual router identifier, 1 to 255.
	VRID uint8
	// Priority is the sender's priority; 0 means the Master is giving up the
	// virtual router, 255 means the sender owns the addresses.
	Priority uint8
	// Interval is the sender's advertisement interval: whole seconds in version 2,
	// centiseconds in version 3.
	Interval time.Duration
	// Addrs are the virtual addresses, all of one family.
	Addrs []netip.Addr
	// AuthType and AuthData are the version 2 authentication fields; only type 0
	// (no authentication) is accepted, the data is carried as received.
	AuthType uint8
	AuthData [v2AuthLen]byte
}

// Reason names why an advert was rejected. Every rejection has one, and the
// rejected-adverts counter is labelled by it.
type Reason string

// The rejection reasons. The list is closed so the metric's labels stay bounded.
const (
	ReasonShort     Reason = "short"      // fewer bytes than the fixed header
	ReasonTTL       Reason = "ttl"        // TTL / hop limit other than 255
	ReasonVersion   Reason = "version"    // not 2 or 3, or version 2 over IPv6
	ReasonType      Reason = "type"       // not an advertisement
	ReasonVRID      Reason = "vrid"       // VRID 0, or no instance for it
	ReasonLength    Reason = "length"     // length does not match the address count
	ReasonAddrCount Reason = "addr_count" // no addresses
	ReasonChecksum  Reason = "checksum"   // checksum mismatch
	ReasonAuth      Reason = "auth"       // version 2 authentication other than none
	ReasonInterval  Reason = "interval"   // advertisement interval 0
	ReasonPeer      Reason = "peer"       // source outside the configured peer list
	ReasonFamily    Reason = "family"     // source and destination of different families
	ReasonAddrs     Reason = "addrs"      // address list differs from ours
	ReasonMismatch  Reason = "mismatch"   // version or interval differ from ours (version 2)
)

// Reasons lists every rejection reason, for pre-creating metric series.
var Reasons = []Reason{
	ReasonShort, ReasonTTL, ReasonVersion, ReasonType, ReasonVRID, ReasonLength,
	ReasonAddrCount, ReasonChecksum, ReasonAuth, ReasonInterval, ReasonPeer,
	ReasonFamily, ReasonAddrs, ReasonMismatch,
}

// RejectError is the error Decode returns for an advert it refuses.
type RejectError struct {
	Reason Reason
	Detail string
}

func (e *RejectError) Error() string {
	if e.Detail == "" {
		return "reject advert: " + string(e.Reason)
	}
	return fmt.Sprintf("reject advert: %s: %s", e.Reason, e.Detail)
}

func reject(r Reason, format string, args ...any) error {
	return &RejectError{Reason: r, Detail: fmt.Sprintf(format, args...)}
}

// ReasonOf returns the rejection reason carried by err, or "" if it has none.
func ReasonOf(err error) Reason {
	var re *RejectError
	if errors.As(err, &re) {
		return re.Reason
	}
	return ""
}

// Decode parses and validates the VRRP payload b of an IP packet from src to dst
// that arrived with the given TTL / hop limit. The address family comes from src.
// It never panics; every refusal is a *RejectError.
func Decode(b []byte, src, dst netip.Addr, hopLimit int) (Advert, error) {
	var a Advert
	if !src.IsValid() || !dst.IsValid() || src.Unmap().Is4() != dst.Unmap().Is4() {
		return a, reject(ReasonFamily, "src %v dst %v", src, dst)
	}
	src, dst = src.Unmap(), dst.Unmap()
	if hopLimit != requiredHopLimit {
		return a, reject(ReasonTTL, "%d", hopLimit)
	}
	if len(b) < headerLen {
		return a, reject(ReasonShort, "%d bytes", len(b))
	}
	a.Version = b[0] >> 4
	if t := b[0] & 0x0f; t != typeAdvertisement {
		return a, reject(ReasonType, "%d", t)
	}
	switch {
	case a.Version == 3:
	case a.Version == 2 && src.Is4():
	default:
		return a, reject(ReasonVersion, "%d over %s", a.Version, family(src))
	}
	a.VRID = b[1]
	if a.VRID == 0 {
		return a, reject(ReasonVRID, "0")
	}
	a.Priority = b[2]
	n := int(b[3])
	if n == 0 {
		return a, reject(ReasonAddrCount, "0")
	}
	alen := 4
	if src.Is6() {
		alen = 16
	}
	want := headerLen + n*alen
	if a.Version == 2 {
		want += v2AuthLen
	}
	if len(b) != want {
		return a, reject(ReasonLength, "%d bytes for %d addresses, want %d", len(b), n, want)
	}
	if a.Version == 2 {
		a.AuthType = b[4]
		a.Interval = time.Duration(b[5]) * time.Second
		if a.AuthType != 0 {
			return a, reject(ReasonAuth, "type %d", a.AuthType)
		}
		copy(a.AuthData[:], b[want-v2AuthLen:])
		if sum := checksum(0, b); sum != 0 {
			return a, reject(ReasonChecksum, "residue %#04x", sum)
		}
	} else {
		// The four reserved bits before the interval are ignored on receipt
		// (RFC 5798 §5.2.5) and sent as zero.
		a.Interval = time.Duration(binary.BigEndian.Uint16(b[4:6])&0x0fff) * 10 * time.Millisecond
		if sum := checksum(pseudoHeaderSum(src, dst, len(b)), b); sum != 0 {
			return a, reject(ReasonChecksum, "residue %#04x", sum)
		}
	}
	if a.Interval == 0 {
		return a, reject(ReasonInterval, "0")
	}
	a.Addrs = make([]netip.Addr, n)
	for i := range n {
		off := headerLen + i*alen
		if alen == 4 {
			a.Addrs[i] = netip.AddrFrom4([4]byte(b[off : off+4]))
		} else {
			a.Addrs[i] = netip.AddrFrom16([16]byte(b[off : off+16]))
		}
	}
	return a, nil
}

// Encode returns the VRRP payload for a, with its checksum computed for a packet
// from src to dst (version 3 covers the pseudo-header, version 2 does not).
func Encode(a Advert, src, dst netip.Addr) ([]byte, error) {
	src, dst = src.Unmap(), dst.Unmap()
	if !src.IsValid() || !dst.IsValid() || src.Is4() != dst.Is4() {
		return nil, fmt.Errorf("encode advert: src %v and dst %v differ in family", src, dst)
	}
	if a.Version != 2 && a.Version != 3 {
		return nil, fmt.Errorf("encode advert: version %d", a.Version)
	}
	if a.Version == 2 && !src.Is4() {
		return nil, fmt.Errorf("encode advert: version 2 is IPv4 only")
	}
	if a.VRID == 0 {
		return nil, fmt.Errorf("encode advert: vrid 0")
	}
	if len(a.Addrs) == 0 || len(a.Addrs) > 255 {
		return nil, fmt.Errorf("encode advert: %d addresses", len(a.Addrs))
	}
	alen := 4
	if src.Is6() {
		alen = 16
	}
	n := headerLen + len(a.Addrs)*alen
	if a.Version == 2 {
		n += v2AuthLen
	}
	b := make([]byte, n)
	b[0] = a.Version<<4 | typeAdvertisement
	b[1] = a.VRID
	b[2] = a.Priority
	b[3] = byte(len(a.Addrs))
	if a.Version == 2 {
		secs := a.Interval / time.Second
		if secs < 1 || secs > 255 || a.Interval%time.Second != 0 {
			return nil, fmt.Errorf("encode advert: version 2 interval %v is not 1 to 255 whole seconds", a.Interval)
		}
		b[4] = a.AuthType
		b[5] = byte(secs)
		copy(b[n-v2AuthLen:], a.AuthData[:])
	} else {
		cs := a.Interval / (10 * time.Millisecond)
		if cs < 1 || cs > 0x0fff || a.Interval%(10*time.Millisecond) != 0 {
			return nil, fmt.Errorf("encode advert: version 3 interval %v is not 1 to 4095 centiseconds", a.Interval)
		}
		binary.BigEndian.PutUint16(b[4:6], uint16(cs))
	}
	for i, addr := range a.Addrs {
		addr = addr.Unmap()
		if addr.Is4() != src.Is4() {
			return nil, fmt.Errorf("encode advert: address %v is not %s", addr, family(src))
		}
		off := headerLen + i*alen
		if alen == 4 {
			v := addr.As4()
			copy(b[off:], v[:])
		} else {
			v := addr.As16()
			copy(b[off:], v[:])
		}
	}
	var initial uint32
	if a.Version == 3 {
		initial = pseudoHeaderSum(src, dst, n)
	}
	binary.BigEndian.PutUint16(b[6:8], checksum(initial, b))
	return b, nil
}

// pseudoHeaderSum is the unfolded ones'-complement sum of the IPv4 (RFC 768 style)
// or IPv6 (RFC 8200 §8.1) pseudo-header for a VRRP payload of length n.
func pseudoHeaderSum(src, dst netip.Addr, n int) uint32 {
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(b[i])<<8 | uint32(b[i+1])
		}
	}
	if src.Is4() {
		s, d := src.As4(), dst.As4()
		add(s[:])
		add(d[:])
	} else {
		s, d := src.As16(), dst.As16()
		add(s[:])
		add(d[:])
	}
	// Both layouts add the protocol and the (upper-layer) length as 16-bit words;
	// the length of a VRRP payload always fits in 16 bits.
	sum += IPProtocol + uint32(n)
	return sum
}

// checksum returns the Internet checksum (RFC 1071) of b seeded with initial.
// Over a buffer holding a correct checksum it returns 0.
func checksum(initial uint32, b []byte) uint16 {
	sum := initial
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "ipv4"
	}
	return "ipv6"
}
