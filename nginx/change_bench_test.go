package nginx

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/testenv"
)

const (
	pathsPerHost = 4 // routes of each host of routesSnapshot
	// changedUpstream is the upstream of the backend named "B": a changed
	// route goes there, so a request tells whether it has the change.
	changedUpstream = "t-b-80"
	// minChanges is the fewest changes BenchmarkChangeToServed makes, so that
	// its percentiles mean something whatever the -benchtime.
	minChanges = 50
	// memChanges is how many changes BenchmarkWorkerMemory makes.
	memChanges = 1000
)

// routesSnapshot is routes routes (a route is a host and a path) on
// routes/pathsPerHost hosts, one in ten with TLS: each host has a Prefix "/",
// an Exact "/healthz", a Prefix "/api" and a Prefix "/static", on two
// upstreams of its own whose endpoints are epsA; the first host's "/static"
// goes to changedUpstream, whose endpoint is epB.
func routesSnapshot(tb testing.TB, routes int, epsA []netip.AddrPort, epB netip.AddrPort) model.Snapshot {
	var s model.Snapshot
	for i := range routes / pathsPerHost {
		web, api := fmt.Sprintf("ns%d-web%d-80", i%50, i), fmt.Sprintf("ns%d-api%d-80", i%50, i)
		srv := model.Server{Host: fmt.Sprintf("r-%d.ns%d.example.com", i, i%50), Locations: []model.Location{
			{Path: "/", Type: model.PathPrefix, Upstream: web},
			{Path: "/healthz", Type: model.PathExact, Upstream: web},
			{Path: "/api", Type: model.PathPrefix, Upstream: api},
			{Path: "/static", Type: model.PathPrefix, Upstream: web},
		}}
		if i%10 == 0 {
			c := selfSigned(tb, srv.Host)
			s.Certificates = append(s.Certificates, c)
			srv.TLSCertificate = c.Name
		}
		s.Servers = append(s.Servers, srv)
		s.Upstreams = append(s.Upstreams, model.Upstream{Name: web, Endpoints: epsA}, model.Upstream{Name: api, Endpoints: epsA})
	}
	s.Servers[0].Locations[3].Upstream = changedUpstream
	s.Upstreams = append(s.Upstreams, model.Upstream{Name: changedUpstream, Endpoints: []netip.AddrPort{epB}})
	return s
}

// changeRoute makes change i of BenchmarkChangeToServed to s: a new path on an
// existing host (odd i) or a new host (even i), either to changedUpstream. It
// returns a request (a host and a path) that the changed route alone answers
// from "B".
func changeRoute(s *model.Snapshot, i, hosts int) hostPath {
	if i%2 == 1 {
		k := i * 7919 % hosts
		p := fmt.Sprintf("/chg-%d", i)
		s.Servers[k].Locations = append(slices.Clip(s.Servers[k].Locations), model.Location{Path: p, Type: model.PathPrefix, Upstream: changedUpstream})
		return hostPath{s.Servers[k].Host, p + "/x"}
	}
	h := fmt.Sprintf("new-%d.example.com", i)
	s.Servers = append(s.Servers, model.Server{Host: h, Locations: []model.Location{{Path: "/", Type: model.PathPrefix, Upstream: changedUpstream}}})
	return hostPath{h, "/"}
}

// hostPath is a request's Host header and path.
type hostPath struct{ host, path string }

// get sends the request to nginx through c (a liveNginx.client): on one kept-alive
// connection whatever the host, since the URL's host is always the same.
func (hp hostPath) get(c *http.Client) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodGet, "http://nginx"+hp.path, nil)
	if err != nil {
		return nil, err
	}
	req.Host = hp.host
	return c.Do(req)
}

