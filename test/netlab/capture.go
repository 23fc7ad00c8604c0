package netlab

import (
	"bytes"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// captureLimit bounds the packets a Capture keeps (headers only).
const captureLimit = 2_000_000

// Capture records the headers of every frame that crosses the lab's bridge
// into a pcap file, so that a test that saw a connection fail can show what
// happened to its packets: which edge sent each frame on, with which MACs, and
// who reset it.
type Capture struct {
	File string
	cmd  *exec.Cmd
	done chan struct{}
}

// StartCapture starts a Capture of the bridge's TCP and UDP frames into dir;
// Stop ends it.
func (l *Lab) StartCapture(dir string) (*Capture, error) {
	return l.StartCaptureOf(dir, "tcp or udp")
}

// StartCaptureOf starts a Capture of the bridge's frames that match a tcpdump
// filter into dir; Stop ends it.
func (l *Lab) StartCaptureOf(dir, filter string) (*Capture, error) {
	c := &Capture{File: filepath.Join(dir, l.Prefix+"-br0.pcap"), done: make(chan struct{})}
	c.cmd = exec.Command("ip", "netns", "exec", l.Switch, "tcpdump", "-i", "br0", "-nn", "-s", "128",
		"-c", fmt.Sprint(captureLimit), "-U", "-w", c.File, filter)
	var stderr bytes.Buffer
	c.cmd.Stderr = &stderr
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("tcpdump: %w", err)
	}
	go func() { _ = c.cmd.Wait(); close(c.done) }()
	// tcpdump says "listening on br0" once it captures.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		select {
		case <-c.done:
			return nil, fmt.Errorf("tcpdump ended: %s", strings.TrimSpace(stderr.String()))
		default:
		}
		if strings.Contains(stderr.String(), "listening on") {
			return c, nil
		}
	}
	c.Stop()
	return nil, fmt.Errorf("tcpdump did not start capturing within 5s")
}

// Stop ends the capture; the file stays for Show.
func (c *Capture) Stop() {
	if c == nil {
		return
	}
	select {
	case <-c.done:
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-c.done:
	case <-time.After(3 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// Show prints the captured frames that match a tcpdump filter (with MACs and
// absolute times), at most max lines.
func (c *Capture) Show(filter string, max int) string {
	return c.ShowBetween(filter, time.Time{}, time.Time{}, max)
}

// ShowBetween is Show for the frames captured from from to to (either zero:
// unbounded).
func (c *Capture) ShowBetween(filter string, from, to time.Time, max int) string {
	if c == nil {
		return ""
	}
	out, err := exec.Command("tcpdump", "-r", c.File, "-nn", "-e", "-tt", filter).Output()
	if err != nil && len(out) == 0 {
		return fmt.Sprintf("tcpdump -r %s: %v", c.File, err)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		if at, ok := frameTime(l); ok && (!from.IsZero() && at.Before(from) || !to.IsZero() && at.After(to)) {
			continue
		}
		lines = append(lines, l)
	}
	if len(lines) > max {
		lines = append(lines[:max], fmt.Sprintf("... %d more", len(lines)-max))
	}
	return strings.Join(lines, "\n")
}

// frameTime is the time of a line tcpdump -tt printed (Unix seconds first).
func frameTime(line string) (time.Time, bool) {
	f, _, _ := strings.Cut(line, " ")
	sec, frac, ok := strings.Cut(f, ".")
	s, err1 := strconv.ParseInt(sec, 10, 64)
	ns, err2 := strconv.ParseInt((frac + "000000000")[:9], 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return time.Time{}, false
	}
	return time.Unix(s, ns), true
}
