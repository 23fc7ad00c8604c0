package nginx

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// Runner runs the nginx binary: the Reloader's only way to reach nginx, so that unit
// tests can use a fake while integration tests and production use Exec.
type Runner interface {
	// Test validates the configuration file conf, with dir as nginx's prefix.
	Test(ctx context.Context, dir, conf string) error
	// Start starts an nginx master in the foreground with conf and dir as prefix.
	Start(dir, conf string) (Master, error)
	// Find returns the master that pidFile names when it still runs with conf (one
	// an earlier agent started and left behind), or nil.
	Find(conf, pidFile string) (Master, error)
}

// Master is a running nginx master process.
type Master interface {
	// PID is the master's process id.
	PID() int
	// Reload asks the master to load its configuration file again (SIGHUP): new
	// workers start, old ones finish their requests and exit.
	Reload() error
	// Stop asks for a graceful shutdown (SIGQUIT) and kills the master and its
	// workers when ctx ends first.
	Stop(ctx context.Context) error
	// Done is closed once the master has exited.
	Done() <-chan struct{}
	// Workers lists the master's worker processes.
	Workers() ([]Worker, error)
}

// Worker is one nginx worker process.
type Worker struct {
	PID int
	// ShuttingDown is set once the worker has been told to quit: it has closed
	// its listening sockets and only finishes the requests it has.
	ShuttingDown bool
}

// Exec runs a real nginx binary.
type Exec struct {
	// Binary is the nginx executable; "" finds "nginx" on PATH or in /usr/sbin.
	Binary string
	// Log receives nginx's stderr, one entry per line.
	Log *zap.Logger
	// Stdout is nginx's standard output, where an access log "stdout" goes
	// (Options.AccessLog); nil sends it to Log with stderr.
	Stdout *os.File
}

func (e Exec) binary() (string, error) {
	if e.Binary != "" {
		return e.Binary, nil
	}
	if p, err := exec.LookPath("nginx"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx", nil
	}
	return "", errors.New("find nginx: not on PATH nor in /usr/sbin")
}

func args(dir, conf string, extra ...string) []string {
	// -e stderr: nginx must not open its compiled-in error log before it has read
	// the configuration.
	return append([]string{"-p", filepath.Clean(dir) + "/", "-c", conf, "-e", "stderr"}, extra...)
}

// Test runs `nginx -t`.
func (e Exec) Test(ctx context.Context, dir, conf string) error {
	bin, err := e.binary()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, bin, args(dir, conf, "-t", "-q")...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		if bytes.Contains(out, []byte("dlopen()")) {
			return fmt.Errorf("nginx -t: %w: %s (the Lua module comes with the Debian package libnginx-mod-http-lua)", err, bytes.TrimSpace(out))
		}
		return fmt.Errorf("nginx -t: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// Start starts a master with `daemon off`, in its own process group so that the
// workers of a master that died can be found and told to quit.
func (e Exec) Start(dir, conf string) (Master, error) {
	bin, err := e.binary()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args(dir, conf, "-g", "daemon off;")...)
	cmd.Dir = dir // nginx resolves a relative unix socket path from there
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	log := e.Log
	if log == nil {
		log = zap.NewNop()
	}
	// An *os.File, not an io.Writer: exec would otherwise copy the output in a
	// goroutine that Wait waits for, and the workers of a killed master keep the
	// pipe open.
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("start nginx: %w", err)
	}
	cmd.Stderr = pw
	cmd.Stdout = pw
	if e.Stdout != nil {
		cmd.Stdout = e.Stdout
	}
	err = cmd.Start()
	pw.Close()
	if err != nil {
		pr.Close()
		return nil, fmt.Errorf("start nginx: %w", err)
	}
	m := &execMaster{pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() {
		defer pr.Close()
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			log.Warn("nginx output", zap.String("line", sc.Text()))
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		_ = cmd.Wait() // the exit status says nothing the log lines did not
		m.exited()
	}()
	return m, nil
}

// Find adopts a master left running by an earlier agent, so that a restarted agent
// takes over without closing nginx's listening sockets.
func (e Exec) Find(conf, pidFile string) (Master, error) {
	b, err := os.ReadFile(pidFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read nginx pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return nil, nil // a stale or torn file: nothing to adopt
	}
	if !isMaster(pid, conf) {
		return nil, nil
	}
	m := &execMaster{pid: pid, done: make(chan struct{})}
	// Not a child: poll for its end.
	go func() {
		for isMaster(pid, conf) {
			time.Sleep(100 * time.Millisecond)
		}
		m.exited()
	}()
	return m, nil
}

// isMaster reports whether pid is a live nginx master running conf. nginx keeps its
// command line in the process title: "nginx: master process /usr/sbin/nginx -p ...
// -c <conf> ...".
func isMaster(pid int, conf string) bool {
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	title := string(cmdline)
	return strings.HasPrefix(title, "nginx: master process") && strings.Contains(title, " "+conf+" ")
}

type execMaster struct {
	pid  int
	done chan struct{}
}

func (m *execMaster) PID() int              { return m.pid }
func (m *execMaster) Done() <-chan struct{} { return m.done }

// exited runs once the master is gone. Workers outlive a master that was killed and
// keep the listening sockets: ask any that are left (the master's process group) to
// finish their requests and go.
func (m *execMaster) exited() {
	_ = syscall.Kill(-m.pid, syscall.SIGQUIT)
	close(m.done)
}

func (m *execMaster) Reload() error {
	select {
	case <-m.done:
		return errors.New("signal nginx reload: master has exited")
	default:
	}
	if err := syscall.Kill(m.pid, syscall.SIGHUP); err != nil {
		return fmt.Errorf("signal nginx reload: %w", err)
	}
	return nil
}

func (m *execMaster) Stop(ctx context.Context) error {
	select {
	case <-m.done:
		return nil
	default:
	}
	if err := syscall.Kill(m.pid, syscall.SIGQUIT); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal nginx quit: %w", err)
	}
	select {
	case <-m.done:
		return nil
	case <-ctx.Done():
	}
	// The group id is the master's pid, still reserved while any member lives.
	_ = syscall.Kill(-m.pid, syscall.SIGKILL)
	<-m.done
	return fmt.Errorf("stop nginx: killed after %w", ctx.Err())
}

// Workers finds the master's children in /proc. A worker that got the quit signal
// renames itself "nginx: worker process is shutting down" and closes its listening
// sockets in the same step.
func (m *execMaster) Workers() ([]Worker, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list nginx workers: %w", err)
	}
	var out []Worker
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		// "pid (comm) state ppid ...": comm may hold spaces, so cut at the last ')'.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(m.pid) {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		title := string(cmdline)
		if !strings.Contains(title, "worker process") {
			continue // the cache manager or loader, if any
		}
		out = append(out, Worker{PID: pid, ShuttingDown: strings.Contains(title, "shutting down")})
	}
	return out, nil
}
