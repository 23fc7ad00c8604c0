package vrrp

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/portico-edge/portico/controlplane/model"
)

var (
	a4 = netip.MustParseAddr
)

// goldenAdverts are hand-checked wire images: the checksums were computed by hand
// (version 2: over the message; version 3: over the pseudo-header and the message).
var goldenAdverts = []struct {
	name     string
	src, dst netip.Addr
	advert   Advert
	wire     []byte
}{
	{
		name: "v3 ipv4 one address 1s",
		src:  a4("192.168.1.10"), dst: GroupIPv4,
		advert: Advert{Version: 3, VRID: 51, Priority: 100, Interval: time.Second, Addrs: []netip.Addr{a4("192.168.1.100")}},
		wire:   []byte{0x31, 0x33, 0x64, 0x01, 0x00, 0x64, 0x06, 0x19, 0xc0, 0xa8, 0x01, 0x64},
	},
	{
		name: "v3 ipv4 two addresses 20ms",
		src:  a4("10.1.0.2"), dst: GroupIPv4,
		advert: Advert{Version: 3, VRID: 200, Priority: 254, Interval: 20 * time.Millisecond, Addrs: []netip.Addr{a4("10.1.0.100"), a4("10.1.0.101")}},
		wire:   []byte{0x31, 0xc8, 0xfe, 0x02, 0x00, 0x02, 0xd0, 0xd1, 0x0a, 0x01, 0x00, 0x64, 0x0a, 0x01, 0x00, 0x65},
	},
	{
		name: "v3 ipv4 unicast priority 0",
		src:  a4("10.1.0.2"), dst: a4("10.1.0.3"),
		advert: Advert{Version: 3, VRID: 9, Priority: 0, Interval: 100 * time.Millisecond, Addrs: []netip.Addr{a4("10.1.0.100")}},
		wire:   []byte{0x31, 0x09, 0x00, 0x01, 0x00, 0x0a, 0xb0, 0x03, 0x0a, 0x01, 0x00, 0x64},
	},
	{
		name: "v2 ipv4",
		src:  a4("10.0.0.1"), dst: GroupIPv4,
		advert: Advert{Version: 2, VRID: 7, Priority: 150, Interval: time.Second, Addrs: []netip.Addr{a4("10.0.0.100")}},
		wire: []byte{0x21, 0x07, 0x96, 0x01, 0x00, 0x01, 0x3e, 0x92, 0x0a, 0x00, 0x00, 0x64,
			0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00},
	},
	{
		name: "v3 ipv6 owner",
		src:  a4("fe80::1"), dst: GroupIPv6,
		advert: Advert{Version: 3, VRID: 1, Priority: 255, Interval: 10 * time.Millisecond, Addrs: []netip.Addr{a4("2001:db8::100")}},
		wire: []byte{0x31, 0x01, 0xff, 0x01, 0x00, 0x01, 0xa3, 0x23,
			0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00},
	},
}

func TestEncodeGolden(t *testing.T) {
	for _, tc := range goldenAdverts {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Encode(tc.advert, tc.src, tc.dst)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wire, got); diff != "" {
				t.Errorf("Encode (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecodeGolden(t *testing.T) {
	for _, tc := range goldenAdverts {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decode(tc.wire, tc.src, tc.dst, 255)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.advert, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("Decode (-want +got):\n%s", diff)
			}
		})
	}
}

// mutate returns a copy of b with f applied.
func mutate(b []byte, f func([]byte) []byte) []byte {
	c := append([]byte(nil), b...)
	return f(c)
}

func TestDecodeRejects(t *testing.T) {
	v3 := goldenAdverts[0].wire
	v2 := goldenAdverts[3].wire
	v6 := goldenAdverts[4].wire
	src4, src6 := a4("192.168.1.10"), a4("fe80::1")
	cases := []struct {
		name     string
		b        []byte
		src, dst netip.Addr
		ttl      int
		want     Reason
	}{
		{"ttl 254", v3, src4, GroupIPv4, 254, ReasonTTL},
		{"ttl 1", v3, src4, GroupIPv4, 1, ReasonTTL},
		{"empty", nil, src4, GroupIPv4, 255, ReasonShort},
		{"seven bytes", v3[:7], src4, GroupIPv4, 255, ReasonShort},
		{"version 4", mutate(v3, func(b []byte) []byte { b[0] = 0x41; return b }), src4, GroupIPv4, 255, ReasonVersion},
		{"version 1", mutate(v3, func(b []byte) []byte { b[0] = 0x11; return b }), src4, GroupIPv4, 255, ReasonVersion},
		{"version 2 over ipv6", mutate(v6, func(b []byte) []byte { b[0] = 0x21; return b }), src6, GroupIPv6, 255, ReasonVersion},
		{"type 2", mutate(v3, func(b []byte) []byte { b[0] = 0x32; return b }), src4, GroupIPv4, 255, ReasonType},
		{"vrid 0", mutate(v3, func(b []byte) []byte { b[1] = 0; return b }), src4, GroupIPv4, 255, ReasonVRID},
		{"no addresses", mutate(v3, func(b []byte) []byte { b[3] = 0; return b[:8] }), src4, GroupIPv4, 255, ReasonAddrCount},
		{"count says two", mutate(v3, func(b []byte) []byte { b[3] = 2; return b }), src4, GroupIPv4, 255, ReasonLength},
		{"trailing byte", append(append([]byte(nil), v3...), 0), src4, GroupIPv4, 255, ReasonLength},
		{"v2 without auth data", v2[:12], src4, GroupIPv4, 255, ReasonLength},
		{"ipv4 payload read as ipv6", v3, src6, GroupIPv6, 255, ReasonLength},
		{"v3 checksum flipped bit", mutate(v3, func(b []byte) []byte { b[7] ^= 1; return b }), src4, GroupIPv4, 255, ReasonChecksum},
		{"v3 checksum other source", v3, a4("192.168.1.11"), GroupIPv4, 255, ReasonChecksum},
		{"v3 checksum other destination", v3, src4, a4("192.168.1.20"), 255, ReasonChecksum},
		{"v3 ipv6 checksum other source", v6, a4("fe80::2"), GroupIPv6, 255, ReasonChecksum},
		{"v2 checksum", mutate(v2, func(b []byte) []byte { b[2] = 151; return b }), src4, GroupIPv4, 255, ReasonChecksum},
		{"v2 auth type 1", mutate(v2, func(b []byte) []byte { b[4] = 1; return b }), src4, GroupIPv4, 255, ReasonAuth},
		{"v3 interval 0", mutate(v3, func(b []byte) []byte { b[5] = 0; b[7] = 0x7d; return b }), src4, GroupIPv4, 255, ReasonInterval},
		{"mixed families", v3, src4, GroupIPv6, 255, ReasonFamily},
		{"invalid source", v3, netip.Addr{}, GroupIPv4, 255, ReasonFamily},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode(tc.b, tc.src, tc.dst, tc.ttl)
			if got := ReasonOf(err); got != tc.want {
				t.Errorf("Decode reason = %q (err %v), want %q", got, err, tc.want)
			}
		})
	}
}