// BenchmarkChangeToServed measures a change of one route on a real nginx (two
// workers) serving 100, 1,000 and 10,000 routes (routesSnapshot): from the start
// of ApplyNow until a request through nginx gets the changed route's answer.
// Changes alternate between a new path on an existing host and a new host, both
// to another upstream; routes accumulate (10,000 routes end with about 10,050).
// An op is one change; the benchmark makes at least minChanges, whatever the
// -benchtime. It reports the change-to-served time (mean, p50 and p95 over every
// change), the render alone (ApplyResult.Render), the push alone (ApplyResult.Serve:
// the delta's computation and its PUT to the control socket), the keys each delta
// touched (ApplyResult.Keys) and the requests it took to see the change (1: the
// first request after ApplyNow returned had it).
func BenchmarkChangeToServed(b *testing.B) {
	epsA := threeBackends(b, "A")
	_, epB := backend(b, "B")
	for _, routes := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("routes=%d", routes), func(b *testing.B) {
			snap := routesSnapshot(b, routes, epsA, epB)
			hosts := len(snap.Servers)
			n := startNginx(b, snap)
			c := n.client(true)
			reloads := testutil.ToFloat64(n.r.m.reloads.WithLabelValues(ResultSuccess))
			ctx := context.Background()
			var served, render, push []float64
			var keys, polls int
			change := func() {
				hp := changeRoute(&snap, len(served)+1, hosts)
				t0 := time.Now()
				res, err := n.r.ApplyNow(ctx, snap)
				if err != nil || res.Result != ResultTable {
					b.Fatalf("apply: %s, %v", res.Result, err)
				}
				polls += waitAnswer(b, c, hp, "B ")
				served = append(served, ms(time.Since(t0)))
				render = append(render, ms(res.Render))
				push = append(push, ms(res.Serve))
				keys += res.Keys
			}
			for b.Loop() {
				change()
			}
			for len(served) < minChanges {
				change()
			}
			if got := testutil.ToFloat64(n.r.m.reloads.WithLabelValues(ResultSuccess)); got != reloads {
				b.Fatalf("%v reloads during route changes", got-reloads)
			}
			k := float64(len(served))
			b.ReportMetric(mean(served), "served-ms")
			b.ReportMetric(percentile(served, 50), "served-ms-p50")
			b.ReportMetric(percentile(served, 95), "served-ms-p95")
			b.ReportMetric(mean(render), "render-ms")
			b.ReportMetric(percentile(render, 95), "render-ms-p95")
			b.ReportMetric(mean(push), "push-ms")
			b.ReportMetric(percentile(push, 95), "push-ms-p95")
			b.ReportMetric(float64(keys)/k, "keys/change")
			b.ReportMetric(float64(polls)/k, "requests/change")
			b.ReportMetric(k, "changes")
			b.ReportMetric(float64(len(n.r.appliedTable.encode(n.r.appliedDigest, 1))), "table-bytes")
		})
	}
}

// threeBackends starts three backends that all answer with name.
func threeBackends(tb testing.TB, name string) []netip.AddrPort {
	var eps []netip.AddrPort
	for range 3 {
		_, ep := backend(tb, name)
		eps = append(eps, ep)
	}
	return eps
}

// waitAnswer sends hp until it is answered with a body that starts with want,
// and returns how many requests it sent. Errors and other answers (a host nginx
// does not know yet closes the connection) are retried for 5 seconds.
func waitAnswer(tb testing.TB, c *http.Client, hp hostPath, want string) int {
	tb.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for n := 1; ; n++ {
		resp, err := hp.get(c)
		var got string
		if err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
			resp.Body.Close()
			got = string(b)
			if strings.HasPrefix(got, want) {
				return n
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("GET http://%s%s: %q, %v after %d requests; want %q", hp.host, hp.path, got, err, n, want)
		}
	}
}

