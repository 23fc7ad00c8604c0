// Package frr runs Debian's FRR (zebra, bfdd, bgpd) as a router in a test's
// network namespace, one instance per namespace (-N), for the BGP tests and labs.
package frr

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/portico-edge/portico/test/testenv"
)

// Router is one FRR instance (zebra, bfdd, bgpd) in a network namespace.
type Router struct {
	NS  string
	dir string
}

// Dir is where Debian's frr package puts the daemons.
const Dir = "/usr/lib/frr"

// Start writes the configs (by daemon: zebra, bfdd, bgpd) into dir and runs the
// daemons in the namespace in the foreground (so their PIDs are the test's
// children), killed by PID when the test ends; their logs are printed if it failed.
func Start(t testing.TB, ns, dir string, confs map[string]string) *Router {
	t.Helper()
	u, err := user.Lookup("frr")
	if err != nil {
		t.Fatalf("frr user: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	// The daemons run as frr: they read their configs and write their logs and
	// sockets (/var/run/frr/<ns>, FRR's path for -N <ns>) as that user.
	run := filepath.Join("/var/run/frr", ns)
	if err := os.MkdirAll(run, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(run) })
	for _, d := range []string{dir, run} {
		if err := os.Chown(d, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	f := &Router{NS: ns, dir: dir}
	for _, d := range []string{"zebra", "bfdd", "bgpd"} {
		conf := filepath.Join(dir, d+".conf")
		if err := os.WriteFile(conf, []byte(confs[d]), 0o644); err != nil {
			t.Fatal(err)
		}
		logPath := filepath.Join(dir, d+".log")
		for _, p := range []string{conf} {
			os.Chown(p, uid, gid)
		}
		cmd := exec.Command("ip", "netns", "exec", ns, filepath.Join(Dir, d), "-N", ns, "-P", "0",
			"-f", conf, "-i", filepath.Join(run, d+".pid"), "--log", "file:"+logPath)
		out, err := os.Create(filepath.Join(dir, d+".stderr"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", d, err)
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); out.Close(); close(done) }()
		t.Cleanup(func() {
			select {
			case <-done:
			default:
				cmd.Process.Kill()
				<-done
			}
			if t.Failed() {
				for _, p := range []string{logPath, out.Name()} {
					b, _ := os.ReadFile(p)
					t.Logf("--- %s:\n%s", filepath.Base(p), b)
				}
			}
		})
		if d == "zebra" {
			// bfdd and bgpd reach zebra through its socket: wait for it.
			sock := filepath.Join(run, "zserv.api")
			if _, err := testenv.Poll(context.Background(), 10*time.Second, 20*time.Millisecond, func() bool { _, err := os.Stat(sock); return err == nil }); err != nil {
				t.Fatalf("zebra in %s made no %s", ns, sock)
			}
		}
	}
	return f
}

// Vty runs a command (clear bgp ..., an exec command, not a configuration).
func (f *Router) Vty(cmd string) error {
	if out, err := exec.Command("vtysh", "-N", f.NS, "-c", cmd).CombinedOutput(); err != nil {
		return fmt.Errorf("vtysh -N %s -c %q: %w: %s", f.NS, cmd, err, out)
	}
	return nil
}

// VtyJSON runs a show command and decodes its JSON output into v.
func (f *Router) VtyJSON(cmd string, v any) error {
	out, err := exec.Command("vtysh", "-N", f.NS, "-c", cmd).Output()
	if err != nil {
		return fmt.Errorf("vtysh -N %s -c %q: %w", f.NS, cmd, err)
	}
	if err := json.Unmarshal(out, v); err != nil {
		return fmt.Errorf("vtysh -c %q: %w: %s", cmd, err, out)
	}
	return nil
}
