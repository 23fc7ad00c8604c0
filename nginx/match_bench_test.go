package nginx

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/template"
	"time"

	"golang.org/x/sys/unix"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/testenv"
)

const (
	matchHosts    = 5000            // hosts of BenchmarkMatching
	matchTLSEvery = 10              // one host in matchTLSEvery has TLS
	wrkRun        = 5 * time.Second // one measured wrk run
	wrkWarmUp     = 2 * time.Second // before the first: keep-alive pools, Lua caches, JIT
	wrkConns      = 64              // wrk's connections, on one thread
	// sniHost is the name wrk's TLS connections send: wrk sends its URL's host
	// as SNI on every connection, and the URL's host must resolve.
	sniHost = "localhost"
)

// matchPaths are the paths BenchmarkMatching's requests cycle through for every
// host: the Exact one, the root, and deeper ones the Prefix "/" takes.
var matchPaths = []string{"/", "/healthz", "/api/v1/users/42", "/static/js/app.js"}

// BenchmarkMatching measures what routing by the table (portico.lua's route and
// balance, the certificate by SNI) costs nginx per request against nginx's own
// server_name and location matching, at 5,000 hosts (500 with TLS) each with a
// Prefix "/" and an Exact "/healthz" path. Two nginx serve the same snapshot:
// dynamic is what Portico renders; native is testdata/native.conf.tmpl, one
// server block per host with native upstream blocks (keepalive 32 each) and no
// Lua. Each has one worker process, pinned to a CPU of its own when the machine
// has two, so that requests/s is per core; wrk and the backend (an nginx that
// answers "return 200", so the backend costs little) share the other CPU. wrk
// (64 connections, kept alive: nginx closes one after 1,000 requests, as
// Portico's configuration says, so TLS handshakes are one per 1,000 requests)
// cycles every request through a host and a path: all 5,000 hosts over plain
// HTTP; the 500 TLS hosts over HTTPS, with SNI "localhost" (a TLS host of both)
// on every connection, since wrk sends one name. Each iteration is one wrk run
// against each nginx, in alternating order, so that the comparison is paired.
//
// Upstreams are the snapshot's, three endpoints each, either the same three
// backend addresses for every upstream (endpoints=shared: what routing costs,
// with every upstream connection reused) or three addresses of their own
// (endpoints=distinct, 127.x.y.z, as pods are: what Portico's one keepalive pool
// of 320 connections does when requests spread over 15,000 endpoints).
//
// It reports, for each, requests/s (req/s), requests per second of the worker's
// CPU time (req/cpu-s: requests/s per core, whether or not the worker was the
// limit), the worker's CPU time per request (cpu-us/req), how busy the worker
// was (cpu-%, below 100 when the CPU that wrk and the backend share, or another
// process, was the limit) and the upstream connections it opened per request
// (upconns/req, counted by the backend); and the cost of dynamic: the
// requests/s it loses against native (cost-%) and the CPU time per request it
// adds (cpu-cost-%), each with the least and the most of the iterations' pairs.
func BenchmarkMatching(b *testing.B) {
	wrk := testenv.RequireProgram(b, "wrk")
	bin := nginxBinary(b)
	proxyCPU, restCPU := -1, -1
	if runtime.NumCPU() >= 2 {
		proxyCPU, restCPU = runtime.NumCPU()-1, 0
	}
	ports := testenv.Ports(b, 4)
	backendPorts, statusPort := ports[:3], ports[3]
	startReturnBackend(b, bin, backendPorts, statusPort, restCPU)
	for _, layout := range []string{"shared", "distinct"} {
		b.Run("endpoints="+layout, func(b *testing.B) {
			eps := func(i int) []netip.AddrPort {
				var l []netip.AddrPort
				for k, p := range backendPorts {
					a := netip.AddrFrom4([4]byte{127, 0, 0, 1})
					if layout == "distinct" {
						a = netip.AddrFrom4([4]byte{127, byte(k + 1), byte(i >> 8), byte(i)})
					}
					l = append(l, netip.AddrPortFrom(a, p))
				}
				return l
			}
			snap := matchSnapshot(b, eps)
			dyn := startNginx(b, snap, func(o *Options) { o.WorkerProcesses, o.WorkerConnections = 1, 16384 })
			nat := startNative(b, bin, snap, 16384)
			targets := []*wrkTarget{
				{name: "dynamic", http: dyn.opt.HTTPPort, https: dyn.opt.HTTPSPort, worker: soleWorker(b, dyn.master(b))},
				{name: "native", http: nat.http, https: nat.https, worker: soleWorker(b, nat.master)},
			}
			for _, t := range targets {
				pin(b, t.worker, proxyCPU)
			}
			dir := b.TempDir()
			script := filepath.Join(dir, "cycle.lua")
			if err := os.WriteFile(script, []byte(wrkCycleScript()), 0o644); err != nil {
				b.Fatal(err)
			}
			var plain, secure []string
			for _, s := range snap.Servers {
				if s.Host == sniHost {
					continue
				}
				plain = append(plain, s.Host)
				if s.TLSCertificate != "" {
					secure = append(secure, s.Host)
				}
			}
			for _, proto := range []struct {
				name  string
				hosts []string
			}{{"http", plain}, {"https", secure}} {
				b.Run("proto="+proto.name, func(b *testing.B) {
					hosts := filepath.Join(dir, proto.name+".hosts")
					if err := os.WriteFile(hosts, []byte(strings.Join(proto.hosts, "\n")+"\n"), 0o644); err != nil {
						b.Fatal(err)
					}
					url := func(t *wrkTarget) string {
						if proto.name == "https" {
							return fmt.Sprintf("https://%s:%d/", sniHost, t.https)
						}
						return fmt.Sprintf("http://127.0.0.1:%d/", t.http)
					}
					for _, t := range targets {
						t.reset()
						runWrk(b, wrk, url(t), script, hosts, wrkWarmUp, restCPU)
					}
					var costs, cpuCosts []float64
					i := 0
					for b.Loop() {
						order := targets
						if i%2 == 1 {
							order = []*wrkTarget{targets[1], targets[0]}
						}
						i++
						for _, t := range order {
							cpu0, acc0 := cpuTime(b, t.worker), backendAccepts(b, statusPort)
							w := runWrk(b, wrk, url(t), script, hosts, wrkRun, restCPU)
							cpu := cpuTime(b, t.worker) - cpu0
							t.cpu += cpu
							t.conns += backendAccepts(b, statusPort) - acc0
							t.requests += w.requests
							t.wall += w.duration
							t.lastRate = float64(w.requests) / w.duration.Seconds()
							t.lastCPU = cpu.Seconds() / float64(w.requests)
						}
						d, n := targets[0], targets[1]
						costs = append(costs, 100*(1-d.lastRate/n.lastRate))
						cpuCosts = append(cpuCosts, 100*(d.lastCPU/n.lastCPU-1))
					}
					for _, t := range targets {
						b.ReportMetric(t.rate(), t.name+"-req/s")
						b.ReportMetric(float64(t.requests)/t.cpu.Seconds(), t.name+"-req/cpu-s")
						b.ReportMetric(float64(t.cpu.Microseconds())/float64(t.requests), t.name+"-cpu-us/req")
						b.ReportMetric(100*t.cpu.Seconds()/t.wall.Seconds(), t.name+"-cpu-%")
						b.ReportMetric(float64(t.conns)/float64(t.requests), t.name+"-upconns/req")
					}
					d, n := targets[0], targets[1]
					b.ReportMetric(100*(1-d.rate()/n.rate()), "cost-%")
					b.ReportMetric(slices.Min(costs), "cost-%-min")
					b.ReportMetric(slices.Max(costs), "cost-%-max")
					b.ReportMetric(100*(d.perRequest()/n.perRequest()-1), "cpu-cost-%")
					b.ReportMetric(slices.Min(cpuCosts), "cpu-cost-%-min")
					b.ReportMetric(slices.Max(cpuCosts), "cpu-cost-%-max")
					b.ReportMetric(0, "ns/op") // an op is a pair of wrk runs: its time says nothing
				})
			}
		})
	}
}

