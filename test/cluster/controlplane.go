package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/portico-edge/portico/test/kapi"
)

// startControlPlane starts etcd, kube-apiserver, kube-controller-manager and
// kube-scheduler inside the switch namespace, and waits for the API server.
func (c *Cluster) startControlPlane(ctx context.Context) error {
	deadline := time.Now().Add(c.opts.ReadyTimeout)
	var err error
	if c.pki, err = writePKI(c.Dir, net.IP(APIAddr.AsSlice()), net.IPv4(10, 0, 0, 1)); err != nil {
		return err
	}
	// Static tokens: the administrator, and one identity per node for the Node
	// authorizer (system:node:<name> in group system:nodes).
	tokens := []string{adminToken + ",portico-admin,portico-admin,system:masters"}
	for i := 1; i <= c.opts.Nodes; i++ {
		name := c.nodeName(i)
		c.tokens[name] = "node-" + randomHex(16)
		tokens = append(tokens, fmt.Sprintf("%s,system:node:%s,%s,system:nodes", c.tokens[name], name, name))
	}
	// kube-proxy's identity: the API server's bootstrap policy binds
	// system:node-proxier to the user system:kube-proxy.
	c.tokens[kubeProxyUser] = "kube-proxy-" + randomHex(16)
	tokens = append(tokens, fmt.Sprintf("%s,%s,%s", c.tokens[kubeProxyUser], kubeProxyUser, kubeProxyUser))
	tokenFile := filepath.Join(c.Dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(strings.Join(tokens, "\n")+"\n"), 0o600); err != nil {
		return fmt.Errorf("write token file: %w", err)
	}
	server := "https://" + net.JoinHostPort(APIAddr.String(), strconv.Itoa(apiPort))
	c.Kubeconfig = filepath.Join(c.Dir, "admin.kubeconfig")
	if err := writeKubeconfig(c.Kubeconfig, server, c.pki.CACert, "portico-admin", adminToken); err != nil {
		return err
	}

	bin := kapi.BinDir()
	etcd, err := c.spawnControl("etcd", filepath.Join(bin, "etcd"),
		"--name", "lab", "--data-dir", filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "lab=http://127.0.0.1:2380", "--unsafe-no-fsync", "--log-level", "warn")
	if err != nil {
		return err
	}
	etcdHealth := &http.Client{Timeout: time.Second, Transport: &http.Transport{DialContext: dialer(c.Net.Switch)}}
	if err := etcd.wait(ctx, deadline, func() bool { return httpOK(etcdHealth, "http://127.0.0.1:2379/health", "") }); err != nil {
		return fmt.Errorf("wait for etcd: %w", err)
	}

	apiserver, err := c.spawnControl("kube-apiserver", filepath.Join(bin, "kube-apiserver"),
		"--etcd-servers", "http://127.0.0.1:2379",
		"--bind-address", "0.0.0.0", "--advertise-address", APIAddr.String(), "--secure-port", strconv.Itoa(apiPort),
		"--tls-cert-file", c.pki.ServingCert, "--tls-private-key-file", c.pki.ServingKey,
		"--client-ca-file", c.pki.CACert,
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", c.pki.SAPub, "--service-account-signing-key-file", c.pki.SAKey,
		"--token-auth-file", tokenFile,
		"--authorization-mode", "Node,RBAC", "--enable-admission-plugins", "NodeRestriction",
		"--service-cluster-ip-range", ServiceCIDR.String(),
		// Portico's agent pods are privileged, as kubeadm and every distribution allow.
		"--allow-privileged=true",
		"--kubelet-preferred-address-types", "InternalIP")
	if err != nil {
		return err
	}
	ca, err := os.ReadFile(c.pki.CACert)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	readyz := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: dialer(c.Net.Switch), TLSClientConfig: &tls.Config{RootCAs: pool}}}
	if err := apiserver.wait(ctx, deadline, func() bool { return httpOK(readyz, server+"/readyz", adminToken) }); err != nil {
		return fmt.Errorf("wait for kube-apiserver: %w", err)
	}
	c.Config = &rest.Config{
		Host:            server,
		BearerToken:     adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAFile: c.pki.CACert},
		Dial:            dialer(c.Net.Switch),
		QPS:             100,
		Burst:           200,
	}
	if c.Kube, err = kubernetes.NewForConfig(c.Config); err != nil {
		return err
	}

	// The controllers and the scheduler use the administrator's credentials
	// (--use-service-account-credentials=false): the lab tests what they do, not
	// their RBAC.
	kc := []string{"--kubeconfig", c.Kubeconfig, "--authentication-kubeconfig", c.Kubeconfig,
		"--authorization-kubeconfig", c.Kubeconfig, "--leader-elect=false", "--bind-address", "127.0.0.1"}
	if _, err := c.spawnControl("kube-controller-manager", append(append([]string{filepath.Join(BinDir(), "kube-controller-manager")}, kc...),
		"--controllers", "*",
		"--use-service-account-credentials=false",
		"--service-account-private-key-file", c.pki.SAKey,
		"--root-ca-file", c.pki.CACert,
		"--cluster-signing-cert-file", c.pki.CACert, "--cluster-signing-key-file", c.pki.CAKey,
		// A lab value (Kubernetes' default is 50 s): tests wait for NotReady.
		"--node-monitor-grace-period", c.opts.NodeMonitorGracePeriod.String(),
		"--node-monitor-period", "1s")...); err != nil {
		return err
	}
	if _, err := c.spawnControl("kube-scheduler", append([]string{filepath.Join(BinDir(), "kube-scheduler")}, kc...)...); err != nil {
		return err
	}
	return nil
}

// spawnControl starts argv inside the switch namespace (nsenter execs it: the PID is
// the program's).
func (c *Cluster) spawnControl(name string, argv ...string) (*proc, error) {
	argv = append([]string{"nsenter", "--net=/run/netns/" + c.Net.Switch, "--"}, argv...)
	p, err := spawn(name, filepath.Join(c.Dir, name+".log"), argv...)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.control = append(c.control, p)
	c.mu.Unlock()
	return p, nil
}

// writeKubeconfig writes a kubeconfig for server, trusting ca, with a bearer token.
func writeKubeconfig(path, server, ca, user, token string) error {
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: portico-lab
  cluster: {server: %q, certificate-authority: %q}
users:
- name: %s
  user: {token: %q}
contexts:
- name: portico-lab
  context: {cluster: portico-lab, user: %s}
current-context: portico-lab
`, server, ca, user, token, user)
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

// httpOK reports whether GET url answers 200.
func httpOK(c *http.Client, url, token string) bool {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// KubectlCommand is the command line of the real kubectl (test/kapi's build) against
// the cluster: run from inside the switch namespace, its discovery cache in the run's
// folder rather than in ~/.kube.
func (c *Cluster) KubectlCommand() []string {
	return []string{"nsenter", "--net=/run/netns/" + c.Net.Switch, "--", filepath.Join(kapi.BinDir(), "kubectl"),
		"--kubeconfig", c.Kubeconfig, "--cache-dir", filepath.Join(c.Dir, "kubectl-cache")}
}

// Kubectl runs KubectlCommand with args, stdin as its input (nil for none), and
// returns its standard output; a failure carries its standard error.
func (c *Cluster) Kubectl(ctx context.Context, stdin io.Reader, args ...string) (string, error) {
	argv := append(c.KubectlCommand(), args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
