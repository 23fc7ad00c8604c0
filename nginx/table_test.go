package nginx

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/testenv"
)

// epSnapshot routes e.test to the upstream t-e-80 with the given endpoints, and
// f.test (plus any extra hosts) to t-f-80, which has ep.
func epSnapshot(f netip.AddrPort, eps []netip.AddrPort, extraHosts ...string) model.Snapshot {
	s := model.Snapshot{
		Servers: []model.Server{
			{Host: "e.test", DefaultUpstream: "t-e-80"},
			{Host: "f.test", DefaultUpstream: "t-f-80"},
		},
		Upstreams: []model.Upstream{
			{Name: "t-e-80", Endpoints: eps},
			{Name: "t-f-80", Endpoints: []netip.AddrPort{f}},
		},
	}
	for _, h := range extraHosts {
		s.Servers = append(s.Servers, model.Server{Host: h, DefaultUpstream: "t-f-80"})
	}
	return s
}

// workerPIDs lists the master's worker processes (from /proc), sorted.
func workerPIDs(t *testing.T, n *liveNginx) []int {
	t.Helper()
	n.r.mu.Lock()
	m := n.r.master
	n.r.mu.Unlock()
	if m == nil {
		t.Fatal("no master")
	}
	ws, err := m.Workers()
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, w := range ws {
		if w.ShuttingDown {
			continue
		}
		pids = append(pids, w.PID)
	}
	slices.Sort(pids)
	return pids
}

// backendsSeen sends requests to url and returns which backends answered, by the
// name they answer with. Any status but 200 and want is a failure.
func backendsSeen(t *testing.T, c *http.Client, url string, requests, want int) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for range requests {
		resp, body := get(t, c, url)
		if resp.StatusCode != want {
			t.Fatalf("GET %s = %d %q, want %d", url, resp.StatusCode, body, want)
		}
		if want == 200 {
			seen[strings.Fields(body)[0]]++
		}
	}
	return seen
}

// An endpoint-only change reaches the running workers through the control socket:
// no nginx -t, no reload, the same worker processes, and the next requests go to
// the new endpoint set.
func TestEndpointOnlyChangesNeedNoReload(t *testing.T) {
	_, epA := backend(t, "A")
	_, epB := backend(t, "B")
	_, epC := backend(t, "C")
	n := startNginx(t, epSnapshot(epC, []netip.AddrPort{epA}))
	c := n.client(false)
	if seen := backendsSeen(t, c, "http://e.test/", 6, 200); len(seen) != 1 || seen["A"] != 6 {
		t.Fatalf("before any change e.test reached %v, want only A", seen)
	}
	master := n.r.MasterPID()
	if _, err := testenv.Poll(t.Context(), 10*time.Second, 5*time.Millisecond, func() bool { return len(workerPIDs(t, n)) == 2 }); err != nil {
		t.Fatalf("waiting for two workers: %v", err)
	}
	workers := workerPIDs(t, n)
	confBefore, err := os.ReadFile(n.r.confPath())
	if err != nil {
		t.Fatal(err)
	}
	reloads := testutil.ToFloat64(n.r.m.reloads.WithLabelValues(ResultSuccess))

	for i, step := range []struct {
		name string
		eps  []netip.AddrPort
		want map[string]bool // backends that must all answer; nil: 503
	}{
		{"add an endpoint", []netip.AddrPort{epA, epB}, map[string]bool{"A": true, "B": true}},
		{"remove one", []netip.AddrPort{epB}, map[string]bool{"B": true}},
		{"three", []netip.AddrPort{epA, epB, epC}, map[string]bool{"A": true, "B": true, "C": true}},
		{"none", nil, nil},
		{"back again", []netip.AddrPort{epC}, map[string]bool{"C": true}},
	} {
		res, err := n.r.ApplyNow(context.Background(), epSnapshot(epC, step.eps))
		if err != nil || res.Result != ResultTable {
			t.Fatalf("%s: apply = %s, %v; want %s", step.name, res.Result, err, ResultTable)
		}
		// The change shows on the very next requests, on every worker.
		if step.want == nil {
			backendsSeen(t, c, "http://e.test/", 6, 503)
		} else {
			seen := backendsSeen(t, c, "http://e.test/", 12, 200)
			got := map[string]bool{}
			for b := range seen {
				got[b] = true
			}
			if diff := cmp.Diff(step.want, got); diff != "" {
				t.Errorf("%s: backends that answered (-want +got):\n%s", step.name, diff)
			}
		}
		if seen := backendsSeen(t, c, "http://f.test/", 2, 200); seen["C"] != 2 {
			t.Errorf("%s: the untouched upstream reached %v, want C", step.name, seen)
		}
		if got := n.r.MasterPID(); got != master {
			t.Errorf("%s: master %d, want still %d", step.name, got, master)
		}
		if got := workerPIDs(t, n); !slices.Equal(got, workers) {
			t.Errorf("%s: workers %v, want still %v (no reload)", step.name, got, workers)
		}
		if got := testutil.ToFloat64(n.r.m.reloads.WithLabelValues(ResultSuccess)); got != reloads {
			t.Errorf("%s: reloads_total{result=success} = %v, want still %v", step.name, got, reloads)
		}
		if got := testutil.ToFloat64(n.r.m.tableUpdates.WithLabelValues(ResultSuccess)); got != float64(i+1) {
			t.Errorf("%s: endpoint_updates_total{result=success} = %v, want %d", step.name, got, i+1)
		}
		if v, err := tableDigest(context.Background(), n.r.ctl); err != nil || v != res.Digest {
			t.Errorf("%s: nginx uses endpoint table %q (%v), want %q", step.name, v, err, res.Digest)
		}
	}
	if conf, _ := os.ReadFile(n.r.confPath()); string(conf) != string(confBefore) {
		t.Error("nginx.conf changed for endpoint-only changes")
	}
	// The same snapshot again does nothing.
	if res, err := n.r.ApplyNow(context.Background(), epSnapshot(epC, []netip.AddrPort{epC})); err != nil || res.Result != ResultUnchanged {
		t.Errorf("same snapshot again: %s, %v; want %s", res.Result, err, ResultUnchanged)
	}
}

