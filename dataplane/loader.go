package dataplane

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/portico-edge/portico/dataplane/pins"
)

// DefaultPinPath is where the maps, the program and the XDP link are pinned.
const DefaultPinPath = "/sys/fs/bpf/portico"

const (
	pinLink    = "link"
	pinProgram = "xdp_lb"
)

// DefaultTransition is how long a VIP's previous ring counts after its last change.
// A connection older than the change that sends a packet within it stays on its
// replica for good (it is pinned then); one silent for longer goes where the
// current ring says. Two minutes cover nginx's idle limits (keepalive_timeout 75 s,
// proxy_read_timeout 60 s), which end quieter connections anyway.
const DefaultTransition = 2 * time.Minute

// Options configure Load.
type Options struct {
	// PinPath is the bpffs directory for maps, program and link. Empty means
	// DefaultPinPath.
	PinPath string
	// RingSize is the number of slots of every Maglev ring, a prime. 0 means
	// DefaultRingSize. A change (or an upgrade from a version with another ring
	// layout) replaces the pinned rings: every flow is placed anew once.
	RingSize uint32
	// FlowEntries is the size of the flow table. 0 means the compiled default.
	FlowEntries uint32
	// Transition is how long the previous ring of a VIP counts after its last
	// change (see the package doc). 0 means DefaultTransition.
	Transition time.Duration
	// Arrival: when Load finds no pinned rings (a new node, or one back from a
	// reboot), the first Apply that writes rings starts each VIP in a
	// transition whose previous ring is the one the other directors most
	// likely held before this node's replica joined: built without the local
	// replica, with draining replicas still serving. A director that the
	// network starts sending established flows at once (BGP: the router
	// rehashes flows onto an edge the moment it announces) then sends them
	// where they are, not to its own replica, which has no socket for them.
	// Where the guess is wrong, the replica it names finds no socket and hands
	// the packet on (IPv4, see the package doc).
	Arrival bool
	// Rejoin: when Load finds pinned rings (the agent restarted; so did its
	// nginx, most likely), the first Apply that writes rings first applies
	// the same state with this node's own replicas Down, then the state
	// asked for. While the agent was away the other edges called its replica
	// down and gave its slots to others, and connections opened then live
	// there; the pinned rings never saw it. Replaying the down puts that ring
	// into this node's history too, so its chains agree with the others'
	// (bpf/README.md). If the replica was never called down the extra ring
	// names nobody's connection: a flow in its slots is this node's own, and
	// its stack is asked first.
	Rejoin bool
	// XDPMode is which attach modes Attach accepts. "" means XDPBestEffort.
	XDPMode XDPMode
	Logger  *zap.Logger

	// sockModel (tests only): has_connection reads the sock_model map, of
	// up to sockModel entries, instead of the kernel's sockets, so that
	// simulated nodes sharing one kernel each have a socket table of their own.
	sockModel uint32
	// spec (tests only): the object to load instead of the embedded one (the
	// previous release's, dataplane/testdata).
	spec *ebpf.CollectionSpec
	// legacyPins (tests only): pin the maps by their names, as versions before
	// layout versions did.
	legacyPins bool
}

// Dataplane is a loaded xdp_lb: its program and pinned maps, and the state Apply
// reconciles against.
type Dataplane struct {
	opts  Options
	log   *zap.Logger
	objs  lbObjects
	inner *ebpf.MapSpec // the ring template
	link  link.Link
	cfg   lbLbConfig
	st    applied
	// arriving: Options.Arrival and Load found no pinned rings; cleared by
	// the first Apply that writes a ring.
	arriving bool
	// rejoining: Options.Rejoin and Load found pinned rings; cleared by the
	// first Apply that writes a ring.
	rejoining bool
	// mode is the mode Attach found the program in; "" before Attach, or
	// when the mode of a pinned link could not be read.
	mode AttachMode
	// pins: the pinned maps, and the older layouts' pins Attach removes once
	// the program runs on the link. nil with Options.legacyPins.
	pins *pins.Set
}

