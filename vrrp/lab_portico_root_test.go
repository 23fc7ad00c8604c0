package vrrp

import (
	"context"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/portico-edge/portico/test/testenv"
)

func labInstance(prio uint8, interval time.Duration) InstanceConfig {
	return InstanceConfig{VRID: 42, Priority: prio, AdvertInterval: Duration{interval}}
}

func TestLabElection(t *testing.T) {
	l := newLab(t, 3)
	for i, p := range []uint8{100, 200, 150} {
		l.startPortico(l.nodes[i], labInstance(p, 100*time.Millisecond))
	}
	// Master_Down_Interval at 100ms is under 400ms; allow plenty.
	l.electAndHold(l.nodes[1], 5*time.Second, time.Second)
}

func TestLabFailover(t *testing.T) {
	l := newLab(t, 3)
	procs := make([]*proc, 3)
	for i, p := range []uint8{100, 200, 150} {
		procs[i] = l.startPortico(l.nodes[i], labInstance(p, 100*time.Millisecond))
	}
	l.electAndHold(l.nodes[1], 5*time.Second, 300*time.Millisecond)
	if err := l.ping(); err != nil { // resolves the VIP's neighbour entry
		t.Fatal(err)
	}
	l.clientReachesVia(l.nodes[1], 0)
	procs[1].signal(syscall.SIGKILL)
	procs[1].wait(5 * time.Second)
	survivors := []*labNode{l.nodes[0], l.nodes[2]}
	took, err := testenv.Poll(context.Background(), 5*time.Second, 2*time.Millisecond, func() bool { o := l.owners(survivors...); return len(o) == 1 && o[0] == "n2" })
	if err != nil {
		t.Fatalf("after %v survivors holding the VIP = %s, want [n2]", took, fmtOwners(l.owners(survivors...)))
	}
	t.Logf("n2 took over %v after the kill", took)
	l.clientReachesVia(l.nodes[2], 3*time.Second)
}

func TestLabGracefulStop(t *testing.T) {
	l := newLab(t, 3)
	// A 1s advert makes the two paths far apart: a priority-0 release hands over
	// after Skew_Time (414ms at priority 150), a silent Master only after
	// Master_Down_Interval (3.4s).
	const interval = time.Second
	master := l.startPortico(l.nodes[0], labInstance(200, interval))
	l.startPortico(l.nodes[1], labInstance(150, interval))
	l.startPortico(l.nodes[2], labInstance(100, interval))
	l.electAndHold(l.nodes[0], 10*time.Second, 200*time.Millisecond)
	master.signal(syscall.SIGTERM)
	survivors := []*labNode{l.nodes[1], l.nodes[2]}
	took, err := testenv.Poll(context.Background(), 5*time.Second, 2*time.Millisecond, func() bool { return len(l.owners(survivors...)) > 0 })
	if o := l.owners(survivors...); err != nil || len(o) != 1 || o[0] != "n1" {
		t.Fatalf("after %v the survivors holding the VIP = %s, want [n1]", took, fmtOwners(o))
	}
	skew := time.Duration(256-150) * interval / 256
	t.Logf("n1 took over %v after SIGTERM (skew %v)", took, skew)
	if limit := skew + interval; took > limit {
		t.Errorf("takeover after %v, want within skew + one advert = %v", took, limit)
	}
	if !master.wait(5 * time.Second) {
		t.Fatal("n0 did not exit after SIGTERM")
	}
	if l.hasVIP(l.nodes[0]) {
		t.Error("n0 kept the VIP after a graceful stop")
	}
}