// wrkTarget is one nginx under BenchmarkMatching's load and what it served.
type wrkTarget struct {
	name        string
	http, https uint16
	worker      int
	requests    int64
	conns       int64 // connections the backend accepted
	wall, cpu   time.Duration
	lastRate    float64 // requests/s of the last run
	lastCPU     float64 // the worker's CPU seconds per request in the last run
}

func (t *wrkTarget) reset() { t.requests, t.conns, t.wall, t.cpu = 0, 0, 0, 0 }

func (t *wrkTarget) rate() float64 { return float64(t.requests) / t.wall.Seconds() }

func (t *wrkTarget) perRequest() float64 { return t.cpu.Seconds() / float64(t.requests) }

// wrkCycleScript makes every wrk request the next of every host (one a line in
// the file that is the script's argument) and every one of matchPaths, and
// prints what wrk counted on one line that runWrk reads.
func wrkCycleScript() string {
	var paths []string
	for _, p := range matchPaths {
		paths = append(paths, strconv.Quote(p))
	}
	return `
local reqs, i = {}, 0
function init(args)
    local hosts = {}
    for h in io.lines(args[1]) do
        hosts[#hosts + 1] = h
    end
    for _, p in ipairs({` + strings.Join(paths, ", ") + `}) do
        for _, h in ipairs(hosts) do
            reqs[#reqs + 1] = wrk.format("GET", p, { Host = h })
        end
    end
    i = math.random(#reqs)
end
function request()
    i = i % #reqs + 1
    return reqs[i]
end
function done(s)
    local e = s.errors
    io.write(string.format("portico-wrk %d %d %d %d %d %d %d\n", s.requests, s.duration,
        e.connect, e.read, e.write, e.status, e.timeout))
end
`
}

