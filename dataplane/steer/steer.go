// Package steer gives TCP connections to L4 Services' VIPs and ports to nginx's
// fixed stream listeners, so that an L4 Service that comes, changes or goes is a
// map update and never an nginx reload. It sits between the nginx sink, which
// renders the routes (nginx.Config.L4Routes), and the kernel: an sk_lookup
// program (bpf/steer.bpf.c) attached to the network namespace nginx listens in,
// its routes kept equal to the L4 Services that have endpoints, and nginx's
// listening sockets taken from its master with pidfd_getfd, as Cloudflare's
// tubular registers a server's sockets.
//
// The program, its maps and its link are pinned (Options.PinPath), so steering
// goes on while the agent restarts; nginx's master keeps its listening sockets
// across reloads, and a socket that closes leaves the map by itself.
package steer

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/portico-edge/portico/dataplane/pins"
)

// Class is what nginx does with a connection its listener accepts.
type Class uint32

const (
	// Plain: nginx proxies the bytes.
	Plain = Class(steerSteerClassSTEER_PLAIN)
	// Proxy: nginx sends a PROXY protocol header first.
	Proxy = Class(steerSteerClassSTEER_PROXY)
	// HTTP and HTTPS: nginx's HTTP and HTTPS listeners serve it (a Gateway's
	// listener on a port nginx does not listen on).
	HTTP  = Class(steerSteerClassSTEER_HTTP)
	HTTPS = Class(steerSteerClassSTEER_HTTPS)
)

// classes is how many classes there are (listeners per address family); the
// first fixed are the stream listeners, which no connection reaches directly.
const (
	classes = 4
	fixed   = 2
)

// Route steers TCP connections to VIP (an address and port) to the listener of
// Class. Listen is the port of nginx's listener of an HTTP or HTTPS route.
type Route struct {
	VIP    netip.AddrPort
	Class  Class
	Listen uint16
}

// Options configure Load.
type Options struct {
	// PinPath is the bpffs directory the program's maps and link are pinned in
	// (the data plane's, so that 'portico uninstall' removes them too).
	PinPath string
	// Ports are the stream listeners' ports (Ports[Plain], Ports[Proxy]),
	// where nginx listens on the wildcard addresses of both families; the
	// HTTP and HTTPS listeners' come with their routes (Route.Listen).
	Ports [fixed]uint16
	// NetNS is the network namespace file to attach to; empty means the
	// agent's own (/proc/self/ns/net).
	NetNS  string
	Logger *zap.Logger
}

// Steering is the loaded program and its maps.
type Steering struct {
	objs  steerObjects
	ports [classes]uint16
	pid   int // the nginx master whose listeners were registered last
	log   *zap.Logger

	mu sync.Mutex // Sync
}

// linkPin is the pin of the program's netns link, in Options.PinPath.
const linkPin = "steer_link"

// Load loads sk_steer and its maps (reusing pinned ones, so routes survive an
// agent restart) and attaches it to the network namespace, or moves the pinned
// link of an earlier agent to the new program.
func Load(opts Options) (*Steering, error) {
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.NetNS == "" {
		opts.NetNS = "/proc/self/ns/net"
	}
	if opts.PinPath == "" {
		return nil, errors.New("load sk_steer: no pin path")
	}
	if err := os.MkdirAll(opts.PinPath, 0o700); err != nil {
		return nil, fmt.Errorf("create pin directory: %w", err)
	}
	spec, err := loadSteer()
	if err != nil {
		return nil, fmt.Errorf("load embedded sk_steer object: %w", err)
	}
	// Pinned under names that carry their layout (package pins): a new
	// layout starts beside the old one, which the old program keeps using
	// until the link moves. The sockets are not carried over (a socket map
	// reads back cookies): Sync registers nginx's listeners again.
	set, err := pins.Open(spec, pins.Options{Dir: opts.PinPath, Link: filepath.Join(opts.PinPath, linkPin), Maps: []pins.Map{
		{Name: steerMapSteerRoutes, State: true, Legacy: true}, {Name: steerMapSteerSocks, Legacy: true},
		{Name: steerMapSteerConfig, Legacy: true}, {Name: steerMapSteerStats, Legacy: true},
	}, Log: opts.Logger})
	if err != nil {
		return nil, fmt.Errorf("load sk_steer: %w", err)
	}
	defer set.Close()
	s := &Steering{log: opts.Logger}
	copy(s.ports[:], opts.Ports[:])
	err = spec.LoadAndAssign(&s.objs, &ebpf.CollectionOptions{MapReplacements: set.Maps})
	set.CloseMaps()
	if err != nil {
		return nil, fmt.Errorf("load sk_steer (sk_lookup programs need Linux 5.9): %w", err)
	}
	if err := s.objs.SteerConfig.Put(uint32(0), steerSteerCfg{Ports: s.ports}); err != nil {
		s.objs.Close()
		return nil, fmt.Errorf("write steer_config: %w", err)
	}
	if err := s.attach(opts); err != nil {
		s.objs.Close()
		return nil, err
	}
	if err := set.Finish(); err != nil {
		s.objs.Close()
		return nil, fmt.Errorf("load sk_steer: %w", err)
	}
	return s, nil
}

