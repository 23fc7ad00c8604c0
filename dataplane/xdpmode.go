package dataplane

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// XDPMode is which attach modes Attach accepts (Options.XDPMode).
type XDPMode string

const (
	// XDPBestEffort attaches in native mode, or in generic mode where the
	// native attach fails (a driver without native XDP), with a warning.
	XDPBestEffort XDPMode = "best-effort"
	// XDPNative attaches in native mode or fails, saying why.
	XDPNative XDPMode = "native"
)

// ParseXDPMode reads an XDPMode: native or best-effort.
func ParseXDPMode(s string) (XDPMode, error) {
	switch m := XDPMode(s); m {
	case XDPNative, XDPBestEffort:
		return m, nil
	}
	return "", fmt.Errorf("xdp mode %q: want native or best-effort", s)
}

// AttachMode is the mode xdp_lb runs in on its interface.
type AttachMode string

const (
	// AttachNative runs the program in the driver's receive path, before the
	// kernel allocates anything for the packet.
	AttachNative AttachMode = "native"
	// AttachGeneric runs it in the kernel's generic hook, after the stack has
	// allocated the packet's skb: the same verdicts at a fraction of the rate.
	AttachGeneric AttachMode = "generic"
)

// AttachModes are the modes Attach attaches in, for metrics.
var AttachModes = []AttachMode{AttachNative, AttachGeneric}

// attachModeOf finds the mode in which program prog runs on the interface
// ifindex, in the calling thread's network namespace.
func attachModeOf(ifindex int, prog ebpf.ProgramID) (AttachMode, error) {
	if prog == 0 {
		return "", errors.New("no program id")
	}
	p, err := xdpProgramsOf(ifindex)
	if err != nil {
		return "", err
	}
	switch prog {
	case p.native:
		return AttachNative, nil
	case p.generic:
		return AttachGeneric, nil
	case p.offloaded:
		return "", errors.New("the program is offloaded to the NIC, which Portico never does")
	}
	return "", fmt.Errorf("program %d is not attached to link %d (native: %d, generic: %d)", prog, ifindex, p.native, p.generic)
}

// xdpPrograms are the ids of the XDP programs of an interface, one per mode
// (0: none).
type xdpPrograms struct{ native, generic, offloaded ebpf.ProgramID }

// xdpProgramsOf reads the XDP programs of the interface ifindex in the calling
// thread's network namespace, as the kernel reports them for each mode
// (IFLA_XDP_*_PROG_ID).
func xdpProgramsOf(ifindex int) (xdpPrograms, error) {
	var p xdpPrograms
	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(ifindex)
	req.AddData(msg)
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
	if err != nil {
		return p, fmt.Errorf("read link %d: %w", ifindex, err)
	}
	if len(msgs) != 1 || len(msgs[0]) < unix.SizeofIfInfomsg {
		return p, fmt.Errorf("read link %d: %d answers", ifindex, len(msgs))
	}
	attrs, err := nl.ParseRouteAttr(msgs[0][unix.SizeofIfInfomsg:])
	if err != nil {
		return p, fmt.Errorf("parse link %d: %w", ifindex, err)
	}
	for _, a := range attrs {
		if a.Attr.Type&^unix.NLA_F_NESTED != unix.IFLA_XDP {
			continue
		}
		xdp, err := nl.ParseRouteAttr(a.Value)
		if err != nil {
			return p, fmt.Errorf("parse link %d's xdp attributes: %w", ifindex, err)
		}
		for _, x := range xdp {
			if len(x.Value) < 4 {
				continue
			}
			id := ebpf.ProgramID(nl.NativeEndian().Uint32(x.Value))
			switch x.Attr.Type {
			case unix.IFLA_XDP_DRV_PROG_ID:
				p.native = id
			case unix.IFLA_XDP_SKB_PROG_ID:
				p.generic = id
			case unix.IFLA_XDP_HW_PROG_ID:
				p.offloaded = id
			}
		}
		return p, nil
	}
	return p, fmt.Errorf("link %d reports no xdp attributes", ifindex)
}

// driverName is the name of iface's driver (ethtool -i), or "" if it cannot be
// read.
func driverName(iface string) string {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return ""
	}
	defer unix.Close(fd)
	info, err := unix.IoctlGetEthtoolDrvinfo(fd, iface)
	if err != nil {
		return ""
	}
	return unix.ByteSliceToString(info.Driver[:])
}