// Load loads xdp_lb and its maps, reusing maps already pinned at opts.PinPath, so
// flows, rings and counters survive an agent restart. It mounts bpffs at
// /sys/fs/bpf if nothing is mounted there. It does not attach: see Attach.
func Load(opts Options) (*Dataplane, error) {
	if opts.PinPath == "" {
		opts.PinPath = DefaultPinPath
	}
	if opts.RingSize == 0 {
		opts.RingSize = DefaultRingSize
	}
	if opts.Transition <= 0 {
		opts.Transition = DefaultTransition
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.XDPMode == "" {
		opts.XDPMode = XDPBestEffort
	}
	if _, err := ParseXDPMode(string(opts.XDPMode)); err != nil {
		return nil, err
	}
	if err := ensureBPFFS(filepath.Dir(opts.PinPath)); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.PinPath, 0o700); err != nil {
		return nil, fmt.Errorf("create pin directory: %w", err)
	}
	var err error
	spec := opts.spec
	if spec == nil {
		if spec, err = loadLb(); err != nil {
			return nil, fmt.Errorf("load embedded xdp_lb object: %w", err)
		}
	}
	if err := pins.Remove(opts.PinPath, retiredMaps...); err != nil {
		return nil, fmt.Errorf("unpin maps earlier versions pinned: %w", err)
	}
	for _, outer := range []string{lbMapRings, lbMapPrevRings, lbMapMidRings} {
		spec.Maps[outer].InnerMap.MaxEntries = uint32(ringElems(opts.RingSize))
	}
	if opts.FlowEntries != 0 {
		spec.Maps[lbMapFlows].MaxEntries = opts.FlowEntries
	}
	if opts.sockModel != 0 {
		spec.Maps[lbMapSockModel].MaxEntries = opts.sockModel
		if err := spec.Variables["lb_sock_model"].Set(uint32(1)); err != nil {
			return nil, fmt.Errorf("set lb_sock_model: %w", err)
		}
	}
	d := &Dataplane{opts: opts, log: opts.Logger, inner: spec.Maps[lbMapRings].InnerMap.Copy()}
	var hadRings bool
	if opts.legacyPins {
		hadRings, err = d.loadLegacy(spec)
	} else {
		hadRings, err = d.loadVersioned(spec)
	}
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load xdp_lb: %w", verifierError{ve})
		}
		return nil, fmt.Errorf("load xdp_lb: %w", err)
	}
	d.arriving = opts.Arrival && !hadRings
	d.rejoining = opts.Rejoin && hadRings
	if err := d.objs.LbCfg.Lookup(uint32(0), &d.cfg); err != nil {
		d.Close()
		return nil, fmt.Errorf("read map lb_cfg: %w", err)
	}
	d.cfg.RingSize = opts.RingSize
	d.cfg.RingLayout = uint16(lbLbLimitsLB_RING_LAYOUT)
	d.cfg.Generation++ // a new program: no cached flow is trusted
	if err := d.writeConfig(); err != nil {
		d.Close()
		return nil, err
	}
	if err := d.recover(); err != nil {
		d.Close()
		return nil, err
	}
	// Pinned flows left by an earlier agent (or an earlier version, which pinned
	// every flow) are consulted again for LB_PIN_IDLE_SEC, hand-off pins too.
	var fk lbFlowKey
	if err := d.objs.Flows.NextKey(nil, &fk); err == nil {
		for _, m := range []*ebpf.Map{d.objs.PinClock, d.objs.RelayClock} {
			// The program's clock is the coarse one, which lags the precise
			// clock by up to a tick: a precise time would lie ahead of it,
			// and the program (now - then, unsigned) would take the pins
			// for idle until it caught up.
			if err := m.Put(uint32(0), uint64(coarseNow())); err != nil {
				d.Close()
				return nil, fmt.Errorf("update map %s: %w", m, err)
			}
		}
	}
	return d, nil
}

