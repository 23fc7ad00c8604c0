package traffic

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"syscall"
	"time"

	"github.com/portico-edge/portico/test/netlab"
)

// FloodSpoofedSYNs sends TCP SYNs to the VIP's port from random source addresses of
// src and random ports, from the client's namespace through a raw socket, as fast
// as it can: at most n packets and at most d. It returns how many it sent. The
// addresses must be ones nothing answers for (the replicas' SYN-ACKs go nowhere).
func (l Target) FloodSpoofedSYNs(ctx context.Context, src netip.Prefix, port uint16, n int, d time.Duration) (int, error) {
	if !l.VIP.Is4() || !src.Addr().Is4() || src.Bits() > 24 {
		return 0, fmt.Errorf("flood: want IPv4 addresses and a source prefix of /24 or more, got %s from %s", l.VIP, src)
	}
	var fd int
	if err := netlab.Do(l.NS, func() (err error) {
		fd, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
		return err
	}); err != nil {
		return 0, fmt.Errorf("flood: raw socket in %s: %w", l.NS, err)
	}
	defer syscall.Close(fd)
	dst := &syscall.SockaddrInet4{Addr: l.VIP.As4()}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	base := src.Masked().Addr().As4()
	hostBits := 32 - src.Bits()
	pkt := make([]byte, 40)
	deadline := time.Now().Add(d)
	sent := 0
	for sent < n {
		if sent%1024 == 0 && (time.Now().After(deadline) || ctx.Err() != nil) {
			break
		}
		s := base
		binary.BigEndian.PutUint32(s[:], binary.BigEndian.Uint32(base[:])|rng.Uint32()>>(32-hostBits))
		synPacket(pkt, s, l.VIP.As4(), uint16(1024+rng.IntN(64000)), port, rng.Uint32())
		if err := syscall.Sendto(fd, pkt, 0, dst); err != nil {
			if err == syscall.ENOBUFS || err == syscall.EAGAIN {
				continue
			}
			return sent, fmt.Errorf("flood: send: %w", err)
		}
		sent++
	}
	return sent, nil
}

// synPacket writes an IPv4 header and a TCP SYN (no options) into b (40 bytes),
// with both checksums.
func synPacket(b []byte, src, dst [4]byte, sport, dport uint16, seq uint32) {
	clear(b)
	b[0], b[8], b[9] = 0x45, 64, syscall.IPPROTO_TCP
	binary.BigEndian.PutUint16(b[2:], 40)
	binary.BigEndian.PutUint16(b[6:], 0x4000) // DF
	copy(b[12:16], src[:])
	copy(b[16:20], dst[:])
	binary.BigEndian.PutUint16(b[10:], checksum(b[:20], 0))
	t := b[20:]
	binary.BigEndian.PutUint16(t[0:], sport)
	binary.BigEndian.PutUint16(t[2:], dport)
	binary.BigEndian.PutUint32(t[4:], seq)
	t[12], t[13] = 5<<4, 0x02 // data offset 5 words; SYN
	binary.BigEndian.PutUint16(t[14:], 64240)
	var pseudo uint32
	for i := 12; i < 20; i += 2 {
		pseudo += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	pseudo += syscall.IPPROTO_TCP + 20
	binary.BigEndian.PutUint16(t[16:], checksum(t, pseudo))
}

// checksum is the Internet checksum of b, starting from sum.
func checksum(b []byte, sum uint32) uint16 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}