// BenchmarkWorkerMemory measures the nginx workers' memory before and after
// memChanges changes of the table at 10,000 routes (routesSnapshot, two
// workers), with requests flowing: four clients, each on a connection of its
// own, cycle through every route all along, so that the workers parse every
// changed key. "Before" is taken once every client has gone through every route
// (each worker's cache of parsed keys is full), "after" once every client has
// gone through every route again after the last change. Changes keep the table's
// size: three in four send one host's "/static" to its other upstream and back,
// one in four rotates the order of an upstream's endpoints. An op is one change
// (at least memChanges are made, whatever the -benchtime).
//
// Memory is the sum over the workers of what /proc/<pid>/smaps_rollup says:
// private (Private_Clean + Private_Dirty: pages no other process maps, which the
// worker alone is charged for: its Lua heap and nginx pools) and pss-shmem
// (Pss_Shmem: the worker's share of the shared memory it touched, the table's
// dictionary above all). The dictionary is one zone of fixed size shared by the
// master and every worker, so it is reported apart; a page of it that only one
// worker touched still shows up as private, and private-no-shm (private pages
// outside shared memory) leaves them out.
func BenchmarkWorkerMemory(b *testing.B) {
	const routes = 10000
	epsA := threeBackends(b, "A")
	_, epB := backend(b, "B")
	snap := routesSnapshot(b, routes, epsA, epB)
	hosts := len(snap.Servers)
	n := startNginx(b, snap)
	var workers []int
	if _, err := testenv.Poll(context.Background(), 10*time.Second, 10*time.Millisecond, func() bool {
		ws, err := n.master(b).Workers()
		workers = workers[:0]
		for _, w := range ws {
			if err == nil && !w.ShuttingDown {
				workers = append(workers, w.PID)
			}
		}
		return len(workers) == n.opt.WorkerProcesses
	}); err != nil {
		b.Fatalf("workers %v, want %d", workers, n.opt.WorkerProcesses)
	}

	var urls []hostPath
	for _, s := range snap.Servers {
		for _, p := range []string{"/", "/healthz", "/api/x", "/static/x"} {
			urls = append(urls, hostPath{s.Host, p})
		}
	}
	const clients = 4
	var (
		cycles   [clients]atomic.Int64 // full passes over urls, by client
		requests atomic.Int64
		failure  atomic.Value
		wg       sync.WaitGroup
	)
	ctx, stop := context.WithCancel(context.Background())
	defer func() { stop(); wg.Wait() }()
	cpu0 := map[int]time.Duration{}
	for _, w := range workers {
		cpu0[w] = cpuTime(b, w)
	}
	for k := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := n.client(true)
			for i := k * len(urls) / clients; ctx.Err() == nil; i++ {
				if i%len(urls) == 0 && i > 0 {
					cycles[k].Add(1)
				}
				hp := urls[i%len(urls)]
				resp, err := hp.get(c)
				if err != nil {
					failure.CompareAndSwap(nil, err.Error())
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				requests.Add(1)
				if resp.StatusCode != 200 {
					failure.CompareAndSwap(nil, fmt.Sprintf("GET http://%s%s: %d", hp.host, hp.path, resp.StatusCode))
				}
			}
		}()
	}
	// allCycled waits until every client has gone through every route after now.
	allCycled := func() {
		var want [clients]int64
		for k := range clients {
			want[k] = cycles[k].Load() + 2 // the pass under way may have started before now
		}
		if _, err := testenv.Poll(ctx, 5*time.Minute, 10*time.Millisecond, func() bool {
			for k := range clients {
				if cycles[k].Load() < want[k] {
					return false
				}
			}
			return true
		}); err != nil {
			b.Fatal("the clients did not go through every route within 5 minutes")
		}
		if f := failure.Load(); f != nil {
			b.Fatalf("a request failed: %v", f)
		}
	}
	allCycled()
	for _, w := range workers {
		if d := cpuTime(b, w) - cpu0[w]; d < 100*time.Millisecond {
			b.Logf("worker %d used %v of CPU while every route was requested: it may not have parsed them", w, d)
		}
	}
	before := workerMemory(b, workers)

	ctxA := context.Background()
	i := 0
	var took time.Duration
	change := func() {
		i++
		k := i * 7 % hosts
		if i%4 == 0 {
			u := &snap.Upstreams[2*k]
			u.Endpoints = append(slices.Clone(u.Endpoints[1:]), u.Endpoints[0])
		} else {
			l := slices.Clone(snap.Servers[k].Locations)
			if l[3].Upstream == l[0].Upstream {
				l[3].Upstream = l[2].Upstream
			} else {
				l[3].Upstream = l[0].Upstream
			}
			snap.Servers[k].Locations = l
		}
		t0 := time.Now()
		res, err := n.r.ApplyNow(ctxA, snap)
		if err != nil || res.Result != ResultTable {
			b.Fatalf("apply: %s, %v", res.Result, err)
		}
		took += time.Since(t0)
	}
	for b.Loop() {
		change()
	}
	for i < memChanges {
		change()
	}
	allCycled()
	after := workerMemory(b, workers)
	stop()
	wg.Wait()
	for _, w := range workers {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", w)); err != nil {
			b.Fatalf("worker %d is gone: %v", w, err)
		}
	}
	for _, f := range []string{"private", "private-no-shm", "pss-shmem", "rss"} {
		b.ReportMetric(before[f]/(1<<20), f+"-MiB-before")
		b.ReportMetric(after[f]/(1<<20), f+"-MiB-after")
	}
	b.ReportMetric((after["private"]-before["private"])/float64(i), "private-B/change")
	b.ReportMetric(float64(i), "changes")
	b.ReportMetric(ms(took)/float64(i), "apply-ms")
	b.ReportMetric(float64(requests.Load()), "requests")
}

