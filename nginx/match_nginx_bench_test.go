package nginx

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"text/template"
	"time"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/testenv"
)

// nativeNginx is an nginx running testdata/native.conf.tmpl.
type nativeNginx struct {
	master      Master
	http, https uint16
}

type (
	nativeData struct {
		Opt                                       Options
		WorkerProcesses, WorkerConnections        int
		RlimitNofile, HashBucketSize, HashMaxSize int
		Listen, ListenTLS                         []string
		Upstreams                                 []nativeUpstream
		Servers                                   []tmplServer
	}
	nativeUpstream struct {
		Name      string
		Endpoints []netip.AddrPort
	}
)

// renderNative renders snap as testdata/native.conf.tmpl, with the renderer's
// own locations and checks (the catch-all server is not supported), and
// returns the configuration and the certificate files it names.
func renderNative(tb testing.TB, snap model.Snapshot, opt Options, workerConnections int) ([]byte, []CertFile) {
	tb.Helper()
	r := renderer{opt: opt, upstreams: map[string]model.Upstream{}, certs: map[string]certResult{}, certsIn: snap.Certificates}
	for _, u := range snap.Upstreams {
		r.upstreams[u.Name] = u
	}
	d := nativeData{Opt: opt, WorkerProcesses: 1, WorkerConnections: workerConnections, RlimitNofile: 2*workerConnections + 1024}
	d.Listen, d.ListenTLS, _ = listenAddrs(opt)
	longest := 0
	for i := range snap.Servers {
		s := &snap.Servers[i]
		if s.Host == "" {
			tb.Fatal("renderNative: no catch-all server")
		}
		ts := r.server(s)
		ts.Names = []string{serverName(s.Host)}
		d.Servers = append(d.Servers, ts)
		longest = max(longest, len(s.Host))
	}
	for _, p := range r.problems {
		if p.Reason != model.ReasonCertificateHostMismatch {
			tb.Fatalf("renderNative: %v", p)
		}
	}
	for name := range r.usedUpstreams {
		u := r.upstreams[name]
		if len(u.Endpoints) == 0 {
			tb.Fatalf("renderNative: upstream %s has no endpoints", name)
		}
		d.Upstreams = append(d.Upstreams, nativeUpstream{Name: name, Endpoints: u.Endpoints})
	}
	slices.SortFunc(d.Upstreams, func(a, b nativeUpstream) int { return strings.Compare(a.Name, b.Name) })
	d.HashBucketSize, d.HashMaxSize = serverNamesHash(len(d.Servers), longest)
	tmpl, err := template.ParseFiles("testdata/native.conf.tmpl")
	if err != nil {
		tb.Fatal(err)
	}
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, d); err != nil {
		tb.Fatal(err)
	}
	var certs []CertFile
	for _, c := range r.certs {
		certs = append(certs, c.file)
	}
	return buf.Bytes(), certs
}

// startNative runs an nginx with snap rendered by renderNative on free loopback
// ports, and waits until it answers.
func startNative(tb testing.TB, bin string, snap model.Snapshot, workerConnections int) *nativeNginx {
	tb.Helper()
	ports := testenv.Ports(tb, 2)
	opt := DefaultOptions("")
	opt.ListenAddrs = []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	opt.HTTPPort, opt.HTTPSPort = ports[0], ports[1]
	dir := prefixDir(tb)
	if err := prepareDirs(dir, opt); err != nil {
		tb.Fatal(err)
	}
	text, certs := renderNative(tb, snap, opt, workerConnections)
	if err := addCertificates(resolve(dir, opt.CertDir), certs); err != nil {
		tb.Fatal(err)
	}
	m := startConf(tb, bin, dir, text)
	n := &nativeNginx{master: m, http: opt.HTTPPort, https: opt.HTTPSPort}
	waitAnswers(tb, n.http, snap.Servers[0].Host)
	return n
}

// startConf writes conf into dir and starts an nginx master on it, which b's
// cleanup stops.
func startConf(tb testing.TB, bin, dir string, conf []byte) Master {
	tb.Helper()
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, conf, 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := (Exec{Binary: bin}).Test(context.Background(), dir, path); err != nil {
		tb.Fatal(err)
	}
	m, err := Exec{Binary: bin}.Start(dir, path)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := m.Stop(ctx); err != nil {
			tb.Error(err)
		}
	})
	return m
}