type wrkResult struct {
	requests int64
	duration time.Duration
}

// runWrk runs wrk for d against url with the cycling script over the hosts in
// the file hosts, on cpu when it is not -1. Any error wrk counts (a refused
// connection, a closed one, a status of 400 or more) fails b.
func runWrk(b *testing.B, wrk, url, script, hosts string, d time.Duration, cpu int) wrkResult {
	b.Helper()
	args := []string{wrk, "-t1", "-c" + strconv.Itoa(wrkConns), "-d" + strconv.Itoa(int(d.Seconds())) + "s",
		"--timeout", "5s", "-s", script, url, "--", hosts}
	if cpu >= 0 {
		if ts, err := exec.LookPath("taskset"); err == nil {
			args = append([]string{ts, "-c", strconv.Itoa(cpu)}, args...)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
	if err != nil {
		b.Fatalf("wrk %s: %v\n%s", url, err, out)
	}
	for line := range strings.SplitSeq(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 8 || f[0] != "portico-wrk" {
			continue
		}
		var v [7]int64
		for i := range v {
			if v[i], err = strconv.ParseInt(f[i+1], 10, 64); err != nil {
				b.Fatalf("wrk: %q: %v", line, err)
			}
		}
		if v[2]+v[3]+v[4]+v[5]+v[6] != 0 || v[0] == 0 {
			b.Fatalf("wrk %s: %d requests, errors: connect %d, read %d, write %d, status %d, timeout %d\n%s",
				url, v[0], v[2], v[3], v[4], v[5], v[6], out)
		}
		return wrkResult{requests: v[0], duration: time.Duration(v[1]) * time.Microsecond}
	}
	b.Fatalf("wrk %s: no summary line in\n%s", url, out)
	return wrkResult{}
}

// matchSnapshot is ingressSnapshotTLS(5000, 10) with eps(i) the endpoints of
// host i's upstream, no HTTPS redirect (plain HTTP reaches every host), and the
// TLS host sniHost.
func matchSnapshot(tb testing.TB, eps func(i int) []netip.AddrPort) model.Snapshot {
	s := ingressSnapshotTLS(tb, matchHosts, matchTLSEvery)
	for i := range s.Servers {
		s.Servers[i].SSLRedirect = false
		s.Upstreams[i].Endpoints = eps(i)
	}
	c := selfSigned(tb, sniHost)
	s.Certificates = append(s.Certificates, c)
	s.Servers = append(s.Servers, model.Server{Host: sniHost, TLSCertificate: c.Name, Locations: s.Servers[0].Locations})
	return s
}

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

// startReturnBackend runs an nginx with one worker (on cpu, unless -1) that
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
		fmt.Fprintf(&listen, "        listen %d;\n", p) // every address: 127.x.y.z is loopback too
	}
	conf := fmt.Sprintf(`worker_processes 1;
worker_rlimit_nofile 200000;
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
`, listen.String(), statusPort)
	m := startConf(tb, bin, dir, []byte(conf))
	pin(tb, soleWorker(tb, m), cpu)
	for _, p := range ports {
		waitAnswers(tb, p, "backend")
	}
	return m
}

// master is the Reloader's running master.
func (n *liveNginx) master(tb testing.TB) Master {
	tb.Helper()
	n.r.mu.Lock()
	defer n.r.mu.Unlock()
	if n.r.master == nil {
		tb.Fatal("no nginx master")
	}
	return n.r.master
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

// soleWorker waits for m's one worker process and returns its pid.
func soleWorker(tb testing.TB, m Master) int {
	tb.Helper()
	var pid int
	testenv.Eventually(tb, 10*time.Second, func() string {
		ws, err := m.Workers()
		if err != nil {
			return err.Error()
		}
		var live []int
		for _, w := range ws {
			if !w.ShuttingDown {
				live = append(live, w.PID)
			}
		}
		if len(live) != 1 {
			return fmt.Sprintf("workers %v, want one", live)
		}
		pid = live[0]
		return ""
	})
	return pid
}

// pin binds pid to cpu (-1: leaves it alone).
func pin(tb testing.TB, pid, cpu int) {
	tb.Helper()
	if cpu < 0 {
		return
	}
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(pid, &set); err != nil {
		tb.Fatalf("pin %d to CPU %d: %v", pid, cpu, err)
	}
}

// cpuTime is the CPU time pid has run (/proc/<pid>/schedstat, in nanoseconds).
func cpuTime(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		tb.Fatalf("schedstat of %d: %q", pid, b)
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ns)
}
