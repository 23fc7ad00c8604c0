package cluster

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// diagnosed is how many failed connections Diagnose looks into: each costs a
// capture of a few seconds.
const diagnosed = 3

// Diagnose tells, for a few of the held connections that failed, where they go
// now and why: what every live edge's maps say about each (`portico trace`),
// and every frame of it that crosses the lab's bridge while one more request is
// sent on it (tcpdump with link-level addresses: the client, the director and
// each edge a packet is handed to are told apart by their MACs, listed first).
func (p *Portico) Diagnose(ctx context.Context, failed Held) string {
	var b strings.Builder
	b.WriteString(p.MACs(ctx))
	if r := p.Resets.For(failed); r != "" {
		b.WriteString("resets of them on the bridge (epoch seconds, the sender's MAC first):\n" + r)
	}
	for i, h := range failed {
		if i == diagnosed {
			fmt.Fprintf(&b, "(%d more not looked into)\n", len(failed)-diagnosed)
			break
		}
		client, server := h.Ends()
		fmt.Fprintf(&b, "=== %s %s -> %s\n", h, client, server)
		b.WriteString(p.AgentCommand(ctx, "portico-agent", "trace", client.String(), server.String()))
		b.WriteString(p.capture(ctx, fmt.Sprintf("tcp port %d", client.Port()), func() {
			_, err := h.Do(h.host, "/held", 1500*time.Millisecond)
			fmt.Fprintf(&b, "one more request: %v\n", err)
		}))
	}
	return b.String()
}

// MACs lists the client's and every live node's MAC, on one line.
func (p *Portico) MACs(ctx context.Context) string {
	var b strings.Builder
	b.WriteString("MACs:")
	for _, ns := range append([]string{p.NS}, p.nodeNames()...) {
		out, err := exec.CommandContext(ctx, "ip", "-n", ns, "-br", "link", "show", "eth0").CombinedOutput()
		if err != nil {
			fmt.Fprintf(&b, " %s: %v;", ns, err)
			continue
		}
		fmt.Fprintf(&b, " %s %s;", ns, strings.Join(strings.Fields(string(out))[2:3], ""))
	}
	return b.String() + "\n"
}

// nodeNames are the network namespaces of the cluster's live nodes.
func (p *Portico) nodeNames() []string {
	var out []string
	for _, n := range p.C.Nodes {
		if n.kubelet != nil && n.kubelet.alive() {
			out = append(out, n.Name)
		}
	}
	return out
}

// capture runs tcpdump on the lab's bridge for filter while do runs, and
// returns what it printed (bounded: 60 frames, 4 s).
func (p *Portico) capture(ctx context.Context, filter string, do func()) string {
	ctx, cancel := context.WithTimeout(ctx, 4*time.Second)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", p.C.Net.Switch,
		"tcpdump", "-i", "br0", "-l", "-nn", "-e", "-v", "-x", "-c", "60", filter)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return fmt.Sprintf("tcpdump: %v\n", err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(500 * time.Millisecond) // tcpdump opens its socket
		do()
	}()
	wg.Wait()
	time.Sleep(500 * time.Millisecond)
	cancel()
	_ = cmd.Wait()
	return out.String()
}

// maxResetLines bounds what a ResetCapture keeps.
const maxResetLines = 5000

// ResetCapture records every TCP reset that crosses the lab's bridge, IPv4 and
// IPv6, with the MACs of the node that sent it: when a held connection turns
// out reset, who reset it, and when, is the question.
type ResetCapture struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	buf  bytes.Buffer
	done chan struct{}
}

// Write keeps tcpdump's output, up to maxResetLines lines.
func (r *ResetCapture) Write(b []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if bytes.Count(r.buf.Bytes(), []byte("\n")) < maxResetLines {
		r.buf.Write(b)
	}
	return len(b), nil
}

// CaptureResets starts a ResetCapture on the lab's bridge; Stop ends it.
func (p *Portico) CaptureResets(ctx context.Context) (*ResetCapture, error) {
	r := &ResetCapture{done: make(chan struct{})}
	r.cmd = exec.CommandContext(ctx, "ip", "netns", "exec", p.C.Net.Switch, "tcpdump", "-i", "br0", "-l", "-nn", "-e", "-tt",
		"(ip and tcp[13] & 4 != 0) or (ip6 and ip6[6] == 6 and ip6[53] & 4 != 0)")
	r.cmd.Stdout, r.cmd.Stderr = r, r
	if err := r.cmd.Start(); err != nil {
		return nil, fmt.Errorf("tcpdump: %w", err)
	}
	go func() { _ = r.cmd.Wait(); close(r.done) }()
	return r, nil
}

// Stop ends the capture.
func (r *ResetCapture) Stop() {
	if r == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	<-r.done
}

// For returns the resets the capture saw of the connections held (by their
// client ports), "" if none.
func (r *ResetCapture) For(held Held) string {
	if r == nil || len(held) == 0 {
		return ""
	}
	r.mu.Lock()
	lines := strings.Split(r.buf.String(), "\n")
	r.mu.Unlock()
	var b strings.Builder
	for _, h := range held {
		client, _ := h.Ends()
		port := fmt.Sprintf(".%d ", client.Port())
		for _, l := range lines {
			if strings.Contains(l, port) || strings.Contains(l, fmt.Sprintf(".%d:", client.Port())) {
				fmt.Fprintf(&b, "%s: %s\n", h, l)
			}
		}
	}
	return b.String()
}