func TestLabPartitionHeal(t *testing.T) {
	l := newLab(t, 3)
	const interval = 300 * time.Millisecond
	l.startPortico(l.nodes[0], labInstance(200, interval))
	l.startPortico(l.nodes[1], labInstance(150, interval))
	l.startPortico(l.nodes[2], labInstance(100, interval))
	l.electAndHold(l.nodes[0], 5*time.Second, 2*interval)
	// Cut n0 off: it stays Master alone, and n1 becomes Master on the rest.
	l.ip("-n", l.sw, "link", "set", l.nodes[0].port, "down")
	two := func() bool { o := l.owners(); return len(o) == 2 && o[0] == "n0" && o[1] == "n1" }
	if took, err := testenv.Poll(context.Background(), 5*time.Second, 2*time.Millisecond, two); err != nil {
		t.Fatalf("owners during the partition = %s after %v, want [n0 n1]", fmtOwners(l.owners()), took)
	}
	time.Sleep(2 * interval)
	if !two() {
		t.Fatalf("owners during the partition = %s, want [n0 n1]", fmtOwners(l.owners()))
	}
	l.ip("-n", l.sw, "link", "set", l.nodes[0].port, "up")
	took, err := testenv.Poll(context.Background(), 5*time.Second, 2*time.Millisecond, func() bool { o := l.owners(); return len(o) == 1 && o[0] == "n0" })
	if err != nil {
		t.Fatalf("owners after the heal = %s after %v, want [n0]", fmtOwners(l.owners()), took)
	}
	t.Logf("one master %v after the heal (advert interval %v)", took, interval)
	// One advert interval, plus slack for a loaded machine and link bring-up.
	if limit := interval + 300*time.Millisecond; took > limit {
		t.Errorf("two masters for %v after the heal, want at most one advert interval (+300ms slack) = %v", took, limit)
	}
}

// TestLabSetVIPs: addresses added to and removed from a running virtual router
// move nothing. The Master stays Master with the new list on its interface and
// answers for an added address at once; the Backup, told each change a second
// before the Master (agents learn a change each at its own moment), never takes
// over while the adverts carry the other list.
func TestLabSetVIPs(t *testing.T) {
	l := newLab(t, 2)
	vip2 := netip.MustParseAddr("10.99.0.101")
	at := func(prio uint8, vips ...netip.Addr) InstanceConfig {
		ic := labInstance(prio, 100*time.Millisecond)
		ic.VIPs = vips
		return ic
	}
	p0 := l.startPortico(l.nodes[0], at(200, l.vip))
	p1 := l.startPortico(l.nodes[1], at(100, l.vip))
	l.electAndHold(l.nodes[0], 5*time.Second, 200*time.Millisecond)
	// Takeovers are counted from here: under load n1's process may start
	// enough before n0's to be Master for a moment in the first election.
	masters := func(p *proc) int {
		b, err := os.ReadFile(p.log)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(string(b), `"to":"master"`)
	}
	elected := []int{masters(p0), masters(p1)}
	holds := func(n *labNode, vips []netip.Addr) bool {
		for _, v := range []netip.Addr{l.vip, vip2} {
			if l.hasAddr(n, v) != slices.Contains(vips, v) {
				return false
			}
		}
		return true
	}
	old := []netip.Addr{l.vip}
	for _, vips := range [][]netip.Addr{{l.vip, vip2}, {vip2}} {
		l.writeConfig(l.nodes[1], at(100, vips...))
		p1.signal(syscall.SIGHUP)
		// Ten Master_Down_Intervals with the other list in the adverts.
		for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			if !holds(l.nodes[0], old) || !holds(l.nodes[1], nil) {
				t.Fatalf("the Backup has %v, the Master %v: n0 holds %v, n1 holds %v", vips, old, l.addrsOf(l.nodes[0]), l.addrsOf(l.nodes[1]))
			}
		}
		l.writeConfig(l.nodes[0], at(200, vips...))
		p0.signal(syscall.SIGHUP)
		if took, err := testenv.Poll(context.Background(), 2*time.Second, 2*time.Millisecond, func() bool { return holds(l.nodes[0], vips) && holds(l.nodes[1], nil) }); err != nil {
			t.Fatalf("both have %v: n0 holds %v, n1 holds %v", vips, l.addrsOf(l.nodes[0]), l.addrsOf(l.nodes[1]))
		} else {
			t.Logf("the Master holds %v %v after its SIGHUP", vips, took)
		}
		for _, v := range vips {
			if err := l.pingAddr(v); err != nil {
				t.Error(err)
			}
		}
		old = vips
	}
	for i, p := range []*proc{p0, p1} {
		if got := masters(p) - elected[i]; got != 0 {
			t.Errorf("n%d became Master %d times after the election, want 0", i, got)
		}
	}
}