// workerMemory sums the workers' memory figures (see BenchmarkWorkerMemory), in
// bytes.
func workerMemory(tb testing.TB, pids []int) map[string]float64 {
	tb.Helper()
	sum := map[string]float64{}
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		if err != nil {
			tb.Fatal(err)
		}
		v := map[string]float64{}
		for line := range strings.SplitSeq(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) == 3 && f[2] == "kB" {
				kb, err := strconv.ParseFloat(f[1], 64)
				if err != nil {
					tb.Fatalf("smaps_rollup of %d: %q", pid, line)
				}
				v[strings.TrimSuffix(f[0], ":")] = kb * 1024
			}
		}
		sum["private"] += v["Private_Clean"] + v["Private_Dirty"]
		sum["pss-shmem"] += v["Pss_Shmem"]
		sum["rss"] += v["Rss"]
		sum["private-no-shm"] += privateNoShm(tb, pid)
	}
	return sum
}

// privateNoShm is the private memory of pid's mappings that are not shared
// memory (/proc/<pid>/smaps: every mapping but those of nginx's shared zones,
// which show as "/dev/zero (deleted)").
func privateNoShm(tb testing.TB, pid int) float64 {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		tb.Fatal(err)
	}
	var sum float64
	shared := false
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if strings.Contains(f[0], "-") && len(f) >= 5 { // a mapping's header line
			shared = strings.Contains(line, "/dev/zero") || strings.Contains(line, "/SYSV")
			continue
		}
		if !shared && (f[0] == "Private_Clean:" || f[0] == "Private_Dirty:") && len(f) == 3 {
			kb, _ := strconv.ParseFloat(f[1], 64)
			sum += kb * 1024
		}
	}
	return sum
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func mean(s []float64) float64 {
	var t float64
	for _, v := range s {
		t += v
	}
	return t / float64(len(s))
}

// percentile is the p-th percentile (0 to 100) of samples, nearest rank.
func percentile(samples []float64, p float64) float64 {
	s := slices.Sorted(slices.Values(samples))
	if len(s) == 0 {
		return math.NaN()
	}
	k := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(k, 0)]
}
