package bgp

// The speaker as a process of its own: GoBGP opens its sockets from goroutines
// of its own, which a thread locked into a namespace would not cover, so the
// speaker runs as a separate process: this test binary re-executed inside the
// edge namespace in helper mode (see TestMain), driven over its stdin and stdout.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/portico-edge/portico/test/testenv"
)

const envHelper = "PORTICO_BGP_HELPER" // path of a JSON Config: run a speaker

func TestMain(m *testing.M) {
	testenv.HelperMain(m, map[string]func(string) int{envHelper: speakerMain})
}

// helperReply is one answer of the helper, a JSON line on its stdout.
type helperReply struct {
	Error  string  `json:"error,omitempty"`
	Status *Status `json:"status,omitempty"`
}

// speakerMain runs one speaker from a JSON Config until SIGTERM or the end of its
// stdin (its context ends: the speaker stops as the agent's would) or SIGKILL.
// Each stdin line is a command answered by one stdout line: a preference name
// announces the VIP in PORTICO_BGP_VIP at that preference; "status" reports;
// "peers JSON" reconfigures the peers.
func speakerMain(path string) int {
	var cfg Config
	b, err := os.ReadFile(path)
	if err == nil {
		err = json.Unmarshal(b, &cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	vip, err := netip.ParsePrefix(os.Getenv("PORTICO_BGP_VIP"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	log, err := zap.NewDevelopment()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	met, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		log.Error("metrics", zap.Error(err))
		return 1
	}
	s, err := New(cfg, log, met)
	if err != nil {
		log.Error("new speaker", zap.Error(err))
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		defer stop()
		out := json.NewEncoder(os.Stdout)
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			var r helperReply
			if cmd := sc.Text(); cmd == "status" {
				st := s.Status()
				r.Status = &st
			} else if js, ok := strings.CutPrefix(cmd, "peers "); ok {
				var peers []Peer
				err := json.Unmarshal([]byte(js), &peers)
				if err == nil {
					err = s.Reconfigure(ctx, peers)
				}
				if err != nil {
					r.Error = err.Error()
				}
			} else {
				var p Preference
				err := p.UnmarshalText([]byte(cmd))
				if err == nil {
					err = s.Announce([]netip.Prefix{vip}, p)
				}
				if err != nil {
					r.Error = err.Error()
				}
			}
			out.Encode(r)
		}
	}()
	if err := s.Run(ctx); err != nil {
		log.Error("run speaker", zap.Error(err))
		return 1
	}
	return 0
}

// speakerProc is a helper process.
type speakerProc struct {
	t    *testing.T
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
	done chan struct{}
}

func startSpeakerProc(t *testing.T, ns, dir string, cfg Config, vip netip.Prefix) *speakerProc {
	t.Helper()
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "speaker.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	argv, err := testenv.HelperArgs()
	if err != nil {
		t.Fatal(err)
	}
	logf, err := os.OpenFile(filepath.Join(dir, "speaker.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
	cmd.Env = append(os.Environ(), envHelper+"="+path, "PORTICO_BGP_VIP="+vip.String())
	cmd.Stderr = logf
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start speaker: %v", err)
	}
	p := &speakerProc{t: t, cmd: cmd, in: in, out: bufio.NewScanner(out), done: make(chan struct{})}
	go func() {
		cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.signal(syscall.SIGKILL)
		<-p.done
	})
	return p
}

func (p *speakerProc) signal(s syscall.Signal) {
	select {
	case <-p.done:
	default:
		p.cmd.Process.Signal(s)
	}
}

// do sends one command and reads its answer (bounded by the helper's own work:
// Announce and Status do not wait on the network).
func (p *speakerProc) do(cmd string) helperReply {
	p.t.Helper()
	if _, err := fmt.Fprintln(p.in, cmd); err != nil {
		p.t.Fatalf("speaker %s: %v", cmd, err)
	}
	var r helperReply
	if !p.out.Scan() {
		p.t.Fatalf("speaker %s: no answer: %v", cmd, p.out.Err())
	}
	if err := json.Unmarshal(p.out.Bytes(), &r); err != nil {
		p.t.Fatalf("speaker %s: %v: %s", cmd, err, p.out.Bytes())
	}
	if r.Error != "" {
		p.t.Fatalf("speaker %s: %s", cmd, r.Error)
	}
	return r
}