// pinnedMaps are the maps pinned, with what their layout means beyond their
// spec: the rings' layout (LB_RING_LAYOUT: what a slot holds, how the mid rings
// are kept) and size are part of the rings' layout, so a change of either makes
// new rings (the first Apply fills them: every flow is placed anew once, a
// transition under way is forgotten). flow_cache, the memos, the chain room,
// self_addr, tag_macs and mac_tags are not pinned: a new program starts a new
// generation, and Apply writes the rest.
func pinnedMaps(opts Options, ringsFit bool) []pins.Map {
	ring := fmt.Sprintf("ring layout %d, %d slots", lbLbLimitsLB_RING_LAYOUT, opts.RingSize)
	var out []pins.Map
	for _, name := range []string{lbMapRings, lbMapPrevRings, lbMapMidRings, lbMapRingsMeta} {
		out = append(out, pins.Map{Name: name, Meaning: ring, State: true, Legacy: ringsFit})
	}
	for _, name := range []string{lbMapRingChanged, lbMapVips, lbMapBackends, lbMapFlows, lbMapNewPins, lbMapPinClock, lbMapRelayClock,
		lbMapHeldClock, lbMapLbCfg, lbMapPeers, lbMapSitePeers, lbMapTunnel, lbMapUdpSeen} {
		out = append(out, pins.Map{Name: name, State: true, Legacy: true})
	}
	for _, name := range []string{lbMapVipStats, lbMapBackendStats, lbMapReasonStats} {
		out = append(out, pins.Map{Name: name, Legacy: true})
	}
	return out
}

// retiredMaps are maps earlier versions pinned and this one does not (every
// layout of them is unpinned at start): versions before the two-ring design
// pinned flow_cache. A map that leaves the pinned set joins them.
var retiredMaps = []string{lbMapFlowCache}

// conversions turn entries of older layouts of a pinned map into this
// version's, by map and the older layout's entry version (pins.Version): one is
// written with every change of an entry's layout whose state must survive an
// upgrade (flows, new_pins: connections pinned across ring changes). None is
// needed yet: no layout changed since pins carried versions. A changed map
// without one starts empty (logged, and counted in portico_xdp_pinned_maps).
var conversions = pins.Conversions{}

// pinVersions are the layout versions of the pinned maps of the embedded
// object under opts (its RingSize), by map name.
func pinVersions(opts Options) (map[string]string, error) {
	spec, err := loadLb()
	if err != nil {
		return nil, fmt.Errorf("load embedded xdp_lb object: %w", err)
	}
	for _, outer := range []string{lbMapRings, lbMapPrevRings, lbMapMidRings} {
		spec.Maps[outer].InnerMap.MaxEntries = uint32(ringElems(opts.RingSize))
	}
	out := map[string]string{}
	for _, m := range pinnedMaps(opts, true) {
		out[m.Name] = pins.Version(spec.Maps[m.Name], m.Meaning)
	}
	return out, nil
}

// PinnedMaps reports what Load did with each pinned map (kept, taken over,
// migrated from an older layout, lost); nil for a dataplane loaded without
// layout versions.
func (d *Dataplane) PinnedMaps() []pins.Result {
	if d.pins == nil {
		return nil
	}
	return d.pins.Results
}

// loadVersioned loads the program with its maps pinned under versioned names
// (package pins): maps of an older layout are carried over, and their pins
// removed once the program runs (at once if no link is pinned, else by Attach).
// hadRings: rings were pinned before (of any layout).
func (d *Dataplane) loadVersioned(spec *ebpf.CollectionSpec) (hadRings bool, err error) {
	fit, err := legacyRingsFit(d.opts)
	if err != nil {
		return false, err
	}
	set, err := pins.Open(spec, pins.Options{Dir: d.opts.PinPath, Link: filepath.Join(d.opts.PinPath, pinLink),
		Maps: pinnedMaps(d.opts, fit), Convert: conversions, Log: d.log})
	if err != nil {
		return false, err
	}
	d.pins = set
	for _, r := range set.Results {
		if r.Map == lbMapRings && r.Outcome != pins.New {
			hadRings = true
		}
	}
	err = spec.LoadAndAssign(&d.objs, &ebpf.CollectionOptions{MapReplacements: set.Maps})
	set.CloseMaps()
	if err != nil {
		set.Close()
		return false, err
	}
	if !set.Live {
		if err := set.Finish(); err != nil {
			d.Close()
			return false, err
		}
	}
	return hadRings, nil
}

