package vrrp

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/portico-edge/portico/test/testenv"
)

// keepalived is a keepalived daemon the test started: the parent process and the
// VRRP child it forks, whose PID it writes to a file.
type keepalived struct {
	parent  *proc
	vrrpPID string
}

// startKeepalived runs keepalived in n with its own config, pid files and no
// respawn, logging to the console.
func (l *lab) startKeepalived(n *labNode, version int, prio uint8, interval time.Duration) *keepalived {
	l.t.Helper()
	bin := testenv.RequireProgram(l.t, "keepalived")
	dir := filepath.Join(l.dir, n.name+"-keepalived")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		l.t.Fatal(err)
	}
	conf := fmt.Sprintf(`global_defs {
    router_id %s
    vrrp_version %d
    enable_script_security
}
vrrp_instance vi {
    state BACKUP
    interface eth0
    virtual_router_id 42
    priority %d
    advert_int %s
    virtual_ipaddress {
        %s/%d dev eth0
    }
}
`, n.ns, version, prio, strconv.FormatFloat(interval.Seconds(), 'f', -1, 64), l.vip, l.vip.BitLen())
	confPath := filepath.Join(dir, "keepalived.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		l.t.Fatal(err)
	}
	k := &keepalived{vrrpPID: filepath.Join(dir, "vrrp.pid")}
	k.parent = l.start(n.name+"-keepalived", n, nil, bin,
		"--dont-fork", "--log-console", "--log-detail", "--vrrp", "--dont-respawn", "--no-syslog",
		"-f", confPath, "-p", filepath.Join(dir, "keepalived.pid"), "-r", k.vrrpPID)
	// The VRRP child outlives a killed parent: kill it by its PID at cleanup too
	// (registered after the parent's cleanup, so it runs first).
	l.t.Cleanup(func() { k.kill() })
	return k
}

// kill sends SIGKILL to the VRRP child, then to the parent: keepalived gets no
// chance to send a priority-0 advert or remove the VIP.
func (k *keepalived) kill() {
	if b, err := os.ReadFile(k.vrrpPID); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	k.parent.signal(syscall.SIGKILL)
}

// TestLabKeepalivedInterop runs Portico next to a real keepalived, VRRP v2 and
// v3, both ways round. The lower-priority side starts first and becomes Master
// alone; the higher-priority side then starts and must take over (so the lower
// side has parsed its adverts), then it is killed with SIGKILL and the lower side
// must take the VIP back.
func TestLabKeepalivedInterop(t *testing.T) {
	requireLab(t)
	testenv.RequireProgram(t, "keepalived")
	for _, variant := range []struct {
		version int
		ipv6    bool
	}{{2, false}, {3, false}, {3, true}} {
		version := variant.version
		interval := time.Second // version 2 only knows whole seconds
		if version == 3 {
			interval = 100 * time.Millisecond
		}
		family := "ipv4"
		if variant.ipv6 {
			family = "ipv6"
		}
		for _, keepalivedHigh := range []bool{true, false} {
			name := fmt.Sprintf("v%d/%s/keepalived-master", version, family)
			if !keepalivedHigh {
				name = fmt.Sprintf("v%d/%s/portico-master", version, family)
			}
			t.Run(name, func(t *testing.T) {
				l := newLab(t, 2)
				if variant.ipv6 {
					l.vip = netip.MustParseAddr("fd00:99::100")
				}
				kNode, pNode := l.nodes[0], l.nodes[1]
				kPrio, pPrio := uint8(100), uint8(200)
				if keepalivedHigh {
					kPrio, pPrio = 200, 100
				}
				ic := labInstance(pPrio, interval)
				ic.Version = uint8(version)
				startLow := func() {
					if keepalivedHigh {
						l.startPortico(pNode, ic)
					} else {
						l.startKeepalived(kNode, version, kPrio, interval)
					}
				}
				var killHigh func()
				startHigh := func() {
					if keepalivedHigh {
						k := l.startKeepalived(kNode, version, kPrio, interval)
						killHigh = k.kill
					} else {
						p := l.startPortico(pNode, ic)
						killHigh = func() { p.signal(syscall.SIGKILL) }
					}
				}
				low, high := pNode, kNode
				if !keepalivedHigh {
					low, high = kNode, pNode
				}
				// Master_Down_Interval is ~3.6s at 1s adverts; allow for start-up.
				limit := 5*interval + 5*time.Second
				startLow()
				l.electAndHold(low, limit, 0)
				startHigh()
				l.electAndHold(high, limit, 3*interval)
				killHigh()
				took, err := testenv.Poll(context.Background(), limit, 2*time.Millisecond, func() bool { return l.hasVIP(low) })
				if err != nil {
					t.Fatalf("%s did not take over within %v of the kill", low.name, took)
				}
				t.Logf("%s took over %v after the kill", low.name, took)
			})
		}
	}
}