// The changes nginx took without a reload are still used after a reload and after
// the master was killed and started again: both load the table from its file.
func TestTableSurvivesReloadAndMasterRestart(t *testing.T) {
	_, epA := backend(t, "A")
	_, epB := backend(t, "B")
	_, epC := backend(t, "C")
	n := startNginx(t, epSnapshot(epC, []netip.AddrPort{epA}))
	c := n.client(false)
	res, err := n.r.ApplyNow(context.Background(), epSnapshot(epC, []netip.AddrPort{epB}))
	if err != nil || res.Result != ResultTable {
		t.Fatalf("endpoint-only change: %s, %v", res.Result, err)
	}
	onlyB := func(when string) {
		t.Helper()
		if seen := backendsSeen(t, c, "http://e.test/", 8, 200); len(seen) != 1 || seen["B"] != 8 {
			t.Errorf("%s: e.test reached %v, want only B", when, seen)
		}
	}
	onlyB("after the endpoint update")

	if _, err := testenv.Poll(t.Context(), 10*time.Second, 5*time.Millisecond, func() bool { return len(workerPIDs(t, n)) == 2 }); err != nil {
		t.Fatalf("waiting for two workers: %v", err)
	}
	workers := workerPIDs(t, n)
	res, err = n.r.ApplyNow(context.Background(), epSnapshot(epC, []netip.AddrPort{epB}, "g.test"))
	if err != nil || res.Result != ResultTable {
		t.Fatalf("a new host: %s, %v", res.Result, err)
	}
	n.r.mu.Lock()
	m := n.r.master
	n.r.mu.Unlock()
	if err := m.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(t.Context(), 10*time.Second, 5*time.Millisecond, func() bool { got := workerPIDs(t, n); return len(got) == 2 && !slices.Contains(got, workers[0]) }); err != nil {
		t.Fatalf("waiting for new workers: %v", err)
	}
	onlyB("after a reload")
	if seen := backendsSeen(t, c, "http://g.test/", 2, 200); seen["C"] != 2 {
		t.Errorf("the new host reached %v, want C", seen)
	}

	pid := n.r.MasterPID()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(t.Context(), 10*time.Second, 5*time.Millisecond, func() bool { p := n.r.MasterPID(); return p != 0 && p != pid }); err != nil {
		t.Fatalf("waiting for a new master: %v", err)
	}
	n.waitChecksum(t, res.Checksum)
	n.waitTable(t, res.Digest)
	onlyB("after the master was killed and restarted")

	// The new master takes live changes too.
	res, err = n.r.ApplyNow(context.Background(), epSnapshot(epC, []netip.AddrPort{epA}, "g.test"))
	if err != nil || res.Result != ResultTable {
		t.Fatalf("endpoint-only change after the restart: %s, %v", res.Result, err)
	}
	if seen := backendsSeen(t, c, "http://e.test/", 8, 200); len(seen) != 1 || seen["A"] != 8 {
		t.Errorf("after a change to the restarted master e.test reached %v, want only A", seen)
	}
}

