package dataplane

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/portico-edge/portico/dataplane/bpftest"
	"github.com/portico-edge/portico/test/netlab"
)

// modeLab is one namespace with a veth (eth0, native XDP) and a bridge (br1,
// which has no native XDP), and a pin directory of its own.
type modeLab struct {
	ns, pin string
}

func newModeLab(t *testing.T) *modeLab {
	t.Helper()
	bpftest.Require(t)
	lab, err := netlab.New("pm")
	if err != nil {
		t.Fatalf("create lab: %v", err)
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Errorf("clean up lab: %v", err)
		}
	})
	n, err := lab.AddNode("ed", netip.MustParsePrefix("10.214.0.10/24"), mustMAC("02:00:0a:d6:00:0a"))
	if err != nil {
		t.Fatalf("add node: %v", err)
	}
	must(t, netlab.IP("-n", n.NS, "link", "add", "br1", "address", "02:00:0a:d6:00:0b", "type", "bridge"))
	must(t, netlab.IP("-n", n.NS, "link", "set", "br1", "up"))
	l := &modeLab{ns: n.NS, pin: "/sys/fs/bpf/" + lab.Prefix}
	t.Cleanup(func() {
		if err := netlab.Do(l.ns, func() error { return Uninstall(l.pin) }); err != nil {
			t.Errorf("uninstall: %v", err)
		}
	})
	return l
}

// attach loads xdp_lb with mode and attaches it to iface; the Dataplane is
// closed at the end of the test (its link stays pinned).
func (l *modeLab) attach(t *testing.T, iface string, mode XDPMode) (*Dataplane, error) {
	t.Helper()
	d, err := Load(Options{PinPath: l.pin, RingSize: testRing, FlowEntries: 4096, XDPMode: mode})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if err := netlab.Do(l.ns, func() error { return d.Attach(iface) }); err != nil {
		d.Close()
		return nil, err
	}
	t.Cleanup(func() { d.Close() })
	return d, nil
}

// kernelMode is the mode of the XDP program iface runs as the kernel reports
// it, and that program's id (0: none).
func (l *modeLab) kernelMode(t *testing.T, iface string) (AttachMode, ebpf.ProgramID) {
	t.Helper()
	var p xdpPrograms
	must(t, netlab.Do(l.ns, func() error {
		ifc, err := net.InterfaceByName(iface)
		if err == nil {
			p, err = xdpProgramsOf(ifc.Index)
		}
		return err
	}))
	switch {
	case p.native != 0 && p.generic == 0:
		return AttachNative, p.native
	case p.generic != 0 && p.native == 0:
		return AttachGeneric, p.generic
	case p == xdpPrograms{}:
		return "", 0
	}
	t.Fatalf("%s runs XDP programs %+v", iface, p)
	return "", 0
}

// modeMetric is what d's collector exports as portico_xdp_attach_mode, by mode.
func modeMetric(t *testing.T, d *Dataplane) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	must(t, reg.Register(NewCollector(d)))
	fams, err := reg.Gather()
	must(t, err)
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "portico_xdp_attach_mode" {
			continue
		}
		for _, m := range f.GetMetric() {
			out[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
	}
	return out
}

// checkMode checks that d reports mode, in AttachMode and in its metric.
func checkMode(t *testing.T, d *Dataplane, mode AttachMode) {
	t.Helper()
	if got := d.AttachMode(); got != mode {
		t.Errorf("attach mode %q, want %s", got, mode)
	}
	want := map[string]float64{"native": 0, "generic": 0}
	want[string(mode)] = 1
	if diff := cmp.Diff(want, modeMetric(t, d)); diff != "" {
		t.Errorf("portico_xdp_attach_mode (-want +got):\n%s", diff)
	}
}

// TestAttachModeNative: a veth takes xdp_lb in native mode, and the Dataplane
// and its portico_xdp_attach_mode say so; a restart, in either XDP mode,
// re-uses the pinned link and finds it native.
func TestAttachModeNative(t *testing.T) {
	l := newModeLab(t)
	d, err := l.attach(t, "eth0", XDPNative)
	if err != nil {
		t.Fatalf("attach native to a veth: %v", err)
	}
	checkMode(t, d, AttachNative)
	if got, _ := l.kernelMode(t, "eth0"); got != AttachNative {
		t.Errorf("the kernel reports mode %q, want native", got)
	}
	must(t, d.Close())
	for _, mode := range []XDPMode{XDPNative, XDPBestEffort} {
		d, err := l.attach(t, "eth0", mode)
		if err != nil {
			t.Fatalf("re-attach with %s through the pinned link: %v", mode, err)
		}
		checkMode(t, d, AttachNative)
		must(t, d.Close())
	}
}

// TestAttachModeNoNativeXDP: on a device whose driver has no native XDP (a
// bridge), xdp mode native refuses, naming the driver, the kernel's error and
// best-effort, and attaches nothing; best-effort attaches in generic mode and
// says so (AttachMode, the metric). A restart with native then refuses the
// pinned generic link without detaching or replacing its program, and one with
// best-effort re-uses it and finds it generic.
func TestAttachModeNoNativeXDP(t *testing.T) {
	l := newModeLab(t)
	_, err := l.attach(t, "br1", XDPNative)
	if err == nil {
		t.Fatal("xdp mode native attached to a bridge")
	}
	t.Logf("native refused: %v", err)
	for _, want := range []string{"xdp mode native", "br1", "driver bridge", "best-effort", "generic"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if !errors.Is(err, unix.EOPNOTSUPP) {
		t.Errorf("error %q does not wrap the kernel's EOPNOTSUPP", err)
	}
	if mode, id := l.kernelMode(t, "br1"); id != 0 {
		t.Errorf("after the refusal br1 runs program %d in %s mode", id, mode)
	}

	d, err := l.attach(t, "br1", XDPBestEffort)
	if err != nil {
		t.Fatalf("attach best-effort: %v", err)
	}
	checkMode(t, d, AttachGeneric)
	mode, prog := l.kernelMode(t, "br1")
	if mode != AttachGeneric || prog != linkProgram(t, d) {
		t.Errorf("the kernel reports program %d in mode %q, want %d in generic", prog, mode, linkProgram(t, d))
	}
	must(t, d.Close())

	_, err = l.attach(t, "br1", XDPNative)
	if err == nil {
		t.Fatal("xdp mode native re-used a pinned link in generic mode")
	}
	t.Logf("native refused the pinned link: %v", err)
	for _, want := range []string{"xdp mode native", "generic mode", "portico uninstall", "best-effort"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if m, id := l.kernelMode(t, "br1"); m != AttachGeneric || id != prog {
		t.Errorf("after the refusal br1 runs program %d in mode %q, want %d still, in generic mode", id, m, prog)
	}

	d, err = l.attach(t, "br1", XDPBestEffort)
	if err != nil {
		t.Fatalf("re-attach best-effort through the pinned link: %v", err)
	}
	checkMode(t, d, AttachGeneric)
	if now := linkProgram(t, d); now == prog {
		t.Errorf("the pinned link still runs program %d: not replaced", prog)
	}
}