// attach points the pinned link at the program, or attaches and pins one.
func (s *Steering) attach(opts Options) error {
	pin := filepath.Join(opts.PinPath, linkPin)
	if l, err := link.LoadPinnedLink(pin, nil); err == nil {
		defer l.Close()
		if err := l.Update(s.objs.SkSteer); err != nil {
			return fmt.Errorf("update pinned sk_lookup link %s: %w", pin, err)
		}
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("open pinned sk_lookup link %s: %w", pin, err)
	}
	ns, err := os.Open(opts.NetNS)
	if err != nil {
		return fmt.Errorf("open network namespace: %w", err)
	}
	defer ns.Close()
	l, err := link.AttachNetNs(int(ns.Fd()), s.objs.SkSteer)
	if err != nil {
		return fmt.Errorf("attach sk_lookup program to %s: %w", opts.NetNS, err)
	}
	defer l.Close()
	if err := l.Pin(pin); err != nil {
		return fmt.Errorf("pin sk_lookup link: %w", err)
	}
	return nil
}

// Close releases the agent's handles; the pinned program keeps steering.
func (s *Steering) Close() error {
	return s.objs.Close()
}

// Sync makes the routes equal to routes and, when pid is an nginx master's,
// puts its listeners in the socket map. A route whose class has no listener
// yet is written anyway: its connections are refused (as without a route)
// until the listener is known.
func (s *Steering) Sync(pid int, routes []Route) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	want := make(map[steerSteerKey]steerSteerClass, len(routes))
	ports := s.ports
	for _, r := range routes {
		if r.Class >= classes || !r.VIP.Addr().IsValid() || r.Class >= fixed && r.Listen == 0 {
			errs = append(errs, fmt.Errorf("route %s: invalid", r.VIP))
			continue
		}
		if r.Class >= fixed {
			ports[r.Class] = r.Listen // nginx's HTTP or HTTPS listener: its port may change with its group
		}
		want[routeKey(r.VIP)] = steerSteerClass(r.Class)
	}
	if ports != s.ports {
		// Listeners of new ports: found again in the master they were last
		// looked for in, when the caller does not name one.
		s.ports = ports
		if err := s.objs.SteerConfig.Put(uint32(0), steerSteerCfg{Ports: s.ports}); err != nil {
			errs = append(errs, fmt.Errorf("write steer_config: %w", err))
		}
		if pid <= 0 {
			pid = s.pid
		}
	}
	if pid > 0 {
		if err := s.register(pid); err != nil {
			errs = append(errs, err)
		}
		s.pid = pid
	}
	have := map[steerSteerKey]steerSteerClass{}
	var k steerSteerKey
	var v steerSteerClass
	it := s.objs.SteerRoutes.Iterate()
	for it.Next(&k, &v) {
		have[k] = v
	}
	if err := it.Err(); err != nil {
		errs = append(errs, fmt.Errorf("read steer_routes: %w", err))
	}
	for k, v := range want {
		if old, ok := have[k]; ok && old == v {
			continue
		}
		if err := s.objs.SteerRoutes.Put(k, v); err != nil {
			errs = append(errs, fmt.Errorf("write route %s: %w", keyString(k), err))
		}
	}
	for k := range have {
		if _, ok := want[k]; ok {
			continue
		}
		if err := s.objs.SteerRoutes.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("delete route %s: %w", keyString(k), err))
		}
	}
	return errors.Join(errs...)
}

