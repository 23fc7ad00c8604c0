package vrrp

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// FuzzDecode checks that Decode never panics on any payload, and that whatever it
// accepts survives encode∘decode unchanged, byte for byte apart from the reserved
// bits (ignored on receipt) and the sign of a zero checksum.
func FuzzDecode(f *testing.F) {
	for _, g := range goldenAdverts {
		f.Add(g.wire, g.src.AsSlice(), g.dst.AsSlice(), uint8(255))
	}
	f.Add([]byte{0x31}, a4("10.0.0.1").AsSlice(), GroupIPv4.AsSlice(), uint8(255))
	f.Add([]byte{0x21, 1, 1, 255, 0, 1, 0, 0}, a4("10.0.0.1").AsSlice(), GroupIPv4.AsSlice(), uint8(64))
	f.Fuzz(func(t *testing.T, b, srcB, dstB []byte, ttl uint8) {
		src, _ := netip.AddrFromSlice(srcB)
		dst, _ := netip.AddrFromSlice(dstB)
		a, err := Decode(b, src, dst, int(ttl))
		if err != nil {
			if ReasonOf(err) == "" {
				t.Fatalf("Decode error without a reason: %v", err)
			}
			return
		}
		out, err := Encode(a, src, dst)
		if err != nil {
			t.Fatalf("Encode of a decoded advert: %v (advert %+v)", err, a)
		}
		again, err := Decode(out, src, dst, int(ttl))
		if err != nil {
			t.Fatalf("Decode of re-encoded advert: %v", err)
		}
		if diff := cmp.Diff(a, again, cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
			t.Fatalf("encode∘decode (-first +second):\n%s", diff)
		}
		in := bytes.Clone(b)
		if a.Version == 3 {
			in[4] &= 0x0f
		}
		in[6], in[7], out[6], out[7] = 0, 0, 0, 0
		if !bytes.Equal(in, out) {
			t.Fatalf("re-encoded bytes differ:\n in  %x\n out %x", in, out)
		}
	})
}