// loadLegacy pins as versions before pins.Version did: by the maps' names
// (tests only: the previous release's pins).
func (d *Dataplane) loadLegacy(spec *ebpf.CollectionSpec) (hadRings bool, err error) {
	// The Go side expects this version's maps: one the older object lacks
	// (held_clock) is made beside its program, which never reads it.
	cur, err := loadLb()
	if err != nil {
		return false, err
	}
	for name, ms := range cur.Maps {
		if _, ok := spec.Maps[name]; !ok {
			spec.Maps[name] = ms.Copy()
		}
	}
	for _, m := range pinnedMaps(d.opts, true) {
		if ms, ok := spec.Maps[m.Name]; ok { // an older object lacks the newer maps
			ms.Pinning = ebpf.PinByName
		}
	}
	_, err = os.Stat(filepath.Join(d.opts.PinPath, lbMapRings))
	hadRings = err == nil
	return hadRings, spec.LoadAndAssign(&d.objs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: d.opts.PinPath}})
}

// legacyRingsFit tells whether rings pinned without a version (before pins
// carried layouts) serve this program: of this size, in this layout (the
// lb_cfg pinned beside them says). If not, their state is not carried over.
func legacyRingsFit(opts Options) (bool, error) {
	cfgMap, err := ebpf.LoadPinnedMap(filepath.Join(opts.PinPath, lbMapLbCfg), nil)
	if errors.Is(err, os.ErrNotExist) {
		return true, nil // none pinned
	}
	if err != nil {
		return false, fmt.Errorf("open pinned lb_cfg: %w", err)
	}
	defer cfgMap.Close()
	var c lbLbConfig
	if err := cfgMap.Lookup(uint32(0), &c); err != nil {
		return false, fmt.Errorf("read pinned lb_cfg: %w", err)
	}
	return c.RingSize == 0 || (c.RingSize == opts.RingSize && c.RingLayout == uint16(lbLbLimitsLB_RING_LAYOUT)), nil
}

// Program is the loaded xdp_lb, for BPF_PROG_TEST_RUN.
func (d *Dataplane) Program() *ebpf.Program { return d.objs.XdpLb }

// Attach attaches xdp_lb to iface with a BPF link, pinned so it outlives the
// agent. If a pinned link exists (an agent restart), the running program is
// replaced atomically instead, so forwarding never stops, and the link keeps the
// mode it was attached in. A new link is attached in native mode; where that
// fails, XDPBestEffort falls back to generic mode with a warning, and XDPNative
// returns the kernel's error. XDPNative also refuses a pinned link in generic
// mode: only an uninstall may detach it. AttachMode reports the mode.
func (d *Dataplane) Attach(iface string) error {
	ifc, err := net.InterfaceByName(iface)
	if err != nil {
		return fmt.Errorf("find interface %s: %w", iface, err)
	}
	if len(ifc.HardwareAddr) != 6 {
		return fmt.Errorf("interface %s has no Ethernet address", iface)
	}
	d.cfg.Mac = mac6(ifc.HardwareAddr)
	if err := d.writeConfig(); err != nil {
		return err
	}
	linkPath := filepath.Join(d.opts.PinPath, pinLink)
	if l, err := link.LoadPinnedLink(linkPath, nil); err == nil {
		if err := d.replace(l, ifc, linkPath); err != nil {
			l.Close()
			return err
		}
		if err := d.finishPins(); err != nil {
			return err
		}
		return d.pinProgram()
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("load pinned link %s: %w", linkPath, err)
	}

	l, err := link.AttachXDP(link.XDPOptions{Program: d.objs.XdpLb, Interface: ifc.Index, Flags: link.XDPDriverMode})
	mode := AttachNative
	if err != nil && d.opts.XDPMode == XDPNative {
		return nativeRefused(iface, err)
	}
	if err != nil {
		d.log.Warn("native xdp attach failed, falling back to generic mode", zap.String("iface", iface),
			zap.String("driver", driverName(iface)), zap.Error(err))
		l, err = link.AttachXDP(link.XDPOptions{Program: d.objs.XdpLb, Interface: ifc.Index, Flags: link.XDPGenericMode})
		if err != nil {
			return fmt.Errorf("attach xdp to %s: %w", iface, err)
		}
		mode = AttachGeneric
	}
	if err := l.Pin(linkPath); err != nil {
		l.Close()
		return fmt.Errorf("pin xdp link: %w", err)
	}
	d.link, d.mode = l, mode
	d.log.Info("xdp program attached", zap.String("iface", iface), zap.String("mode", string(mode)))
	return d.pinProgram()
}