// register finds the master's listening TCP sockets on the wildcard addresses
// and the listeners' ports and puts each at its slot (class*2, +1 for IPv6).
func (s *Steering) register(pid int) error {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("open nginx master %d: %w", pid, err)
	}
	defer unix.Close(pidfd)
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("list nginx master's files: %w", err)
	}
	var errs []error
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil || !strings.HasPrefix(target, "socket:") {
			continue
		}
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fd, err := unix.PidfdGetfd(pidfd, n, 0)
		if err != nil {
			errs = append(errs, fmt.Errorf("take nginx master's socket %d: %w", n, err))
			continue
		}
		if slot, ok := s.listenerSlot(fd); ok {
			if err := s.objs.SteerSocks.Update(slot, uint64(fd), ebpf.UpdateAny); err != nil {
				errs = append(errs, fmt.Errorf("put nginx listener in steer_socks[%d]: %w", slot, err))
			}
		}
		unix.Close(fd)
	}
	return errors.Join(errs...)
}

// listenerSlot says whether fd is one of the listeners and at which slot.
func (s *Steering) listenerSlot(fd int) (uint32, bool) {
	if t, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err != nil || t != unix.SOCK_STREAM {
		return 0, false
	}
	if l, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || l != 1 {
		return 0, false
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return 0, false
	}
	var port int
	var six bool
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		if a.Addr != [4]byte{} {
			return 0, false
		}
		port = a.Port
	case *unix.SockaddrInet6:
		if a.Addr != [16]byte{} {
			return 0, false
		}
		port, six = a.Port, true
	default:
		return 0, false
	}
	for c, p := range s.ports {
		if p != 0 && int(p) == port {
			slot := uint32(c) * 2
			if six {
				slot++
			}
			return slot, true
		}
	}
	return 0, false
}

// Listeners reports which slots hold a listener (class*2, +1 for IPv6).
func (s *Steering) Listeners() []bool {
	got := make([]bool, 2*classes)
	for slot := range got {
		var cookie uint64
		got[slot] = s.objs.SteerSocks.Lookup(uint32(slot), &cookie) == nil
	}
	return got
}

// Counts are the program's verdicts since it was first loaded.
type Counts struct {
	Steered, NoListener, AssignFailed, Direct uint64
}

// Counts sums the program's per-CPU counters.
func (s *Steering) Counts() (Counts, error) {
	read := func(r steerSteerReason) (uint64, error) {
		var per []uint64
		if err := s.objs.SteerStats.Lookup(uint32(r), &per); err != nil {
			return 0, fmt.Errorf("read steer_stats: %w", err)
		}
		var n uint64
		for _, v := range per {
			n += v
		}
		return n, nil
	}
	var c Counts
	var errs []error
	for _, f := range []struct {
		r   steerSteerReason
		dst *uint64
	}{
		{steerSteerReasonSTEER_STEERED, &c.Steered},
		{steerSteerReasonSTEER_NO_LISTENER, &c.NoListener},
		{steerSteerReasonSTEER_ASSIGN_FAILED, &c.AssignFailed},
		{steerSteerReasonSTEER_DIRECT, &c.Direct},
	} {
		n, err := read(f.r)
		*f.dst = n
		errs = append(errs, err)
	}
	return c, errors.Join(errs...)
}

// routeKey is a route's map key: the address as IPv4-mapped IPv6.
func routeKey(vip netip.AddrPort) steerSteerKey {
	return steerSteerKey{Addr: vip.Addr().As16(), Port: vip.Port(), Proto: unix.IPPROTO_TCP}
}

func keyString(k steerSteerKey) string {
	return netip.AddrPortFrom(netip.AddrFrom16(k.Addr).Unmap(), k.Port).String()
}

// Remove takes the program out of the network namespace and removes its pins
// from pinPath, for an agent that runs without steering after one that
// steered (a pinned link would keep old routes, and keep refusing the
// listeners' ports). Nothing pinned is not an error. The link is detached
// before its pin goes: unpinned alone, the kernel frees it later, from a
// worker, and a connection to a listener's own port made meanwhile is still
// refused (CI run 17, beside a loaded machine).
func Remove(pinPath string) error {
	var errs []error
	if l, err := link.LoadPinnedLink(filepath.Join(pinPath, linkPin), nil); err == nil {
		if err := l.Detach(); err != nil {
			errs = append(errs, fmt.Errorf("detach %s: %w", linkPin, err))
		}
		l.Close()
	} else if !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("open pinned link %s: %w", linkPin, err))
	}
	if err := os.Remove(filepath.Join(pinPath, linkPin)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("remove pin %s: %w", linkPin, err))
	}
	errs = append(errs, pins.Remove(pinPath, steerMapSteerRoutes, steerMapSteerSocks, steerMapSteerConfig, steerMapSteerStats))
	return errors.Join(errs...)
}