func TestDecodeIgnoresReservedBits(t *testing.T) {
	b := mutate(goldenAdverts[0].wire, func(b []byte) []byte {
		b[4] |= 0xf0
		b[6], b[7] = 0x16, 0x18 // the checksum for the word at 4 grown by 0xf000
		return b
	})
	a, err := Decode(b, a4("192.168.1.10"), GroupIPv4, 255)
	if err != nil {
		t.Fatal(err)
	}
	if a.Interval != time.Second {
		t.Errorf("interval = %v, want 1s", a.Interval)
	}
}

func TestEncodeRejectsBadAdverts(t *testing.T) {
	ok := Advert{Version: 3, VRID: 1, Priority: 100, Interval: time.Second, Addrs: []netip.Addr{a4("10.0.0.1")}}
	cases := []struct {
		name     string
		edit     func(*Advert)
		src, dst netip.Addr
	}{
		{"version 4", func(a *Advert) { a.Version = 4 }, a4("10.0.0.2"), GroupIPv4},
		{"v2 over ipv6", func(a *Advert) { a.Version = 2; a.Addrs = []netip.Addr{a4("2001:db8::1")} }, a4("fe80::1"), GroupIPv6},
		{"vrid 0", func(a *Advert) { a.VRID = 0 }, a4("10.0.0.2"), GroupIPv4},
		{"no addresses", func(a *Advert) { a.Addrs = nil }, a4("10.0.0.2"), GroupIPv4},
		{"v2 half second", func(a *Advert) { a.Version = 2; a.Interval = 500 * time.Millisecond }, a4("10.0.0.2"), GroupIPv4},
		{"v3 5ms", func(a *Advert) { a.Interval = 5 * time.Millisecond }, a4("10.0.0.2"), GroupIPv4},
		{"v3 too long", func(a *Advert) { a.Interval = 41 * time.Second }, a4("10.0.0.2"), GroupIPv4},
		{"family mix", func(a *Advert) { a.Addrs = []netip.Addr{a4("2001:db8::1")} }, a4("10.0.0.2"), GroupIPv4},
		{"src dst mix", func(a *Advert) {}, a4("10.0.0.2"), GroupIPv6},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := ok
			tc.edit(&a)
			if b, err := Encode(a, tc.src, tc.dst); err == nil {
				t.Errorf("Encode = %x, want an error", b)
			}
		})
	}
}

// The build gives a group at most model.MaxVRRPAddrs4 IPv4 and MaxVRRPAddrs6
// IPv6 VIPs (with its L4 Services'): so many encode, and an IPv6 advert of them
// fits in IPv6's minimum MTU (1280, with the 40-byte IPv6 header), unfragmented.
func TestModelVIPLimitsFitOneAdvert(t *testing.T) {
	for _, c := range []struct {
		first, src, dst netip.Addr
		n, limit        int
	}{
		{a4("10.0.0.1"), a4("10.1.0.1"), GroupIPv4, model.MaxVRRPAddrs4, 1500 - 20},
		{a4("2001:db8::1"), a4("fe80::1"), GroupIPv6, model.MaxVRRPAddrs6, 1280 - 40},
	} {
		a := Advert{Version: 3, VRID: 1, Priority: 100, Interval: time.Second}
		for v := c.first; len(a.Addrs) < c.n; v = v.Next() {
			a.Addrs = append(a.Addrs, v)
		}
		b, err := Encode(a, c.src, c.dst)
		if err != nil || len(b) > c.limit {
			t.Errorf("%d addresses like %s: %d bytes (at most %d), %v", c.n, c.first, len(b), c.limit, err)
		}
		a.Addrs = append(a.Addrs, a.Addrs[len(a.Addrs)-1].Next())
		if b, err := Encode(a, c.src, c.dst); c.first.Is6() && err == nil && len(b) <= c.limit {
			t.Errorf("%d IPv6 addresses fit in %d bytes: model.MaxVRRPAddrs6 could be higher", len(a.Addrs), len(b))
		}
	}
}
