// Package kapi runs a real etcd and kube-apiserver on 127.0.0.1 for Portico's
// integration tests: it sits under the control plane's tests, in place of a cluster.
//
// The binaries are built from the Go module proxy by hack/kapi.sh (make kapi) and cached by
// version; this package only finds, starts and stops them. Each server gets its own
// temporary folder (etcd data, serving certificate, tokens, logs, kubeconfig) and free
// loopback ports, and is torn down by PID. Only the API server runs: no controllers, no
// garbage collector, no kubelet, so tests create EndpointSlices themselves and nothing is
// ever cleaned up behind their back.
//
// Tests share one server through Shared, which skips them when the binaries are
// missing (unless CI is set: then they fail), or Launch their own.
package kapi

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/portico-edge/portico/test/testenv"
)

// The versions hack/kapi.sh builds; TestVersionsMatchWrappers keeps them equal to the
// wrapper modules' go.mod files.
const (
	KubeVersion = "v1.36.3"
	EtcdVersion = "v3.6.8"
)

// token is the static bearer token of the test administrator (group system:masters).
const token = "portico-kapi-admin"

// BinDir is the folder hack/kapi.sh caches the binaries of this version in:
// $PORTICO_KAPI_DIR if set, else ${PORTICO_KAPI_CACHE:-${XDG_CACHE_HOME:-~/.cache}/portico/kapi}/k8s-<v>-etcd-<v>.
func BinDir() string {
	if d := os.Getenv("PORTICO_KAPI_DIR"); d != "" {
		return d
	}
	return filepath.Join(CacheDir("PORTICO_KAPI_CACHE", "kapi"), "k8s-"+KubeVersion+"-etcd-"+EtcdVersion)
}

// CacheDir is the folder a build script of the tests caches its binaries in, as
// hack/kapi.sh computes it: $env if set, else ${XDG_CACHE_HOME:-~/.cache}/portico/name.
func CacheDir(env, name string) string {
	if d := os.Getenv(env); d != "" {
		return d
	}
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, _ := os.UserHomeDir()
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "portico", name)
}

// Available reports whether both binaries are in BinDir, and if not, why.
func Available() error {
	for _, b := range []string{"kube-apiserver", "etcd"} {
		p := filepath.Join(BinDir(), b)
		st, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("%s not built (run make kapi): %w", b, err)
		}
		if st.Mode()&0o111 == 0 {
			return fmt.Errorf("%s is not executable", p)
		}
	}
	return nil
}

// Server is one running etcd + kube-apiserver pair.
type Server struct {
	// Config reaches the API server as a system:masters user.
	Config *rest.Config
	// Kubeconfig is the path of a kubeconfig file with the same credentials.
	Kubeconfig string
	// Dir is the server's private folder (removed by Stop).
	Dir string

	etcd, apiserver *exec.Cmd
	exited          map[*exec.Cmd]chan struct{}
	stopOnce        sync.Once
	stopErr         error
}

// Options tunes Launch; the zero value is fine.
type Options struct {
	// ReadyTimeout bounds the wait for /readyz (default 90 s).
	ReadyTimeout time.Duration
	// ExtraArgs are appended to kube-apiserver's flags.
	ExtraArgs []string
}

