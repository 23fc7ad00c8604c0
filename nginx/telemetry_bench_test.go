package nginx

import (
	"net/netip"
	"path/filepath"
	"testing"
)

// BenchmarkTelemetry measures what the L7 telemetry costs nginx per request:
// the same snapshot as BenchmarkMatching (5,000 hosts, each its own Ingress, so
// 5,000 series of counts; endpoints shared), served by two nginx of one worker
// each, pinned to the same CPU: one with telemetry (the counts by Ingress and
// upstream, and the JSON access log at the share the sub-benchmark names, to a
// file), one without either: counts alone, the log alone (1% and every
// request), both. wrk cycles every request through a host and a path over
// plain HTTP and HTTPS (compareProtos). cost-% is the requests/s the telemetry loses,
// cpu-cost-% the worker CPU per request it adds (comparePaired).
func BenchmarkTelemetry(b *testing.B) {
	wrk, proxyCPU, restCPU, backendPorts, statusPort := startWrkBench(b)
	snap := matchSnapshot(b, func(int) []netip.AddrPort {
		var l []netip.AddrPort
		for _, p := range backendPorts {
			l = append(l, netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), p))
		}
		return l
	})
	logs := b.TempDir()
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
					o.AccessLog, o.AccessLogSample = filepath.Join(logs, v.name+".log"), v.sample
				}
			})
			onTarget := &wrkTarget{name: "on", http: on.opt.HTTPPort, https: on.opt.HTTPSPort, worker: soleWorker(b, on.master(b))}
			pin(b, onTarget.worker, proxyCPU)
			compareProtos(b, wrk, []*wrkTarget{onTarget, offTarget}, snap, statusPort, restCPU)
			if on.r.tel == nil {
				return
			}
			if got := series(b, on.r.tel); got["portico_http_telemetry_dropped_total{}"] != 0 {
				b.Errorf("the telemetry dropped %v seconds of counts", got["portico_http_telemetry_dropped_total{}"])
			}
		})
	}
}
