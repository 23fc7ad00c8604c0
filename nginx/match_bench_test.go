package nginx

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

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
// Lua; dynamic without telemetry or access log (BenchmarkTelemetry measures
// what they add). Each has one worker process, pinned to a CPU of its own when the machine
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
	wrk, proxyCPU, restCPU, backendPorts, statusPort := startWrkBench(b)
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
			dyn := startNginx(b, snap, func(o *Options) {
				o.WorkerProcesses, o.WorkerConnections = 1, 16384
				o.Telemetry, o.AccessLog = false, "" // what they cost: BenchmarkTelemetry
			})
			nat := startNative(b, nginxBinary(b), snap, 16384)
			targets := []*wrkTarget{
				{name: "dynamic", http: dyn.opt.HTTPPort, https: dyn.opt.HTTPSPort, worker: soleWorker(b, dyn.master(b))},
				{name: "native", http: nat.http, https: nat.https, worker: soleWorker(b, nat.master)},
			}
			for _, t := range targets {
				pin(b, t.worker, proxyCPU)
			}
			compareProtos(b, wrk, targets, snap, statusPort, restCPU)
		})
	}
}

// startWrkBench finds wrk and starts the backend (an nginx that answers
// "return 200" on three ports, with its status on statusPort), on restCPU;
// proxyCPU is the CPU for the nginx under test, -1 on one CPU.
func startWrkBench(b *testing.B) (wrk string, proxyCPU, restCPU int, backendPorts []uint16, statusPort uint16) {
	b.Helper()
	wrk = testenv.RequireProgram(b, "wrk")
	bin := nginxBinary(b)
	proxyCPU, restCPU = -1, -1
	if runtime.NumCPU() >= 2 {
		proxyCPU, restCPU = runtime.NumCPU()-1, 0
	}
	ports := testenv.Ports(b, 4)
	backendPorts, statusPort = ports[:3], ports[3]
	startReturnBackend(b, bin, backendPorts, statusPort, restCPU)
	return wrk, proxyCPU, restCPU, backendPorts, statusPort
}

// compareProtos runs comparePaired on targets over plain HTTP (every host of
// snap but sniHost) and HTTPS (its hosts with TLS, with SNI sniHost), a
// sub-benchmark each, with wrk cycling through the hosts and matchPaths.
func compareProtos(b *testing.B, wrk string, targets []*wrkTarget, snap model.Snapshot, statusPort uint16, restCPU int) {
	b.Helper()
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
			comparePaired(b, wrk, targets, url, script, hosts, statusPort, restCPU)
		})
	}
}

// comparePaired measures two nginx under the same wrk load, after a warm-up of
// each: every iteration runs wrk once against each, in alternating order, so that
// the comparison is paired. It reports, for each, requests/s (req/s), requests
// per second of the worker's CPU time (req/cpu-s), the worker's CPU time per
// request (cpu-us/req), how busy the worker was (cpu-%) and the upstream
// connections it opened per request (upconns/req); and the cost of the first
// against the second: the requests/s it loses (cost-%) and the CPU time per
// request it adds (cpu-cost-%), each with the least and the most of the
// iterations' pairs.
func comparePaired(b *testing.B, wrk string, targets []*wrkTarget, url func(*wrkTarget) string, script, hosts string, statusPort uint16, restCPU int) {
	b.Helper()
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
