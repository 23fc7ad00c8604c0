package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// proc is one process the lab started, ended by PID.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

// spawn starts argv with its output in logPath. The child is killed if this process
// dies first (Pdeathsig), so a crashed test leaves no server behind.
func spawn(name, logPath string, argv ...string) (*proc, error) {
	log, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("create %s log: %w", name, err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// kill ends the process with SIGKILL and waits for it: the lab's state is thrown away,
// so nothing needs a graceful stop.
func (p *proc) kill() {
	if p == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// wait polls ready every 100 ms until it holds, p exits, ctx ends or deadline passes.
func (p *proc) wait(ctx context.Context, deadline time.Time, ready func() bool) error {
	for !ready() {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited: %s", p.name, p.cmd.ProcessState)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready in time", p.name)
		}
	}
	return nil
}

// until polls cond every 20 ms until it returns nil, ctx ends or deadline passes
// (then it returns cond's last error).
func until(ctx context.Context, deadline time.Time, cond func() error) error {
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
