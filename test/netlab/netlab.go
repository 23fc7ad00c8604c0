// Package netlab builds throw-away network topologies out of network namespaces
// for Portico's namespace tests and demos: "nodes" are namespaces with one veth
// (eth0) into a bridge that lives in a switch namespace of its own, so the root
// namespace is never touched. Every name carries a per-run prefix and Close
// removes everything the lab made.
package netlab

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"runtime"
	"strings"
	"sync"

	"github.com/vishvananda/netns"
)

// Lab is one topology. The zero value is not usable: call New.
type Lab struct {
	Prefix string // e.g. "pl3fa1": every namespace and link name starts with it
	Switch string // namespace holding the bridge "br0"

	mu      sync.Mutex
	nodes   []*Node
	closers []func() error
}

// Node is a namespace attached to the lab's bridge through its eth0.
type Node struct {
	Name string // short name given to AddNode
	NS   string // namespace name
	Port string // the bridge-side veth end, in the switch namespace
	Addr netip.Prefix
	MAC  net.HardwareAddr
}

// New creates the switch namespace with its bridge. prefix is 1-3 letters naming
// the user (e.g. "pd" for the data-plane demo); four random hex digits follow.
func New(prefix string) (*Lab, error) {
	var b [2]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	// What killed runs left behind goes first (sweep.go).
	if err := sweep(); err != nil {
		return nil, fmt.Errorf("remove the labs of ended runs: %w", err)
	}
	l := &Lab{Prefix: prefix + hex.EncodeToString(b[:])}
	l.Switch = l.Prefix + "sw"
	if err := l.own(); err != nil {
		return nil, err
	}
	if err := l.addNS(l.Switch); err != nil {
		l.Close()
		return nil, err
	}
	for _, args := range [][]string{
		{"-n", l.Switch, "link", "add", "br0", "type", "bridge"},
		{"-n", l.Switch, "link", "set", "br0", "up"},
		{"-n", l.Switch, "link", "set", "lo", "up"},
	} {
		if err := IP(args...); err != nil {
			l.Close()
			return nil, err
		}
	}
	return l, nil
}

// IP runs the ip(8) command.
func IP(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (l *Lab) addNS(ns string) error {
	if err := IP("netns", "add", ns); err != nil {
		return err
	}
	l.onClose(func() error { return IP("netns", "del", ns) })
	return nil
}

func (l *Lab) onClose(f func() error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closers = append(l.closers, f)
}

// OnClose registers f to run when the lab closes, before its namespaces go.
func (l *Lab) OnClose(f func() error) { l.onClose(f) }

// AddNode creates a namespace with eth0 (address addr, MAC mac) plugged into the
// bridge, and lo up.
func (l *Lab) AddNode(name string, addr netip.Prefix, mac net.HardwareAddr) (*Node, error) {
	n := &Node{Name: name, NS: l.Prefix + name, Port: l.Prefix + name + "p", Addr: addr, MAC: mac}
	if len(n.Port) > 15 {
		return nil, fmt.Errorf("link name %q longer than 15 characters", n.Port)
	}
	if err := l.addNS(n.NS); err != nil {
		return nil, err
	}
	for _, args := range [][]string{
		{"-n", l.Switch, "link", "add", n.Port, "type", "veth", "peer", "name", "eth0", "netns", n.NS},
		{"-n", l.Switch, "link", "set", n.Port, "master", "br0"},
		{"-n", l.Switch, "link", "set", n.Port, "up"},
		{"-n", n.NS, "link", "set", "eth0", "address", mac.String()},
		{"-n", n.NS, "addr", "add", addr.String(), "dev", "eth0"},
		{"-n", n.NS, "link", "set", "eth0", "up"},
		{"-n", n.NS, "link", "set", "lo", "up"},
	} {
		if err := IP(args...); err != nil {
			return nil, err
		}
	}
	// A veth hands packets over with checksums left to "offload" (partial). A
	// frame that xdp_lb sends on with XDP_TX loses that mark and would arrive
	// with a bad checksum, so nodes compute full checksums, as a real wire has.
	if _, err := Exec(n.NS, "ethtool", "-K", "eth0", "tx", "off"); err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.nodes = append(l.nodes, n)
	l.mu.Unlock()
	return n, nil
}

// Exec runs a command inside a namespace and returns its combined output.
func Exec(ns string, name string, args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns, name}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s in %s: %v: %s", name, strings.Join(args, " "), ns, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Sysctl sets key=value inside a namespace.
func Sysctl(ns, key, value string) error {
	_, err := Exec(ns, "sysctl", "-qw", key+"="+value)
	return err
}

// ReadPackets calls handle with each packet c receives, from a goroutine of its
// own, until a read fails (c is closed). handle must not keep p: its buffer, of
// size bytes, is reused.
func ReadPackets(c net.PacketConn, size int, handle func(p []byte, from net.Addr)) {
	go func() {
		buf := make([]byte, size)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			handle(buf[:n], from)
		}
	}()
}

// Do runs fn on an OS thread that is inside namespace ns. Sockets fn opens stay
// in ns after Do returns, so servers and clients can be created this way and
// used from any goroutine.
func Do(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// The thread is not unlocked: if switching back failed, it must die with
		// this goroutine rather than serve others from the wrong namespace.
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		h, err := netns.GetFromName(ns)
		if err != nil {
			errc <- fmt.Errorf("open netns %s: %w", ns, err)
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", ns, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("leave netns %s: %w", ns, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Close removes everything the lab created, in reverse order, and reports every
// failure.
func (l *Lab) Close() error {
	l.mu.Lock()
	closers := l.closers
	l.closers = nil
	l.mu.Unlock()
	var errs []error
	for i := len(closers) - 1; i >= 0; i-- {
		if err := closers[i](); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
