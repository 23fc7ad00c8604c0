package bgp

// The FRR interop test: a router namespace runs FRR (zebra, bgpd, bfdd, one
// instance for that namespace with -N), an edge namespace runs the speaker.
// GoBGP opens its sockets from goroutines of its own, which a thread locked into
// a namespace would not cover, so the speaker runs as a separate process: this
// test binary re-executed inside the edge namespace in helper mode (see
// TestMain), driven over its stdin and stdout. Nothing here touches the root
// namespace's network; every process is started here and killed by its PID.

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/portico-edge/portico/test/testenv"
)

func TestFRRInterop(t *testing.T) {
	l := newFRRLab(t)
	sp := l.startSpeaker(l.cfg)
	l.waitUp(sp)

	// The session comes up once and stays: FRR replaces its BFD session when
	// BGP comes up, which made GoBGP reset the session once (bfdStartDelay).
	time.Sleep(4 * time.Second)
	if d := l.sessionDrops(); d != 0 {
		t.Fatalf("FRR's BGP session with the speaker dropped %d times after it came up, want 0 (BFD session-down events at FRR: %s)", d, l.bfdDowns())
	}

	// Depreferenced: FRR sees the AS path prepended and the GRACEFUL_SHUTDOWN
	// community; withdrawn: the route goes; normal: it is back as it was.
	steps := []struct {
		pref    string
		present bool
		aspath  string
		gshut   bool
	}{
		{"depreferenced", true, "65001 65001 65001 65001", true},
		{"withdrawn", false, "", false},
		{"normal", true, "65001", false},
	}
	for _, st := range steps {
		sp.do(st.pref)
		testenv.Eventually(t, settle, func() string {
			paths, err := bgpPaths(l.r, l.vip)
			if err != nil {
				return err.Error()
			}
			if !st.present {
				if len(paths) != 0 || kernelRoute(l.routerNS, l.vip) {
					return fmt.Sprintf("%s: FRR still has %+v", st.pref, paths)
				}
				return ""
			}
			if len(paths) != 1 {
				return fmt.Sprintf("%s: FRR has %d paths, want 1", st.pref, len(paths))
			}
			p := paths[0]
			gshut := strings.Contains(p.Community.String, "graceful-shutdown") || strings.Contains(p.Community.String, "65535:0")
			if p.ASPath.String != st.aspath || gshut != st.gshut {
				return fmt.Sprintf("%s: FRR's path has AS path %q, communities %q; want %q, graceful shutdown %v",
					st.pref, p.ASPath.String, p.Community.String, st.aspath, st.gshut)
			}
			return ""
		})
		t.Logf("%s: FRR agrees", st.pref)
	}
	t.Logf("BFD session-down events at FRR so far: %s (load average %s)", l.bfdDowns(), loadAvg())

	// The speaker's context ends (SIGTERM) without graceful restart: FRR drops
	// the route at once (a Cease NOTIFICATION).
	took, err := l.timeToDrop(func() { sp.signal(syscall.SIGTERM) }, 5*time.Second)
	if err != nil {
		t.Fatalf("route to %v still in the router's table %v after the speaker's context ended: %v", l.vip, took, err)
	}
	t.Logf("speaker stopped (context ended, no graceful restart): FRR dropped the route after %v", took.Round(time.Millisecond))
	if took > 2*time.Second {
		t.Errorf("route dropped after %v, want about a second at most", took)
	}
	select {
	case <-sp.done:
	case <-time.After(10 * time.Second):
		t.Fatal("speaker did not exit within 10s of SIGTERM")
	}
	if !sp.cmd.ProcessState.Success() {
		t.Errorf("speaker exited with %v", sp.cmd.ProcessState)
	}

	// A crash (SIGKILL): no NOTIFICATION, but the kernel still closes the
	// connection, so FRR learns it from TCP or from BFD, whichever comes first.
	// (A dead node, which closes nothing, is BFD's alone: not measured here.)
	sp = l.startSpeaker(l.cfg)
	l.waitUp(sp)
	took, err = l.timeToDrop(func() { sp.signal(syscall.SIGKILL) }, 5*time.Second)
	if err != nil {
		t.Fatalf("route to %v still in the router's table %v after the speaker was killed: %v", l.vip, took, err)
	}
	t.Logf("speaker killed (SIGKILL): FRR dropped the route after %v", took.Round(time.Millisecond))
}

// TestFRRGracefulRestart stops a speaker with Config.GracefulRestart and
// checks that FRR (a graceful restart helper) keeps the route while a new
// speaker comes up, as across an agent restart.
func TestFRRGracefulRestart(t *testing.T) {
	l := newFRRLab(t, " bgp graceful-restart")
	cfg := l.cfg
	cfg.GracefulRestart = true
	cfg.RestartTime = 30 * time.Second
	sp := l.startSpeaker(cfg)
	l.waitUp(sp)

	sp.signal(syscall.SIGTERM)
	select {
	case <-sp.done:
	case <-time.After(10 * time.Second):
		t.Fatal("speaker did not exit within 10s of SIGTERM")
	}
	// Longer than BFD's detection and FRR's hold time (3 s): the route stays.
	const hold = 4 * time.Second
	deadline := time.Now().Add(hold)
	for time.Now().Before(deadline) {
		if !kernelRoute(l.routerNS, l.vip) {
			paths, _ := bgpPaths(l.r, l.vip)
			t.Fatalf("route to %v dropped %v after a graceful stop (FRR's paths %+v)", l.vip, hold-time.Until(deadline), paths)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("route kept for %v after the speaker stopped with graceful restart", hold)

	sp = l.startSpeaker(cfg)
	l.waitUp(sp)
	testenv.Eventually(t, settle, func() string {
		var r struct {
			Paths []struct {
				Stale bool `json:"stale"`
			} `json:"paths"`
		}
		if err := l.r.VtyJSON("show bgp ipv4 unicast "+l.vip.String()+" json", &r); err != nil {
			return err.Error()
		}
		if len(r.Paths) != 1 || r.Paths[0].Stale {
			return fmt.Sprintf("FRR's paths %+v, want one, not stale", r.Paths)
		}
		return ""
	})
}

func loadAvg() string {
	f := strings.Fields(func() string { b, _ := os.ReadFile("/proc/loadavg"); return string(b) }())
	return strings.Join(f[:min(3, len(f))], " ")
}
