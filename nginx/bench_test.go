package nginx

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/testenv"
)

// ingressSnapshot is what n Ingresses look like to the renderer: one host each with
// a Prefix "/" and an Exact "/healthz" path, a Service of three endpoints each, and
// one in ten with its own TLS certificate and an HTTPS redirect.
func ingressSnapshot(tb testing.TB, n int) model.Snapshot { return ingressSnapshotTLS(tb, n, 10) }

// ingressSnapshotTLS is ingressSnapshot with one Ingress in tlsEvery (0: none) using TLS.
func ingressSnapshotTLS(tb testing.TB, n, tlsEvery int) model.Snapshot {
	var s model.Snapshot
	for i := range n {
		up := fmt.Sprintf("ns%d-svc%d-80", i%50, i)
		srv := model.Server{Host: fmt.Sprintf("app-%d.ns%d.example.com", i, i%50), Locations: []model.Location{
			{Path: "/", Type: model.PathPrefix, Upstream: up, Source: fmt.Sprintf("ns%d/ing%d", i%50, i)},
			{Path: "/healthz", Type: model.PathExact, Upstream: up, Source: fmt.Sprintf("ns%d/ing%d", i%50, i)},
		}}
		if tlsEvery > 0 && i%tlsEvery == 0 {
			c := selfSigned(tb, srv.Host)
			c.Name = fmt.Sprintf("ns%d/tls-%d", i%50, i)
			s.Certificates = append(s.Certificates, c)
			srv.TLSCertificate, srv.SSLRedirect = c.Name, true
		}
		s.Servers = append(s.Servers, srv)
		s.Upstreams = append(s.Upstreams, model.Upstream{Name: up, Endpoints: []netip.AddrPort{
			netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 8080),
			netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 2, byte(i >> 8), byte(i)}), 8080),
			netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 3, byte(i >> 8), byte(i)}), 8080),
		}})
	}
	slices.SortFunc(s.Certificates, func(a, b model.Certificate) int { return strings.Compare(a.Name, b.Name) })
	return s
}

// BenchmarkRender5000Ingresses measures the pure render of 5,000 Ingresses (500 of
// them with a certificate to check) and reports the configuration's size.
func BenchmarkRender5000Ingresses(b *testing.B) {
	snap := ingressSnapshot(b, 5000)
	opt := DefaultOptions("/run/portico/nginx")
	var size int
	b.ReportAllocs()
	for b.Loop() {
		cfg, err := Render(snap, opt)
		if err != nil {
			b.Fatal(err)
		}
		if len(cfg.Problems) != 0 {
			b.Fatalf("problems: %v", cfg.Problems[0])
		}
		size = len(cfg.Text)
	}
	b.ReportMetric(float64(size), "config-bytes")
	b.ReportMetric(float64(size)/5000, "bytes/ingress")
}

// BenchmarkRender5000IngressesCached is BenchmarkRender5000Ingresses as the Reloader
// renders: with the certificate checks of the previous render (only changed
// certificates are parsed again), as for an endpoint-only change.
func BenchmarkRender5000IngressesCached(b *testing.B) {
	snap := ingressSnapshot(b, 5000)
	opt := DefaultOptions("/run/portico/nginx")
	var cache certCache
	if _, err := render(snap, opt, nil, &cache); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		cfg, err := render(snap, opt, nil, &cache)
		if err != nil {
			b.Fatal(err)
		}
		if len(cfg.Problems) != 0 {
			b.Fatalf("problems: %v", cfg.Problems[0])
		}
	}
}

// BenchmarkReload measures a reload of a real nginx with 100 and 5,000 hosts, one
// in ten with its own certificate (and 5,000 without TLS): each iteration moves an
// L4 Service to another port, which only a reload applies (nginx listens anew);
// changes of hosts, paths and endpoints need none (BenchmarkChangeToServed,
// BenchmarkEndpointUpdate). The hosts are not in nginx.conf but in the table,
// which every reload loads from its file in the master. It reports the whole Apply
// (render, write, nginx -t, swap, signal, confirm) as ns/op and, separately, the
// time from the reload signal until workers with the new configuration answer and
// until the old workers stopped accepting (nginx's master waits 100ms between the
// two).
func BenchmarkReload(b *testing.B) {
	for _, tc := range []struct{ hosts, tlsEvery int }{{100, 10}, {5000, 10}, {5000, 0}} {
		hosts := tc.hosts
		name := fmt.Sprintf("hosts=%d/tls=%d", hosts, 0)
		if tc.tlsEvery > 0 {
			name = fmt.Sprintf("hosts=%d/tls=%d", hosts, hosts/tc.tlsEvery)
		}
		b.Run(name, func(b *testing.B) {
			snap := ingressSnapshotTLS(b, hosts, tc.tlsEvery)
			ports := testenv.Ports(b, 2)
			n := startNginx(b, withL4(snap, "t/l4", ports[0]))
			ctx := context.Background()
			var serve, sw, render float64
			i := 0
			for b.Loop() {
				i++
				res, err := n.r.ApplyNow(ctx, withL4(snap, "t/l4", ports[i%2]))
				if err != nil || res.Result != ResultSuccess {
					b.Fatalf("apply: %s, %v", res.Result, err)
				}
				serve += res.Serve.Seconds()
				sw += res.Switch.Seconds()
				render += res.Render.Seconds()
			}
			b.ReportMetric(serve*1000/float64(b.N), "signal-to-serving-ms")
			b.ReportMetric(sw*1000/float64(b.N), "signal-to-old-stopped-ms")
			b.ReportMetric(render*1000/float64(b.N), "render-ms")
			b.ReportMetric(float64(len(n.r.applied)), "config-bytes")
			b.ReportMetric(float64(len(n.r.appliedTable.encode(n.r.appliedDigest, 1))), "table-bytes")
			// The first worker still alive: one the reload replaced may have
			// exited meanwhile, a zombie without memory until its master
			// reaps it.
			if ws, err := n.r.master.Workers(); err == nil {
				for _, w := range ws {
					if rss, ok := rssMiB(b, w.PID); ok {
						b.ReportMetric(rss, "worker-rss-MiB")
						break
					}
				}
			}
		})
	}
}

// rssMiB is a process's resident set size; false for a process without one
// (gone, or a zombie).
func rssMiB(tb testing.TB, pid int) (float64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, false
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			if err != nil {
				tb.Fatal(err)
			}
			return float64(kb) / 1024, true
		}
	}
	return 0, false
}
