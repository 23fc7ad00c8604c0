package vrrp

// The namespace lab: a switch namespace holding a bridge, node namespaces each
// wired to it by a veth, and a client namespace. Announcers run as separate
// processes (this test binary re-executed in helper mode, see TestMain) so they
// can be killed with SIGKILL. Nothing here touches the root namespace's network.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"go.uber.org/zap"

	"github.com/portico-edge/portico/test/testenv"
)

const (
	envHelper = "PORTICO_VRRP_HELPER" // path of a Config: run an announcer
	envProbe  = "PORTICO_VRRP_PROBE"  // "vip,duration": run the 1 ms prober
)

func TestMain(m *testing.M) {
	testenv.HelperMain(m, map[string]func(string) int{envHelper: announcerMain, envProbe: probeMain})
}

// announcerMain runs one announcer from a config file until SIGTERM (graceful) or
// SIGKILL. SIGUSR1 lowers every instance's priority to 1, SIGUSR2 restores it;
// SIGHUP reads the file again and gives each instance its VIPs (SetVIPs).
func announcerMain(path string) int {
	cfg, err := LoadConfig(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	log, err := zap.NewProductionConfig().Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	met, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	a, err := New(cfg, log, met)
	if err != nil {
		log.Error("start announcer", zap.Error(err))
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	usr := make(chan os.Signal, 4)
	signal.Notify(usr, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGHUP)
	go func() {
		for s := range usr {
			if s == syscall.SIGHUP {
				next, err := LoadConfig(path)
				if err != nil {
					log.Error("reload", zap.Error(err))
					continue
				}
				for _, ic := range next.Instances {
					if err := a.SetVIPs(ctx, ic.Name, ic.VIPs); err != nil {
						log.Error("set vips", zap.Error(err))
					}
				}
				log.Info("reloaded")
				continue
			}
			for _, ic := range cfg.Instances {
				p := ic.Priority
				if s == syscall.SIGUSR1 {
					p = 1
				}
				if err := a.SetPriority(ctx, ic.Name, p); err != nil {
					log.Error("set priority", zap.Error(err))
				}
			}
		}
	}()
	if err := a.Run(ctx); err != nil {
		log.Error("run announcer", zap.Error(err))
		return 1
	}
	return 0
}

// requireLab skips unless the test can build namespaces: root and iproute2.
func requireLab(t *testing.T) {
	t.Helper()
	testenv.RequireRoot(t, "network namespaces and raw sockets")
	testenv.RequireProgram(t, "ip")
}

type labNode struct {
	name string // short name used in logs: n0, n1, client
	ns   string
	port string // its veth end in the switch namespace
	addr netip.Addr
	mac  net.HardwareAddr
	nl   *netlink.Handle
}

type lab struct {
	t      *testing.T
	prefix string
	dir    string
	sw     string
	nodes  []*labNode
	client *labNode
	vip    netip.Addr
}

// newLab builds a switch, n node namespaces and a client namespace, all removed
// when the test ends.
func newLab(t *testing.T, n int) *lab {
	t.Helper()
	requireLab(t)
	var rnd [2]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		t.Fatal(err)
	}
	l := &lab{t: t, prefix: "pv" + hex.EncodeToString(rnd[:]), dir: t.TempDir(), vip: netip.MustParseAddr("10.99.0.100")}
	l.sw = l.prefix + "-sw"
	l.addNS(l.sw)
	l.ip("-n", l.sw, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
	l.ip("-n", l.sw, "link", "set", "br0", "up")
	for i := range n {
		l.nodes = append(l.nodes, l.addNode(fmt.Sprintf("n%d", i), fmt.Sprintf("p%d", i), byte(11+i)))
	}
	l.client = l.addNode("client", "pc", 2)
	return l
}

func (l *lab) addNS(ns string) {
	l.ip("netns", "add", ns)
	l.t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			l.t.Errorf("remove namespace %s: %v: %s", ns, err, out)
		}
	})
	l.ip("-n", ns, "link", "set", "lo", "up")
	// No duplicate address detection: addresses are usable at once.
	if out, err := exec.Command("ip", "netns", "exec", ns, "sysctl", "-qw",
		"net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0").CombinedOutput(); err != nil {
		l.t.Fatalf("sysctl in %s: %v: %s", ns, err, out)
	}
}