// replace puts the loaded program on the pinned link l, which an earlier agent
// attached, unless the link is on another interface, or in generic mode while
// XDPNative asks for native: it never detaches the running program.
func (d *Dataplane) replace(l link.Link, ifc *net.Interface, linkPath string) error {
	info, err := l.Info()
	if err != nil {
		return fmt.Errorf("read pinned link info: %w", err)
	}
	if x := info.XDP(); x == nil || int(x.Ifindex) != ifc.Index {
		return fmt.Errorf("pinned link %s is not attached to %s: uninstall first", linkPath, ifc.Name)
	}
	mode, err := attachModeOf(ifc.Index, info.Program)
	switch {
	case err != nil && d.opts.XDPMode == XDPNative:
		return fmt.Errorf("find the mode of the pinned xdp link on %s (xdp mode native must know it is native): %w", ifc.Name, err)
	case err != nil:
		d.log.Warn("cannot tell the mode of the pinned xdp link", zap.String("iface", ifc.Name), zap.Error(err))
	case mode != AttachNative && d.opts.XDPMode == XDPNative:
		return fmt.Errorf("xdp mode native: xdp_lb runs on %s in %s mode, attached by an earlier agent through the pinned link %s, "+
			"and an agent never detaches it (forwarding goes on across restarts and upgrades): run 'portico uninstall' on the node "+
			"and restart the agent to attach in native mode, or use xdp mode best-effort", ifc.Name, mode, linkPath)
	}
	if err := l.Update(d.objs.XdpLb); err != nil {
		return fmt.Errorf("replace program on pinned link: %w", err)
	}
	d.link, d.mode = l, mode
	d.log.Info("xdp program replaced on pinned link", zap.String("iface", ifc.Name), zap.String("mode", string(orUnknown(mode))))
	return nil
}

// finishPins removes the pins of older layouts now that the program runs on
// the link, after copying what the old program wrote meanwhile.
func (d *Dataplane) finishPins() error {
	if d.pins == nil {
		return nil
	}
	if err := d.pins.Finish(); err != nil {
		return fmt.Errorf("finish the upgrade of the pinned maps: %w", err)
	}
	return nil
}

// nativeRefused is the error of XDPNative when the native attach to iface failed
// with err.
func nativeRefused(iface string, err error) error {
	drv := driverName(iface)
	if drv == "" {
		drv = "unknown"
	}
	hint := ""
	if errors.Is(err, unix.EOPNOTSUPP) {
		hint = " (the driver has no native XDP, or not in its current configuration)"
	}
	return fmt.Errorf("xdp mode native: attach xdp_lb to %s (driver %s) in native mode: %w%s; "+
		"xdp mode best-effort would fall back to generic mode, which runs after the kernel has allocated each packet",
		iface, drv, err, hint)
}

// AttachMode is the mode the program runs in since Attach: AttachNative or
// AttachGeneric; "" before Attach, or when the mode of a pinned link could not
// be read (XDPBestEffort goes on without it).
func (d *Dataplane) AttachMode() AttachMode { return d.mode }

func orUnknown(m AttachMode) AttachMode {
	if m == "" {
		return "unknown"
	}
	return m
}