// A connection refused by one endpoint is retried on the next: requests succeed as
// long as one endpoint answers.
func TestEndpointRetriesTheNextOnConnectionFailure(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := netip.MustParseAddrPort(l.Addr().String())
	l.Close() // nothing listens there any more: connections are refused
	_, epA := backend(t, "A")
	n := startNginx(t, epSnapshot(epA, []netip.AddrPort{dead, epA}))
	if seen := backendsSeen(t, n.client(false), "http://e.test/", 10, 200); seen["A"] != 10 {
		t.Errorf("e.test reached %v, want A for all 10 requests", seen)
	}
}

// The control socket checks what it is sent: a malformed table is refused and the
// one in use stays.
func TestControlSocketRefusesMalformedTables(t *testing.T) {
	_, epA := backend(t, "A")
	n := startNginx(t, epSnapshot(epA, []netip.AddrPort{epA}))
	before, err := tableDigest(context.Background(), n.r.ctl)
	if err != nil {
		t.Fatal(err)
	}
	h := deltaHeader + before + " 00 1\n"
	for _, text := range []string{
		"",
		"set u:t-e-80 10.0.0.1:80\n",                               // no header
		h + "set u:t-e-80 10.0.0.1\n",                              // no port
		h + "set u:t-e-80 10.0.0.1:99999\n",                        // port out of range
		h + "set u:t-e-80 ::1:80\n",                                // IPv6 without brackets
		h + "set u:t-e-80 10.0.0.1:80;evil\n",                      // trailing junk
		h + "set u:T-E-80 10.0.0.1:80\n",                           // not an upstream name
		h + "set u:t-e-80\tunix:/tmp/x.sock\n",                     // not an address
		h + "set u:t-e-80 example.com:80\n",                        // a name to resolve
		h + "set u:t-e-80 [::1]:80 [fe80::1%eth0]:80\n",            // zone
		h + "set u:t-e-80 10.0.0.1:80",                             // no newline at the end
		h + "set x:e.test - - -\n",                                 // no such kind of key
		h + "put u:t-e-80 10.0.0.1:80\n",                           // no such operation
		h + "set h:e.test - - - /x t-e-80\n",                       // a prefix not ending in '/'
		h + "set h:e.test - - - / bad$name\n",                      // not an upstream name
		h + "set h:e.test - - - / t-e-80 /a/\n",                    // a match without a target
		h + "set h:e.test - 443x - / t-e-80\n",                     // not a port
		h + "set c:test_x-00.pem not a certificate\n",              // not PEM
		deltaHeader + before + " zz 1\nset u:t-e-80 10.0.0.1:80\n", // not a digest
	} {
		if err := pushDelta(context.Background(), n.r.ctl, []byte(text), "00"); err == nil || !strings.Contains(err.Error(), "status 400") {
			t.Errorf("push %q: %v, want status 400", text, err)
		}
	}
	// A change from another table than nginx's is not applied either.
	stale := deltaHeader + "0123456789abcdef 00 1\nset u:t-e-80 10.0.0.1:80\n"
	if err := pushDelta(context.Background(), n.r.ctl, []byte(stale), "00"); !errors.Is(err, errStaleBase) {
		t.Errorf("push from another table: %v, want %v", err, errStaleBase)
	}
	if after, err := tableDigest(context.Background(), n.r.ctl); err != nil || after != before {
		t.Errorf("version after refused tables %q (%v), want still %q", after, err, before)
	}
	if seen := backendsSeen(t, n.client(false), "http://e.test/", 2, 200); seen["A"] != 2 {
		t.Errorf("e.test reached %v, want A", seen)
	}
	// Only the agent may connect: the socket's directory is private.
	st, err := os.Stat(resolve(n.r.cfg.Dir, "control"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o700 {
		t.Errorf("control socket directory mode %v, want 0700", st.Mode().Perm())
	}
}

// BenchmarkEndpointUpdate measures an endpoint-only change on a real nginx with 100
// and 5,000 hosts (one upstream each): from the start of Apply (render, write the
// table, push it) until a request reaches the new endpoint. It reports the push
// alone (write and hand over, ApplyResult.Serve) and the whole, next to the reload
// figures of BenchmarkReload.
func BenchmarkEndpointUpdate(b *testing.B) {
	_, epA := backend(b, "A")
	_, epB := backend(b, "B")
	for _, hosts := range []int{100, 5000} {
		b.Run(fmt.Sprintf("hosts=%d", hosts), func(b *testing.B) {
			snap := ingressSnapshotTLS(b, hosts, 0)
			n := startNginx(b, snap)
			c := n.client(true)
			reloads := testutil.ToFloat64(n.r.m.reloads.WithLabelValues(ResultSuccess))
			ctx := context.Background()
			var push, render, serving float64
			i := 0
			for b.Loop() {
				i++
				want, ep := "A ", epA
				if i%2 == 1 {
					want, ep = "B ", epB
				}
				snap.Upstreams[0].Endpoints = []netip.AddrPort{ep}
				t0 := time.Now()
				res, err := n.r.ApplyNow(ctx, snap)
				if err != nil || res.Result != ResultTable {
					b.Fatalf("apply: %s, %v", res.Result, err)
				}
				for {
					resp, err := c.Get("http://" + snap.Servers[0].Host + "/")
					if err != nil {
						b.Fatal(err)
					}
					var buf [64]byte
					k, _ := resp.Body.Read(buf[:])
					resp.Body.Close()
					if strings.HasPrefix(string(buf[:k]), want) {
						break
					}
				}
				serving += time.Since(t0).Seconds()
				push += res.Serve.Seconds()
				render += res.Render.Seconds()
			}
			if got := testutil.ToFloat64(n.r.m.reloads.WithLabelValues(ResultSuccess)); got != reloads {
				b.Fatalf("%v reloads during endpoint updates", got-reloads)
			}
			b.ReportMetric(render*1000/float64(b.N), "render-ms")
			b.ReportMetric(push*1000/float64(b.N), "push-ms")
			b.ReportMetric(serving*1000/float64(b.N), "apply-to-serving-ms")
			b.ReportMetric(float64(len(n.r.appliedTable.encode(n.r.appliedDigest, 1))), "table-bytes")
		})
	}
}

// A delta names only what changed, and its digest is the new table's: the same
// table gives the same digest whatever the order it was built in.
func TestTableDeltaAndDigest(t *testing.T) {
	old := table{"h:a.test": "- - - / a-80", "u:a-80": "10.0.0.1:80", "u:b-80": ""}
	cur := table{"h:a.test": "- - - / a-80", "u:a-80": "10.0.0.2:80 [fd00::2]:8080", "h:b.test": "- - - / b-80"}
	text, n := cur.delta(old, old.digest(), cur.digest(), 7)
	want := deltaHeader + old.digest() + " " + cur.digest() + " 7\n" +
		"set h:b.test - - - / b-80\nset u:a-80 10.0.0.2:80 [fd00::2]:8080\ndel u:b-80\n"
	if diff := cmp.Diff(want, string(text)); diff != "" || n != 3 {
		t.Errorf("delta of %d keys (-want +got):\n%s", n, diff)
	}
	if len(cur.digest()) != 16 || cur.digest() == old.digest() {
		t.Errorf("digests %q and %q, want 16 hex digits that differ", cur.digest(), old.digest())
	}
	same := table{}
	for _, k := range []string{"u:a-80", "h:b.test", "h:a.test"} {
		same[k] = cur[k]
	}
	if same.digest() != cur.digest() {
		t.Error("the same table has another digest")
	}
	// An upstream without endpoints is a key without a value.
	if got := string(old.encode("d", 7)); got != deltaHeader+" d 7\nset h:a.test - - - / a-80\nset u:a-80 10.0.0.1:80\nset u:b-80\n" {
		t.Errorf("encode: %q", got)
	}
}

// Without the Lua module, nginx -t fails and says which package provides it.
func TestMissingLuaModuleIsNamed(t *testing.T) {
	bin := nginxBinary(t)
	dir := prefixDir(t)
	opt := goldenOptions()
	opt.ModulesDir = t.TempDir() // no modules there
	cfg, err := Render(hostSnapshot("a.example.com"), opt)
	if err != nil {
		t.Fatal(err)
	}
	if err := prepareDirs(dir, opt); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, cfg.Text, 0o600); err != nil {
		t.Fatal(err)
	}
	err = Exec{Binary: bin}.Test(context.Background(), dir, conf)
	if err == nil || !strings.Contains(err.Error(), "ngx_http_lua_module.so") && !strings.Contains(err.Error(), "ndk_http_module.so") ||
		!strings.Contains(err.Error(), "libnginx-mod-http-lua") {
		t.Errorf("nginx -t without the module: %v; want it to name the module and its package", err)
	}
}

// The control socket answers the table's digest and stamp; a reload by someone
// else with an older table file keeps the newer table nginx has.
func TestTableStampKeepsNewerTable(t *testing.T) {
	_, epA := backend(t, "A")
	_, epB := backend(t, "B")
	n := startNginx(t, epSnapshot(epA, []netip.AddrPort{epA}))
	res, err := n.r.ApplyNow(context.Background(), epSnapshot(epA, []netip.AddrPort{epB}))
	if err != nil || res.Result != ResultTable {
		t.Fatalf("change: %s, %v", res.Result, err)
	}
	digest, stamp, err := tableState(context.Background(), n.r.ctl)
	if err != nil || digest != res.Digest || stamp != n.r.lastStamp {
		t.Fatalf("nginx has table %q stamp %d (%v), want %q stamp %d", digest, stamp, err, res.Digest, n.r.lastStamp)
	}
	// The file still has the table before the change (Run writes it a moment
	// later): a reload nobody asked the agent for keeps the newer one.
	n.r.mu.Lock()
	m := n.r.master
	n.r.mu.Unlock()
	workers := workerPIDs(t, n)
	if err := m.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(t.Context(), 10*time.Second, 5*time.Millisecond, func() bool { got := workerPIDs(t, n); return len(got) == 2 && !slices.Contains(got, workers[0]) }); err != nil {
		t.Fatalf("waiting for new workers: %v", err)
	}
	if got, _ := tableDigest(context.Background(), n.r.ctl); got != res.Digest {
		t.Errorf("after a reload with an older file nginx has table %q, want %q", got, res.Digest)
	}
	if seen := backendsSeen(t, n.client(false), "http://e.test/", 4, 200); seen["B"] != 4 {
		t.Errorf("e.test reached %v, want B", seen)
	}
}

// A value past 64 KiB (a host with 4,000 paths) goes to nginx like any other.
func TestTableTakesLargeValues(t *testing.T) {
	_, epA := backend(t, "A")
	_, epB := backend(t, "B")
	n := startNginx(t, epSnapshot(epB, []netip.AddrPort{epA}))
	s := epSnapshot(epB, []netip.AddrPort{epA})
	for i := range 4000 {
		s.Servers[0].Locations = append(s.Servers[0].Locations, model.Location{Path: fmt.Sprintf("/path-%04d", i), Type: model.PathPrefix, Upstream: "t-f-80"})
	}
	res, err := n.r.ApplyNow(context.Background(), s)
	if err != nil || res.Result != ResultTable {
		t.Fatalf("apply: %s, %v", res.Result, err)
	}
	if v := n.r.appliedTable["h:e.test"]; len(v) <= 65536 {
		t.Fatalf("e.test's routes are %d bytes, want more than 64 KiB", len(v))
	}
	c := n.client(false)
	if seen := backendsSeen(t, c, "http://e.test/path-3999/x", 2, 200); seen["B"] != 2 {
		t.Errorf("e.test/path-3999/x reached %v, want B", seen)
	}
	if seen := backendsSeen(t, c, "http://e.test/other", 2, 200); seen["A"] != 2 {
		t.Errorf("e.test/other reached %v, want A", seen)
	}
}

// TestDigestCached: the digest from the cache of hashes is the table's digest
// across entries added, changed and removed, and the cache keeps only the
// table's keys.
func TestDigestCached(t *testing.T) {
	var cc certCache
	tb := table{"h:a": "- - - / u1", "h:b": "- - - / u2", "u:u1": "10.0.0.1:80"}
	steps := []func(){
		func() {},
		func() { tb["h:c"] = "- - - / u3" },
		func() { tb["h:a"] = "- - - / u9" },
		func() { delete(tb, "h:b") },
		func() { tb = table{"h:z": "- - 404"} },
	}
	for i, step := range steps {
		step()
		if got, want := tb.digestCached(&cc), tb.digest(); got != want {
			t.Errorf("step %d: cached digest %s, want %s", i, got, want)
		}
		if len(cc.hashes) != len(tb) {
			t.Errorf("step %d: the cache keeps %d hashes for %d entries", i, len(cc.hashes), len(tb))
		}
	}
}