// addNode adds a namespace wired to the switch, with 10.99.0.<host>/24 and
// fd00:99::<host>/64 on its eth0.
func (l *lab) addNode(name, port string, host byte) *labNode {
	addr := netip.AddrFrom4([4]byte{10, 99, 0, host})
	n := &labNode{name: name, ns: l.prefix + "-" + name, port: port, addr: addr}
	l.addNS(n.ns)
	l.ip("-n", l.sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", n.ns)
	l.ip("-n", l.sw, "link", "set", port, "master", "br0", "up")
	l.ip("-n", n.ns, "addr", "add", addr.String()+"/24", "dev", "eth0")
	l.ip("-n", n.ns, "addr", "add", fmt.Sprintf("fd00:99::%x/64", host), "dev", "eth0")
	l.ip("-n", n.ns, "link", "set", "eth0", "up")
	h, err := netns.GetFromName(n.ns)
	if err != nil {
		l.t.Fatalf("open namespace %s: %v", n.ns, err)
	}
	defer h.Close()
	if n.nl, err = netlink.NewHandleAt(h); err != nil {
		l.t.Fatalf("netlink in %s: %v", n.ns, err)
	}
	l.t.Cleanup(n.nl.Close)
	link, err := n.nl.LinkByName("eth0")
	if err != nil {
		l.t.Fatalf("find eth0 in %s: %v", n.ns, err)
	}
	n.mac = link.Attrs().HardwareAddr
	// The kernel adds the IPv6 link-local address shortly after the link comes
	// up; IPv6 adverts are sent from it, so wait for it.
	if _, err := testenv.Poll(context.Background(), 5*time.Second, 2*time.Millisecond, func() bool {
		_, err := primaryAddr(n.nl, link, false, nil)
		return err == nil
	}); err != nil {
		l.t.Fatalf("no IPv6 link-local address on eth0 in %s", n.ns)
	}
	return n
}

func (l *lab) ip(args ...string) {
	l.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		l.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// hasVIP reports whether the lab's VIP is on the node's eth0.
func (l *lab) hasVIP(n *labNode) bool {
	l.t.Helper()
	return l.hasAddr(n, l.vip)
}

// hasAddr reports whether vip is on the node's eth0.
func (l *lab) hasAddr(n *labNode, vip netip.Addr) bool {
	l.t.Helper()
	link, err := n.nl.LinkByName("eth0")
	if err != nil {
		l.t.Fatalf("find eth0 in %s: %v", n.ns, err)
	}
	ok, err := hasVIP(n.nl, link, vip)
	if err != nil {
		l.t.Fatal(err)
	}
	return ok
}

// owners lists the nodes (among those given, default all) holding the VIP.
func (l *lab) owners(among ...*labNode) []string {
	if len(among) == 0 {
		among = l.nodes
	}
	var out []string
	for _, n := range among {
		if l.hasVIP(n) {
			out = append(out, n.name)
		}
	}
	return out
}

// proc is a process the test started; it is killed by PID at cleanup.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

func (l *lab) start(name string, n *labNode, env []string, argv ...string) *proc {
	l.t.Helper()
	logPath := filepath.Join(l.dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		l.t.Fatal(err)
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.ns}, argv...)...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		f.Close()
		l.t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() {
		cmd.Wait()
		f.Close()
		close(p.done)
	}()
	l.t.Cleanup(func() {
		p.signal(syscall.SIGKILL)
		<-p.done
		if l.t.Failed() || os.Getenv("PORTICO_LAB_LOGS") != "" {
			b, _ := os.ReadFile(logPath)
			l.t.Logf("--- %s log:\n%s", name, b)
		}
	})
	return p
}

func (p *proc) signal(s syscall.Signal) {
	select {
	case <-p.done:
	default:
		p.cmd.Process.Signal(s)
	}
}

// wait waits up to limit for the process to exit.
func (p *proc) wait(limit time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(limit):
		return false
	}
}

// startPortico runs an announcer on n's eth0; instances without VIPs get the
// lab's VIP.
func (l *lab) startPortico(n *labNode, ics ...InstanceConfig) *proc {
	l.t.Helper()
	path := l.writeConfig(n, ics...)
	argv, err := testenv.HelperArgs()
	if err != nil {
		l.t.Fatal(err)
	}
	return l.start(n.name+"-portico", n, []string{envHelper + "=" + path}, argv...)
}

