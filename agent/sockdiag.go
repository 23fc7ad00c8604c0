package agent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/portico-edge/portico/dataplane"
)

// ownConnections lists this node's TCP connections in the states in which its
// stack answers a packet of the connection (not listening, closed, in
// TIME_WAIT or opening one itself), in the client's direction: the remote end
// as the source. Sorted.
//
// Hand-written over NETLINK_SOCK_DIAG rather than vishvananda/netlink's
// SocketDiagTCP, which asks for every state and for each socket's tcp_info
// and congestion state, and parses them: on this project's VM it took
// 5.6 ms for 2,000 sockets and 34.7 ms for 8,000, run beside a CI run
// (BenchmarkOwnConnections); the agent asks every heldEvery.
func ownConnections() ([]dataplane.Flow, error) {
	var out []dataplane.Flow
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		flows, err := dumpTCP(family)
		// A dump the kernel interrupted (the table changed under it) may
		// lack connections, which the peers would unpin: asked again.
		for try := 0; try < 3 && errors.Is(err, errDumpInterrupted); try++ {
			flows, err = dumpTCP(family)
		}
		if err != nil {
			return nil, fmt.Errorf("sock_diag (family %d): %w", family, err)
		}
		out = append(out, flows...)
	}
	slices.SortFunc(out, func(a, b dataplane.Flow) int {
		if c := a.Dst.Compare(b.Dst); c != 0 {
			return c
		}
		if c := a.Src.Compare(b.Src); c != 0 {
			return c
		}
		if a.DPort != b.DPort {
			return int(a.DPort) - int(b.DPort)
		}
		return int(a.SPort) - int(b.SPort)
	})
	return out, nil
}

var errDumpInterrupted = errors.New("dump interrupted")

// heldStates are the TCP states ownConnections asks for (a bit per state).
const heldStates = 1<<unix.BPF_TCP_ESTABLISHED | 1<<unix.BPF_TCP_SYN_RECV | 1<<unix.BPF_TCP_FIN_WAIT1 |
	1<<unix.BPF_TCP_FIN_WAIT2 | 1<<unix.BPF_TCP_CLOSE_WAIT | 1<<unix.BPF_TCP_LAST_ACK | 1<<unix.BPF_TCP_CLOSING

// sizes of struct inet_diag_req_v2 and struct inet_diag_msg (linux/inet_diag.h).
const (
	sizeofDiagReq = 56
	sizeofDiagMsg = 72
)

// dumpTCP asks the kernel for every TCP socket of family in heldStates, with
// no extensions.
func dumpTCP(family uint8) ([]dataplane.Flow, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, err
	}
	req := make([]byte, unix.SizeofNlMsghdr+sizeofDiagReq)
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	binary.NativeEndian.PutUint32(req[8:], 1) // sequence
	r := req[unix.SizeofNlMsghdr:]
	r[0], r[1] = family, unix.IPPROTO_TCP // sdiag_family, sdiag_protocol; idiag_ext 0
	binary.NativeEndian.PutUint32(r[4:], heldStates)
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, err
	}
	var out []dataplane.Flow
	interrupted := false
	buf := make([]byte, 64<<10)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return nil, err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if m.Header.Flags&unix.NLM_F_DUMP_INTR != 0 {
				interrupted = true
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				if interrupted {
					return out, errDumpInterrupted
				}
				return out, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if errno := int32(binary.NativeEndian.Uint32(m.Data)); errno != 0 {
						return nil, unix.Errno(-errno)
					}
				}
				return nil, errors.New("netlink error")
			case unix.SOCK_DIAG_BY_FAMILY:
				if f, ok := diagFlow(m.Data); ok {
					out = append(out, f)
				}
			}
		}
	}
}

// diagFlow reads one struct inet_diag_msg as a connection in the client's
// direction (the socket's destination as the source).
func diagFlow(b []byte) (dataplane.Flow, bool) {
	if len(b) < sizeofDiagMsg {
		return dataplane.Flow{}, false
	}
	family := b[0]
	id := b[4:] // struct inet_diag_sockid: sport, dport (big endian), src[16], dst[16], ...
	local, remote := id[4:20], id[20:36]
	var src, dst netip.Addr
	switch family {
	case unix.AF_INET:
		src, dst = netip.AddrFrom4([4]byte(remote[:4])), netip.AddrFrom4([4]byte(local[:4]))
	case unix.AF_INET6:
		src, dst = netip.AddrFrom16([16]byte(remote)).Unmap(), netip.AddrFrom16([16]byte(local)).Unmap()
	default:
		return dataplane.Flow{}, false
	}
	return dataplane.Flow{Src: src, Dst: dst, SPort: binary.BigEndian.Uint16(id[2:]), DPort: binary.BigEndian.Uint16(id[0:]),
		Protocol: unix.IPPROTO_TCP}, true
}
