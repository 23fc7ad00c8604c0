package nginx

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/portico-edge/portico/test/testenv"
)

// BenchmarkTelemetry measures what the L7 telemetry costs nginx per request:
// the same snapshot as BenchmarkMatching (5,000 hosts, each its own Ingress, so
// 5,000 series of counts; endpoints shared), served by two nginx of one worker
// each, pinned to the same CPU: one with telemetry (the counts by Ingress and
// upstream, and the JSON access log at the share the sub-benchmark names, to a
// file), one without either: counts alone, the log alone (1% and every request), both. wrk cycles every request through a host and a path
// over plain HTTP and HTTPS. cost-% is the requests/s the telemetry loses,
// cpu-cost-% the worker CPU per request it adds (comparePaired).
func BenchmarkTelemetry(b *testing.B) {
	wrk := testenv.RequireProgram(b, "wrk")
	bin := nginxBinary(b)
	proxyCPU, restCPU := -1, -1
	if runtime.NumCPU() >= 2 {
		proxyCPU, restCPU = runtime.NumCPU()-1, 0
	}
	ports := testenv.Ports(b, 4)
	backendPorts, statusPort := ports[:3], ports[3]
	startReturnBackend(b, bin, backendPorts, statusPort, restCPU)
	snap := matchSnapshot(b, func(int) []netip.AddrPort {
		var l []netip.AddrPort
		for _, p := range backendPorts {
			l = append(l, netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), p))
		}
		return l
	})
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
	dir := b.TempDir()
	script := filepath.Join(dir, "cycle.lua")
	if err := os.WriteFile(script, []byte(wrkCycleScript()), 0o644); err != nil {
		b.Fatal(err)
	}
	off := startNginx(b, snap, func(o *Options) {
		o.WorkerProcesses, o.WorkerConnections = 1, 16384
		o.Telemetry, o.AccessLog = false, ""
	})
	offTarget := &wrkTarget{name: "off", http: off.opt.HTTPPort, https: off.opt.HTTPSPort, worker: soleWorker(b, off.master(b))}
	pin(b, offTarget.worker, proxyCPU)
	for _, v := range []struct {
		name      string
		telemetry bool
		sample    float64 // of the access log; 0: none
	}{{"counts", true, 0}, {"log-1pct", false, 0.01}, {"log-all", false, 1}, {"counts-and-log-1pct", true, 0.01}} {
		b.Run(v.name, func(b *testing.B) {
			on := startNginx(b, snap, func(o *Options) {
				o.WorkerProcesses, o.WorkerConnections = 1, 16384
				o.Telemetry = v.telemetry
				if v.sample > 0 {
					o.AccessLog, o.AccessLogSample = filepath.Join(dir, v.name+".log"), v.sample
				}
			})
			onTarget := &wrkTarget{name: "on", http: on.opt.HTTPPort, https: on.opt.HTTPSPort, worker: soleWorker(b, on.master(b))}
			pin(b, onTarget.worker, proxyCPU)
			targets := []*wrkTarget{onTarget, offTarget}
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
			if on.r.tel == nil {
				return
			}
			if got := series(b, on.r.tel); got["portico_http_telemetry_dropped_total{}"] != 0 {
				b.Errorf("the telemetry dropped %v seconds of counts", got["portico_http_telemetry_dropped_total{}"])
			}
		})
	}
}

