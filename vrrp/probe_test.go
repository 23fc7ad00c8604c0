package vrrp

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"

	"github.com/portico-edge/portico/test/netlab"
)

// probeResult is what the prober writes: when each echo request went out and
// when its reply came back (0: never), in Unix nanoseconds.
type probeResult struct {
	Sent []int64 `json:"sent"`
	Recv []int64 `json:"recv"`
}

// probeMain pings a VIP every millisecond from the namespace it runs in, for at
// most the given duration or until SIGTERM, then writes a probeResult.
// spec is "vip,output path,max duration".
func probeMain(spec string) int {
	parts := strings.Split(spec, ",")
	if len(parts) != 3 {
		fmt.Fprintln(os.Stderr, "probe spec must be vip,out,duration")
		return 2
	}
	vip, err := netip.ParseAddr(parts[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	maxDur, err := time.ParseDuration(parts[2])
	if err != nil || maxDur <= 0 || maxDur > 10*time.Minute {
		fmt.Fprintln(os.Stderr, "bad probe duration", parts[2])
		return 2
	}
	// Echo requests wait in the neighbour queue while the VIP has no owner and
	// hold send-buffer space; a full buffer would block the sender and break the
	// 1 ms pace. A big buffer and a short write deadline keep it going.
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 64<<20)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	c, err := lc.ListenPacket(context.Background(), "ip4:icmp", "0.0.0.0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	id := os.Getpid() & 0xffff
	const maxProbes = 600000
	var (
		mu  sync.Mutex
		res probeResult
	)
	netlab.ReadPackets(c, 1500, func(p []byte, _ net.Addr) {
		now := time.Now().UnixNano()
		m, err := icmp.ParseMessage(1, p)
		if err != nil || m.Type != ipv4.ICMPTypeEchoReply {
			return
		}
		e, ok := m.Body.(*icmp.Echo)
		if !ok || e.ID != id || len(e.Data) < 8 {
			return
		}
		seq := int(binary.BigEndian.Uint64(e.Data))
		mu.Lock()
		if seq < len(res.Recv) && res.Recv[seq] == 0 {
			res.Recv[seq] = now
		}
		mu.Unlock()
	})
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	end := time.After(maxDur)
	dst := &net.IPAddr{IP: vip.AsSlice()}
loop:
	for seq := 0; seq < maxProbes; seq++ {
		data := make([]byte, 8)
		binary.BigEndian.PutUint64(data, uint64(seq))
		b, err := (&icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: id, Seq: seq & 0xffff, Data: data}}).Marshal(nil)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		mu.Lock()
		res.Sent = append(res.Sent, time.Now().UnixNano())
		res.Recv = append(res.Recv, 0)
		mu.Unlock()
		c.SetWriteDeadline(time.Now().Add(500 * time.Microsecond))
		c.WriteTo(b, dst) // errors (no neighbour, full buffer) are just lost probes
		select {
		case <-tick.C:
		case <-stop:
			break loop
		case <-end:
			break loop
		}
	}
	time.Sleep(20 * time.Millisecond) // let the last replies in
	mu.Lock()
	out, err := json.Marshal(res)
	mu.Unlock()
	if err == nil {
		err = os.WriteFile(parts[1], out, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
