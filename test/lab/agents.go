package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/portico-edge/portico/test/netlab"
)

// Agent is one `portico agent` process on an edge node.
type Agent struct {
	Edge    *Node
	PinPath string
	Dir     string // nginx prefix and log
	cmd     *exec.Cmd
	done    chan struct{}
}

// StartAgent starts `portico agent` on edge i (0-based) and returns once the
// process runs; use WaitReady for readiness.
func (l *Lab) StartAgent(i int) (*Agent, error) {
	e := l.Edges[i]
	a := &Agent{Edge: e, PinPath: "/sys/fs/bpf/" + l.Net.Prefix + e.Name, Dir: filepath.Join(l.Dir, e.Name), done: make(chan struct{})}
	if err := os.MkdirAll(a.Dir, 0o755); err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(filepath.Join(a.Dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	// nsenter --net, not `ip netns exec`: the latter gives the agent a private
	// mount namespace with a fresh /sys, hiding the node's bpffs, where pins must
	// outlive the agent (as the DaemonSet's /sys/fs/bpf hostPath does).
	args := []string{"--net=/run/netns/" + e.NS, l.Portico, "agent",
		"-group", GroupNamespace + "/" + GroupName, "-iface", "eth0", "-node-name", e.Name,
		"-kubeconfig", l.API.Kubeconfig, "-pin-path", a.PinPath, "-nginx-dir", filepath.Join(a.Dir, "nginx"),
		"-metrics-addr", ":9101", "-pprof", "-vrrp-interval", "100ms", "-log-level", "debug",
		"-state-dir", filepath.Join(a.Dir, "state"), "-shutdown-delay", "1500ms",
		// The access log in a file of its own, not in the agent's log (whose tail a failed test shows).
		"-access-log", filepath.Join(a.Dir, "access.log")}
	if l.transition > 0 {
		args = append(args, "-ring-transition", l.transition.String())
	}
	if l.bgp != nil {
		conf, err := l.bgpConfig()
		if err != nil {
			logf.Close()
			return nil, err
		}
		args = append(args, "-announce", "bgp", "-bgp-config", conf)
		if l.SitesFile != "" {
			args = append(args, "-federation-peers", l.SitesFile)
		}
	}
	a.cmd = exec.Command("nsenter", args...)
	a.cmd.Stdout, a.cmd.Stderr = logf, logf
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start agent on %s: %w", e.Name, err)
	}
	go func() { a.cmd.Wait(); logf.Close(); close(a.done) }()
	l.mu.Lock()
	l.agents[i] = a
	l.mu.Unlock()
	return a, nil
}

// Kill sends sig to the agent and waits for it to exit.
func (a *Agent) Kill(sig syscall.Signal, timeout time.Duration) error {
	if err := a.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-a.done:
		return nil
	case <-time.After(timeout):
		// SIGQUIT first: the Go runtime writes every goroutine's stack to the
		// agent's log (printed when the test fails), which says where it waited.
		a.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-a.done:
		case <-time.After(3 * time.Second):
			a.cmd.Process.Kill()
			<-a.done
		}
		return fmt.Errorf("agent on %s did not exit within %v of %v; its goroutines then, Portico's frames:\n%s", a.Edge.Name, timeout, sig, ownFrames(a.Log()))
	}
}

// ownFrames shortens the goroutine dump at the end of an agent's log (SIGQUIT)
// to each goroutine's header and the functions of this module it was in.
func ownFrames(log string) string {
	i := strings.LastIndex(log, "SIGQUIT: quit")
	if i < 0 {
		return "(no goroutine dump in the log)"
	}
	var b strings.Builder
	for _, g := range strings.Split(log[i:], "\n\n")[1:] {
		lines := strings.Split(g, "\n")
		var own []string
		for _, l := range lines[1:] {
			if strings.HasPrefix(l, "github.com/portico-edge/portico/") {
				own = append(own, strings.TrimPrefix(l[:strings.LastIndexByte(l, '(')+1], "github.com/portico-edge/portico/")+")")
			}
		}
		if len(own) > 0 {
			fmt.Fprintf(&b, "%s %s\n", lines[0], strings.Join(own, " < "))
		}
	}
	return b.String()
}