// Launch starts etcd and kube-apiserver and waits until the API server is ready.
func Launch(ctx context.Context, opts Options) (*Server, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 90 * time.Second
	}
	var err error
	// Free ports are found by binding :0 and releasing them, so another process can
	// take one in between: try again on fresh ports when a start fails.
	for attempt := 0; attempt < 3; attempt++ {
		var s *Server
		s, err = launch(ctx, opts)
		if err == nil {
			return s, nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, err
}

func launch(ctx context.Context, opts Options) (s *Server, err error) {
	dir, err := os.MkdirTemp("", "portico-kapi-")
	if err != nil {
		return nil, fmt.Errorf("create server folder: %w", err)
	}
	s = &Server{Dir: dir, exited: map[*exec.Cmd]chan struct{}{}}
	defer func() {
		if err != nil {
			logs := s.tails()
			_ = s.Stop()
			err = fmt.Errorf("%w\n%s", err, logs)
		}
	}()
	ports, err := testenv.FreePorts(3)
	if err != nil {
		return nil, err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(int(ports[0]))
	peerURL := "http://127.0.0.1:" + strconv.Itoa(int(ports[1]))
	apiPort := int(ports[2])

	s.etcd, err = s.spawn("etcd",
		"--name", "kapi", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "kapi="+peerURL,
		"--unsafe-no-fsync", "--log-level", "warn")
	if err != nil {
		return s, err
	}
	if err := s.wait(ctx, opts.ReadyTimeout, s.etcd, func() bool {
		return get(etcdURL+"/health", nil) == nil
	}); err != nil {
		return s, fmt.Errorf("wait for etcd: %w", err)
	}

	if err := writeKeyPair(filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")); err != nil {
		return s, err
	}
	if err := os.WriteFile(filepath.Join(dir, "tokens.csv"),
		[]byte(token+",kapi-admin,kapi-admin-uid,system:masters\n"), 0o600); err != nil {
		return s, fmt.Errorf("write token file: %w", err)
	}
	certDir := filepath.Join(dir, "certs")
	args := []string{
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(apiPort),
		// Loopback cannot be an endpoint of the kubernetes Service.
		"--endpoint-reconciler-type", "none",
		"--cert-dir", certDir,
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(dir, "sa.key"),
		"--token-auth-file", filepath.Join(dir, "tokens.csv"),
		"--authorization-mode", "RBAC",
		"--service-cluster-ip-range", "10.0.0.0/24",
		// As kubeadm and every distribution set it: Portico's agent pods are
		// privileged (deploy/README.md says why).
		"--allow-privileged=true",
	}
	s.apiserver, err = s.spawn("kube-apiserver", append(args, opts.ExtraArgs...)...)
	if err != nil {
		return s, err
	}
	host := "https://127.0.0.1:" + strconv.Itoa(apiPort)
	insecure := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // only until the self-signed cert exists
	if err := s.wait(ctx, opts.ReadyTimeout, s.apiserver, func() bool {
		return get(host+"/readyz", insecure) == nil
	}); err != nil {
		return s, fmt.Errorf("wait for kube-apiserver: %w", err)
	}
	ca := filepath.Join(certDir, "apiserver.crt")
	s.Config = &rest.Config{
		Host:            host,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: ca},
		QPS:             500,
		Burst:           1000,
	}
	s.Kubeconfig = filepath.Join(dir, "kubeconfig")
	// Everything inline, as a federation member's kubeconfig must be.
	caPEM, err := os.ReadFile(ca)
	if err != nil {
		return s, err
	}
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: kapi
  cluster: {server: %q, certificate-authority-data: %q}
users:
- name: kapi-admin
  user: {token: %q}
contexts:
- name: kapi
  context: {cluster: kapi, user: kapi-admin}
current-context: kapi
`, host, base64.StdEncoding.EncodeToString(caPEM), token)
	if err := os.WriteFile(s.Kubeconfig, []byte(kc), 0o600); err != nil {
		return s, fmt.Errorf("write kubeconfig: %w", err)
	}
	return s, nil
}

// spawn starts one binary with its output in Dir/<name>.log. The child is killed if
// this process dies first (Pdeathsig), so a crashed test leaves nothing behind.
func (s *Server) spawn(name string, args ...string) (*exec.Cmd, error) {
	log, err := os.Create(filepath.Join(s.Dir, name+".log"))
	if err != nil {
		return nil, fmt.Errorf("create %s log: %w", name, err)
	}
	cmd := exec.Command(filepath.Join(BinDir(), name), args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	done := make(chan struct{})
	s.exited[cmd] = done
	go func() {
		_ = cmd.Wait()
		log.Close()
		close(done)
	}()
	return cmd, nil
}

// wait polls ready until it holds, the process exits, or the time is up.
func (s *Server) wait(ctx context.Context, timeout time.Duration, cmd *exec.Cmd, ready func() bool) error {
	deadline := time.Now().Add(timeout)
	for !ready() {
		select {
		case <-s.exited[cmd]:
			return fmt.Errorf("%s exited: %s", filepath.Base(cmd.Path), cmd.ProcessState)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %s", timeout)
		}
	}
	return nil
}

// PIDs returns the process ids of kube-apiserver and etcd.
func (s *Server) PIDs() (apiserver, etcd int) {
	if s.apiserver != nil {
		apiserver = s.apiserver.Process.Pid
	}
	if s.etcd != nil {
		etcd = s.etcd.Process.Pid
	}
	return apiserver, etcd
}

// Stop terminates kube-apiserver then etcd by PID (SIGTERM, SIGKILL after 10 s) and
// removes Dir. It is safe to call more than once.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		var errs []error
		for _, cmd := range []*exec.Cmd{s.apiserver, s.etcd} {
			if cmd == nil {
				continue
			}
			done := s.exited[cmd]
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		}
		if err := os.RemoveAll(s.Dir); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", s.Dir, err))
		}
		s.stopErr = errors.Join(errs...)
	})
	return s.stopErr
}

// tails returns the last lines of both logs, for start-up failures.
func (s *Server) tails() string {
	var b strings.Builder
	for _, n := range []string{"etcd", "kube-apiserver"} {
		data, err := os.ReadFile(filepath.Join(s.Dir, n+".log"))
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) > 15 {
			lines = lines[len(lines)-15:]
		}
		fmt.Fprintf(&b, "--- %s.log (tail)\n%s\n", n, strings.Join(lines, "\n"))
	}
	return b.String()
}

// Shared is one server started on first use and shared by the tests of a package,
// each in its own namespaces. Call Stop from TestMain after m.Run.
type Shared struct {
	once sync.Once
	s    *Server
	err  error
}

// Get returns the shared server, starting it on first use. It skips the test when the
// binaries are missing, unless CI is set (then it fails).
func (sh *Shared) Get(t testing.TB) *Server {
	t.Helper()
	Require(t)
	sh.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		sh.s, sh.err = Launch(ctx, Options{})
	})
	if sh.err != nil {
		t.Fatalf("start kube-apiserver: %v", sh.err)
	}
	return sh.s
}

// Stop stops the shared server if it was started.
func (sh *Shared) Stop() error {
	sh.once.Do(func() {}) // nothing starts after this
	if sh.s == nil {
		return nil
	}
	return sh.s.Stop()
}

// Require skips t when the binaries are missing, unless CI is set (then it fails).
func Require(t testing.TB) {
	t.Helper()
	if err := Available(); err != nil {
		testenv.Unavailable(t, "the API server is missing: %v", err)
	}
}

func get(url string, tlsConfig *tls.Config) error {
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig}}
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}

// writeKeyPair writes the service-account signing key pair the API server requires.
func writeKeyPair(keyPath, pubPath string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("generate service-account key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return fmt.Errorf("encode service-account public key: %w", err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return fmt.Errorf("write service-account key: %w", err)
	}
	if err := os.WriteFile(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644); err != nil {
		return fmt.Errorf("write service-account public key: %w", err)
	}
	return nil
}