// waitAnswers waits until a request for host on the loopback port gets 200.
func waitAnswers(tb testing.TB, port uint16, host string) {
	tb.Helper()
	n := &liveNginx{opt: Options{HTTPPort: port}}
	c := n.client(false)
	testenv.Eventually(tb, 20*time.Second, func() string {
		resp, err := c.Get("http://" + host + "/")
		if err != nil {
			return err.Error()
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Sprintf("GET http://%s/: status %d", host, resp.StatusCode)
		}
		return ""
	})
}

// startReturnBackend runs an nginx with backendWorkers workers (on cpu, unless -1) that
// answers every request on every loopback address at ports with 200 "ok",
// keeping connections alive for as long as the proxies want, and counts the
// connections it accepted (stub_status on 127.0.0.1 at statusPort).
func startReturnBackend(tb testing.TB, bin string, ports []uint16, statusPort uint16, cpu int) Master {
	tb.Helper()
	dir := prefixDir(tb)
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o711); err != nil {
		tb.Fatal(err)
	}
	var listen strings.Builder
	for _, p := range ports {
		fmt.Fprintf(&listen, "        listen %d reuseport;\n", p) // every address: 127.x.y.z is loopback too
	}
	affinity := "" // the workers all on cpu
	if cpu >= 0 {
		affinity = "worker_cpu_affinity" + strings.Repeat(" 1"+strings.Repeat("0", cpu), backendWorkers) + ";"
	}
	conf := fmt.Sprintf(`worker_processes %d;
%s
worker_rlimit_nofile %d;
pid nginx.pid;
error_log stderr warn;
events {
    worker_connections 65536;
    multi_accept on;
}
http {
    access_log off;
    client_body_temp_path tmp/body;
    proxy_temp_path tmp/proxy;
    fastcgi_temp_path tmp/fastcgi;
    uwsgi_temp_path tmp/uwsgi;
    scgi_temp_path tmp/scgi;
    keepalive_requests 100000000;
    keepalive_timeout 600s;
    server {
%s        location / {
            default_type text/plain;
            return 200 "ok\n";
        }
    }
    server {
        listen 127.0.0.1:%d;
        location = /status {
            stub_status;
        }
    }
}
`, backendWorkers, affinity, min(nofileLimit(tb), 1<<20), listen.String(), statusPort)
	m := startConf(tb, bin, dir, []byte(conf))
	for _, p := range ports {
		waitAnswers(tb, p, "backend")
	}
	return m
}

// backendAccepts is how many connections the backend of startReturnBackend
// accepted so far.
func backendAccepts(tb testing.TB, statusPort uint16) int64 {
	tb.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/status", statusPort))
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	// "Active connections: 1 \nserver accepts handled requests\n 5 5 9 \n...": accepts
	// is the first number of the third line.
	lines := strings.Split(string(body), "\n")
	if len(lines) < 3 || len(strings.Fields(lines[2])) < 1 {
		tb.Fatalf("backend status: %q", body)
	}
	n, err := strconv.ParseInt(strings.Fields(lines[2])[0], 10, 64)
	if err != nil {
		tb.Fatalf("backend status: %q: %v", body, err)
	}
	return n
}

// backendWorkers is how many workers the benchmarks' backend runs, each with
// as many open files as this process may have (a container's hard limit can be
// 20,000, which root without CAP_SYS_RESOURCE cannot raise): together they take
// every idle connection both proxies keep (native keeps one per endpoint, 15,000
// with distinct endpoints; dynamic up to half its worker_connections).
const backendWorkers = 4

// nofileLimit is this process's hard limit on open files, which the nginx it
// starts inherit.
func nofileLimit(tb testing.TB) uint64 {
	tb.Helper()
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		tb.Fatal(err)
	}
	return l.Max
}

// serverName renders a host as an nginx server_name. An Ingress wildcard matches one
// label exactly, so "*.example.com" becomes a regular expression; nginx's own
// "*.example.com" would also match "a.b.example.com".
func serverName(host string) string {
	if suffix, ok := strings.CutPrefix(host, "*."); ok {
		return `"~^[^.]+\.` + strings.ReplaceAll(suffix, ".", `\.`) + `$"`
	}
	return host
}

// serverNamesHash sizes nginx's server-name hash for n exact names of at most
// longest bytes, so that large configurations build it on the first tries and
// without warnings.
func serverNamesHash(n, longest int) (bucket, maxSize int) {
	// An entry takes a pointer plus the name and two bytes, aligned to 8; a bucket
	// ends with a pointer. Room for a few entries keeps collisions cheap.
	need := 8 + (longest+2+7)&^7 + 8
	bucket = 128
	for bucket < need {
		bucket *= 2
	}
	maxSize = 1024
	for maxSize < 4*n {
		maxSize *= 2
	}
	return bucket, maxSize
}