// writeConfig writes n's announcer configuration (instances without VIPs get
// the lab's VIP) and returns its path; SIGHUP makes a running announcer read it
// again.
func (l *lab) writeConfig(n *labNode, ics ...InstanceConfig) string {
	l.t.Helper()
	for i := range ics {
		if len(ics[i].VIPs) == 0 {
			ics[i].VIPs = []netip.Addr{l.vip}
		}
	}
	b, err := json.Marshal(Config{Interface: "eth0", Instances: ics})
	if err != nil {
		l.t.Fatal(err)
	}
	path := filepath.Join(l.dir, n.name+"-portico.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		l.t.Fatal(err)
	}
	return path
}

// ping sends one echo request from the client to the VIP.
func (l *lab) ping() error { return l.pingAddr(l.vip) }

// pingAddr sends one echo request from the client to addr.
func (l *lab) pingAddr(addr netip.Addr) error {
	out, err := exec.Command("ip", "netns", "exec", l.client.ns, "ping", "-c", "1", "-W", "1", addr.String()).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ping %v: %w: %s", addr, err, out)
	}
	return nil
}

// addrsOf lists the host addresses on n's eth0, for failure messages.
func (l *lab) addrsOf(n *labNode) string {
	out, _ := exec.Command("ip", "-n", n.ns, "-br", "addr", "show", "dev", "eth0").CombinedOutput()
	return strings.TrimSpace(string(out))
}

// clientReachesVia checks that the client's neighbour entry for the VIP is n's MAC
// within wait (after a takeover, n's unsolicited announcement overrides the old
// one) and that the VIP answers the client's ping.
func (l *lab) clientReachesVia(n *labNode, wait time.Duration) {
	l.t.Helper()
	if _, err := testenv.Poll(context.Background(), wait, 2*time.Millisecond, func() bool { return bytes.Equal(l.clientMAC(), n.mac) }); err != nil {
		l.t.Fatalf("client's entry for the VIP = %v, want %s's %v", l.clientMAC(), n.name, n.mac)
	}
	// The owner answers once its address is up; on a loaded machine one echo
	// request can go unanswered within its second (CI: TestLabIPv6Failover, the
	// client's entry already n1's), so it is asked again, for 3 s at most.
	var err error
	for try := 0; try < 3; try++ {
		if err = l.ping(); err == nil {
			return
		}
	}
	l.t.Fatalf("VIP unreachable via %s (3 echo requests, 1 s each): %v", n.name, err)
}

// clientMAC is the client's neighbour entry for the VIP, or nil.
func (l *lab) clientMAC() net.HardwareAddr {
	l.t.Helper()
	link, err := l.client.nl.LinkByName("eth0")
	if err != nil {
		l.t.Fatal(err)
	}
	fam := netlink.FAMILY_V4
	if l.vip.Is6() {
		fam = netlink.FAMILY_V6
	}
	ns, err := l.client.nl.NeighList(link.Attrs().Index, fam)
	if err != nil {
		l.t.Fatal(err)
	}
	for _, n := range ns {
		if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == l.vip {
			return n.HardwareAddr
		}
	}
	return nil
}

func fmtOwners(o []string) string { return "[" + strings.Join(o, " ") + "]" }

// electAndHold waits for want to be the only owner, then checks it stays so for
// hold.
func (l *lab) electAndHold(want *labNode, limit, hold time.Duration) {
	l.t.Helper()
	if took, err := testenv.Poll(context.Background(), limit, 2*time.Millisecond, func() bool { o := l.owners(); return len(o) == 1 && o[0] == want.name }); err != nil {
		l.t.Fatalf("after %v owners = %s, want only %s", took, fmtOwners(l.owners()), want.name)
	} else {
		l.t.Logf("%s became the only owner after %v", want.name, took)
	}
	deadline := time.Now().Add(hold)
	for time.Now().Before(deadline) {
		if o := l.owners(); len(o) != 1 || o[0] != want.name {
			l.t.Fatalf("owners = %s while holding, want only %s", fmtOwners(o), want.name)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
