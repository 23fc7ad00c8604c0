package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/test/netlab"
	"github.com/portico-edge/portico/test/testenv"
)

// TestPropagationBench measures (make bench-propagation; not in make test) how long
// a change takes to be served by every edge at 1,000 and 10,000 routes: for each
// of TRIALS new Ingresses, the time from the API write until each edge first
// answers the new host correctly through the VIP (new connections, one every
// 2 ms, spread over the edges by the directors' rings). It also reports the
// edges' CPU (agents and nginx) per change and the agents' and nginx workers'
// memory before and after the changes.
func TestPropagationBench(t *testing.T) {
	trials := testenv.BenchTrials(t, "PORTICO_BENCH_PROPAGATION", "bench-propagation")
	l := startLab(t)
	ctx := context.Background()
	routes := 0
	for _, want := range []int{1000, 10000} {
		// Ten paths per Ingress, one host each, to the lab's echo Service.
		if err := l.scaleRoutes(ctx, routes/10, want/10); err != nil {
			t.Fatal(err)
		}
		routes = want
		last := fmt.Sprintf("s-%d.scale.lab", routes/10-1)
		if err := l.waitServed(ctx, 5*time.Minute, last, "/p9/x", nil); err != nil {
			t.Fatalf("%d routes: %v", routes, err)
		}
		time.Sleep(2 * time.Second) // let the last bursts settle
		cpu0, mem0 := l.edgeUsage(t)
		// PORTICO_BENCH_PROFILE=dir: a CPU profile of edge 0's agent over the
		// changes at each size, dir/agent-<routes>.pprof (go tool pprof).
		profiled := make(chan error, 1)
		if dir := os.Getenv("PORTICO_BENCH_PROFILE"); dir != "" {
			secs := trials * 300 / 1000 // the changes take about 300 ms each
			go func() {
				out, err := netlab.Exec(l.Edges[0].NS, "curl", "-sS", "-o", filepath.Join(dir, fmt.Sprintf("agent-%d.pprof", routes)),
					fmt.Sprintf("http://127.0.0.1:9101/debug/pprof/profile?seconds=%d", secs))
				if err != nil {
					err = fmt.Errorf("%w: %s", err, out)
				}
				profiled <- err
			}()
		} else {
			profiled <- nil
		}
		var took []time.Duration
		for i := range trials {
			host := fmt.Sprintf("new-%d-%d.scale.lab", routes, i)
			d, err := l.changeToServed(ctx, host)
			if err != nil {
				t.Fatalf("%d routes, change %d: %v", routes, i+1, err)
			}
			took = append(took, d...)
			time.Sleep(200 * time.Millisecond)
		}
		if err := <-profiled; err != nil {
			t.Errorf("profile: %v", err)
		}
		cpu1, mem1 := l.edgeUsage(t)
		slices.Sort(took)
		q := func(p int) time.Duration { return took[(len(took)-1)*p/100].Round(100 * time.Microsecond) }
		t.Logf("%5d routes: change to served at each edge over %d changes x %d edges: p50 %v  p95 %v  max %v",
			routes, trials, len(l.Edges), q(50), q(95), q(100))
		t.Logf("%5d routes: CPU per change per edge (agent + nginx) %.1f ms; memory per edge, agent RSS %d -> %d MiB, nginx workers private %d -> %d MiB",
			routes, (cpu1-cpu0)*1000/float64(trials*len(l.Edges)), mem0.agent>>20, mem1.agent>>20, mem0.nginx>>20, mem1.nginx>>20)
	}
}

// scaleRoutes creates the Ingresses s-from to s-(to-1), each one host with ten
// Prefix paths (/p0 to /p9) to the echo Service, eight at a time.
func (l *Lab) scaleRoutes(ctx context.Context, from, to int) error {
	pt := networkingv1.PathTypePrefix
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	next := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				rule := networkingv1.IngressRule{Host: fmt.Sprintf("s-%d.scale.lab", i),
					IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{}}}
				for p := range 10 {
					rule.HTTP.Paths = append(rule.HTTP.Paths, networkingv1.HTTPIngressPath{Path: fmt.Sprintf("/p%d", p), PathType: &pt,
						Backend: networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: "echo", Port: networkingv1.ServiceBackendPort{Name: "http"}}}})
				}
				ing := &networkingv1.Ingress{
					ObjectMeta: metav1.ObjectMeta{Namespace: AppNamespace, Name: fmt.Sprintf("s-%d", i),
						Annotations: map[string]string{"portico.io/group": GroupNamespace + "/" + GroupName}},
					Spec: networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{rule}},
				}
				if _, err := l.Kube.NetworkingV1().Ingresses(AppNamespace).Create(ctx, ing, metav1.CreateOptions{}); err != nil {
					select {
					case errs <- fmt.Errorf("create ingress %s: %w", ing.Name, err):
					default:
					}
				}
			}
		}()
	}
	for i := from; i < to; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// changeToServed creates an Ingress for host and returns, for each edge, the time
// from the API write until that edge first answered it. New connections, one
// every 2 ms, for at most 10 s.
func (l *Lab) changeToServed(ctx context.Context, host string) ([]time.Duration, error) {
	c := l.HTTPClient(false, time.Second)
	start := time.Now()
	if err := l.Ingress(ctx, strings.ReplaceAll(strings.TrimSuffix(host, ".scale.lab"), ".", "-"), host, "echo"); err != nil {
		return nil, err
	}
	first := map[string]time.Duration{}
	for time.Since(start) < 10*time.Second && len(first) < len(l.Edges) {
		if r, err := l.Get(ctx, c, host, "/"); err == nil && r.Host == host {
			if _, ok := first[r.Edge]; !ok {
				first[r.Edge] = time.Since(start)
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	if len(first) < len(l.Edges) {
		return nil, fmt.Errorf("%s served by %d of %d edges after 10s", host, len(first), len(l.Edges))
	}
	var out []time.Duration
	for _, d := range first {
		out = append(out, d)
	}
	return out, nil
}

type edgeMemory struct{ agent, nginx int64 }

// edgeUsage sums, over the edges, the CPU seconds the agents and their nginx
// processes used so far, and their memory: the agents' resident set and the nginx
// workers' private memory (the shared dictionary is shared memory, counted once
// by the kernel and not here).
func (l *Lab) edgeUsage(t *testing.T) (cpu float64, mem edgeMemory) {
	t.Helper()
	for i, e := range l.Edges {
		a := l.Agent(i)
		pids := []int{a.cmd.Process.Pid}
		ng, err := l.NginxPIDs(e)
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, ng...)
		for j, p := range pids {
			cpu += procCPU(t, p)
			switch {
			case j == 0:
				mem.agent += procField(t, p, "status", "VmRSS:") << 10
			case j > 1: // workers; ng[0] is the master
				mem.nginx += procField(t, p, "smaps_rollup", "Private_Clean:") << 10
				mem.nginx += procField(t, p, "smaps_rollup", "Private_Dirty:") << 10
			}
		}
	}
	return cpu, mem
}

// procCPU is a process's user and system time in seconds (its own, not its
// children's).
func procCPU(t *testing.T, pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command (which may hold spaces) start at state (3rd).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

// procField reads a "Name: <kB> kB" line of /proc/<pid>/<file>.
func procField(t *testing.T, pid int, file, name string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, file))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, name); ok {
			n, _ := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			return n
		}
	}
	return 0
}