// pinProgram pins the current program so `bpftool prog show pinned` finds it.
func (d *Dataplane) pinProgram() error {
	p := filepath.Join(d.opts.PinPath, pinProgram)
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unpin old program: %w", err)
	}
	if err := d.objs.XdpLb.Pin(p); err != nil {
		return fmt.Errorf("pin program: %w", err)
	}
	return nil
}

// Close releases this process's handles. Pinned maps, program and link stay, and
// so does forwarding: this is what an agent restart or upgrade does.
func (d *Dataplane) Close() error {
	var errs []error
	if d.link != nil {
		errs = append(errs, d.link.Close())
	}
	errs = append(errs, d.objs.Close())
	if d.pins != nil {
		d.pins.Close()
	}
	return errors.Join(errs...)
}

// Uninstall detaches the pinned XDP link at pinPath (DefaultPinPath if empty) and
// removes every pinned object. Missing pieces are not an error.
func Uninstall(pinPath string) error {
	if pinPath == "" {
		pinPath = DefaultPinPath
	}
	linkPath := filepath.Join(pinPath, pinLink)
	if l, err := link.LoadPinnedLink(linkPath, nil); err == nil {
		// Detached now: without, the kernel frees the unpinned link later,
		// from a worker, and the program runs on meanwhile.
		derr := l.Detach()
		if errors.Is(derr, ebpf.ErrNotSupported) {
			derr = nil
		}
		uerr := l.Unpin()
		cerr := l.Close()
		if err := errors.Join(derr, uerr, cerr); err != nil {
			return fmt.Errorf("detach pinned link: %w", err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("load pinned link %s: %w", linkPath, err)
	}
	if err := os.RemoveAll(pinPath); err != nil {
		return fmt.Errorf("remove %s: %w", pinPath, err)
	}
	return nil
}

func (d *Dataplane) writeConfig() error {
	if err := d.objs.LbCfg.Put(uint32(0), &d.cfg); err != nil {
		return fmt.Errorf("update map lb_cfg: %w", err)
	}
	return nil
}

// ensureBPFFS mounts bpffs at dir unless one is mounted there already.
func ensureBPFFS(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err == nil && uint32(st.Type) == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs at %s (is CAP_SYS_ADMIN missing?): %w", dir, err)
	}
	return nil
}

// SetMAC sets the source MAC for XDP_TX without attaching (fixtures, benchmarks).
func (d *Dataplane) SetMAC(mac net.HardwareAddr) error {
	d.cfg.Mac = mac6(mac)
	return d.writeConfig()
}

// ClearFlows empties the tables of pinned flows (flows and new_pins) and retires
// every CPU's flow cache, so every flow is decided afresh (benchmarks use it).
func (d *Dataplane) ClearFlows() error {
	d.cfg.Generation++
	if err := d.writeConfig(); err != nil {
		return err
	}
	for _, m := range []*ebpf.Map{d.objs.Flows, d.objs.NewPins} {
		var k lbFlowKey
		var keys []lbFlowKey
		var v lbFlowVal
		it := m.Iterate()
		for it.Next(&k, &v) {
			keys = append(keys, k)
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("read map %s: %w", m, err)
		}
		for _, k := range keys {
			m.Delete(&k)
		}
	}
	return nil
}

// Attached reports whether the program is attached through this process's link
// (false once someone detached it, e.g. with bpftool).
func (d *Dataplane) Attached() bool {
	if d.link == nil {
		return false
	}
	info, err := d.link.Info()
	if err != nil {
		return false
	}
	x := info.XDP()
	return x != nil && x.Ifindex != 0
}

// monotonicNow is the clock of bpf_ktime_get_coarse_ns (CLOCK_MONOTONIC), in ns.
func monotonicNow() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(ts.Nano())
}

// verifierError is a verifier's rejection that prints the verifier's whole log
// (%+v), not its last line, and still unwraps to the *ebpf.VerifierError.
type verifierError struct{ *ebpf.VerifierError }

func (e verifierError) Error() string { return fmt.Sprintf("%+v", e.VerifierError) }

func (e verifierError) Unwrap() error { return e.VerifierError }