// agentClient sends requests to edge i's agent (its metrics address) from
// inside the edge's namespace.
func (l *Lab) agentClient(i int) *http.Client {
	ns := l.Edges[i].NS
	dial := func(ctx context.Context, network, addr string) (c net.Conn, err error) {
		var d net.Dialer
		err = netlab.Do(ns, func() error { c, err = d.DialContext(ctx, network, addr); return err })
		return c, err
	}
	return &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: dial}}
}

// Ready asks edge i's agent for /readyz from inside its namespace.
func (l *Lab) Ready(i int) error {
	resp, err := l.agentClient(i).Get("http://127.0.0.1:9101/readyz")
	if err != nil {
		return fmt.Errorf("agent on %s: %w", l.Edges[i].Name, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("agent on %s not ready: %s", l.Edges[i].Name, strings.TrimSpace(string(body)))
	}
	return nil
}

// Metric reads one series of edge i's agent's metrics, as the exposition
// format names it: `portico_nginx_reloads_total{result="success"}`.
func (l *Lab) Metric(i int, series string) (float64, error) {
	body, err := l.metrics(i)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("the agent on %s has no %s", l.Edges[i].Name, series)
}

// metrics reads the agent on edge i's /metrics.
func (l *Lab) metrics(i int) (string, error) {
	resp, err := l.agentClient(i).Get("http://127.0.0.1:9101/metrics")
	if err != nil {
		return "", fmt.Errorf("metrics of the agent on %s: %w", l.Edges[i].Name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return "", fmt.Errorf("metrics of the agent on %s: %w", l.Edges[i].Name, err)
	}
	return string(body), nil
}

// MetricSum sums the agent on edge i's series of the metric name whose labels
// include every one of labels (each `key="value"`); 0 when none does.
func (l *Lab) MetricSum(i int, name string, labels ...string) (float64, error) {
	body, err := l.metrics(i)
	if err != nil {
		return 0, err
	}
	var sum float64
lines:
	for _, line := range strings.Split(body, "\n") {
		rest, ok := strings.CutPrefix(line, name+"{")
		if !ok {
			continue
		}
		set, v, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		have := strings.Split(set, ",")
		for _, want := range labels {
			if !slices.Contains(have, want) {
				continue lines
			}
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			return 0, fmt.Errorf("metrics of the agent on %s: %s: %w", l.Edges[i].Name, line, err)
		}
		sum += f
	}
	return sum, nil
}

// Exited reports whether the agent process has ended.
func (a *Agent) Exited() bool {
	select {
	case <-a.done:
		return true
	default:
		return false
	}
}

// LastLogLine returns the last non-empty line of the agent's log.
func (a *Agent) LastLogLine() string {
	lines := strings.Split(strings.TrimSpace(a.Log()), "\n")
	return lines[len(lines)-1]
}

// Log returns the agent's log.
func (a *Agent) Log() string {
	b, _ := os.ReadFile(filepath.Join(a.Dir, "agent.log"))
	return string(b)
}

// EdgeNo returns n's position in Edges (the i of StartAgent, Agent and Ready).
func (l *Lab) EdgeNo(n *Node) int {
	for i, e := range l.Edges {
		if e == n {
			return i
		}
	}
	panic("lab: " + n.Name + " is not an edge node")
}

// Agent returns the agent on edge i, if one was started.
func (l *Lab) Agent(i int) *Agent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.agents[i]
}

// stopNginx stops the nginx master whose pid file is in dir, if it is still
// running and is this lab's (its command line names dir).
func (l *Lab) stopNginx(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "nginx.pid"))
	if err != nil {
		return nil
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return nil
	}
	running := func() bool {
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		return err == nil && strings.Contains(string(cmd), dir)
	}
	if !running() {
		return nil
	}
	syscall.Kill(pid, syscall.SIGTERM)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if !running() {
			return nil
		}
	}
	syscall.Kill(pid, syscall.SIGKILL)
	return fmt.Errorf("nginx %d in %s did not stop on SIGTERM; killed", pid, dir)
}
