package nginx

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// telemetryBuckets are the latency histograms' bounds, in seconds: lua/portico.lua's
// bucket_ms, in milliseconds, which count checks against them.
var telemetryBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// statusClasses are the status_class label's values, in the order of an Ingress
// line's counts: "other" is a status outside 100..599 (none sent).
var statusClasses = [6]string{"1xx", "2xx", "3xx", "4xx", "5xx", "other"}

// The fields of the telemetry's records (a line names them by number, from 1, with
// their counts: the ones that are not 0).
const (
	ingressFields  = 9 + 12 // six status classes, bytes in and out, milliseconds, 12 buckets
	upstreamFields = 4 + 12 // tries, retries, tries without a connection, milliseconds, 12 buckets
)

// ingressCounts is what every worker counted for one Ingress, added up.
type ingressCounts struct {
	status         [6]float64
	bytesIn, bytes float64
	seconds        float64
	buckets        [12]uint64 // not cumulative; the last is above the last bound
	requests       uint64
	touched        bool // seen since the last prune
}

// upstreamCounts is what every worker counted for one upstream, added up.
type upstreamCounts struct {
	tries, retries, connectErrors float64
	seconds                       float64
	buckets                       [12]uint64
	responses                     uint64
	touched                       bool
}

// telemetry adds up the counts nginx's workers push (lua/portico.lua's count),
// which the agent takes from the control socket's /telemetry, and exports them as
// the portico_http_* series. Labels are bounded by the cluster: an Ingress
// ("namespace/name", "" for requests no Ingress's route answered) and an upstream
// (a Service port); never a path, a client-sent host or an address.
type telemetry struct {
	mu        sync.Mutex
	ingresses map[string]*ingressCounts
	upstreams map[string]*upstreamCounts
	dropped   float64 // entries nginx dropped, over every master
	nginxDrop float64 // nginx's own count, which a new master starts again

	requests, duration, bytesIn, bytesOut       *prometheus.Desc
	tries, retries, connectErrors, upstreamTime *prometheus.Desc
	droppedDesc                                 *prometheus.Desc
}

func newTelemetry() *telemetry {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("portico_http_"+name, help, labels, nil)
	}
	return &telemetry{
		ingresses: map[string]*ingressCounts{},
		upstreams: map[string]*upstreamCounts{},
		requests: d("requests_total", "Requests this edge's nginx answered, by the Ingress whose route answered them "+
			"(namespace/name; empty for none: the catch-all's 404, say) and status class (1xx..5xx; other). "+
			"Connections closed without an answer (444: an unknown host; 499: the client left first) are not counted.",
			"ingress", "status_class"),
		duration: d("request_duration_seconds", "Time from a request's first byte until its response's header went out, by Ingress.", "ingress"),
		bytesIn:  d("request_bytes_total", "Bytes of requests (line, headers and body), by Ingress.", "ingress"),
		bytesOut: d("response_bytes_total", "Bytes of response bodies by their Content-Length (a response without one, chunked, counts none), by Ingress.", "ingress"),
		tries: d("upstream_tries_total", "Connections to an upstream's endpoints nginx tried, retries included, "+
			"by upstream (namespace-service-port).", "upstream"),
		retries: d("upstream_retries_total", "Tries of an upstream after one failed (proxy_next_upstream: error, timeout), by upstream.", "upstream"),
		connectErrors: d("upstream_connect_errors_total", "Tries of an upstream that got no connection (refused, unreachable, "+
			"timed out), by upstream.", "upstream"),
		upstreamTime: d("upstream_response_duration_seconds", "Time from the first try's start until the upstream's response header came (every try together), by upstream.", "upstream"),
		droppedDesc: d("telemetry_dropped_total", "Counts of one worker's second that nginx dropped because the agent "+
			"did not take them in time (the portico_http_* series miss them)."),
	}
}

// Describe implements prometheus.Collector.
func (t *telemetry) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{t.requests, t.duration, t.bytesIn, t.bytesOut, t.tries, t.retries, t.connectErrors, t.upstreamTime, t.droppedDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (t *telemetry) Collect(ch chan<- prometheus.Metric) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for name, c := range t.ingresses {
		for i, class := range statusClasses {
			if c.status[i] > 0 || i == 1 {
				ch <- prometheus.MustNewConstMetric(t.requests, prometheus.CounterValue, c.status[i], name, class)
			}
		}
		ch <- prometheus.MustNewConstHistogram(t.duration, c.requests, c.seconds, cumulative(c.buckets), name)
		ch <- prometheus.MustNewConstMetric(t.bytesIn, prometheus.CounterValue, c.bytesIn, name)
		ch <- prometheus.MustNewConstMetric(t.bytesOut, prometheus.CounterValue, c.bytes, name)
	}
	for name, c := range t.upstreams {
		ch <- prometheus.MustNewConstMetric(t.tries, prometheus.CounterValue, c.tries, name)
		ch <- prometheus.MustNewConstMetric(t.retries, prometheus.CounterValue, c.retries, name)
		ch <- prometheus.MustNewConstMetric(t.connectErrors, prometheus.CounterValue, c.connectErrors, name)
		ch <- prometheus.MustNewConstHistogram(t.upstreamTime, c.responses, c.seconds, cumulative(c.buckets), name)
	}
	ch <- prometheus.MustNewConstMetric(t.droppedDesc, prometheus.CounterValue, t.dropped)
}

// totals are the requests counted so far, over every Ingress, and their bytes
// in and out.
func (t *telemetry) totals() (requests, bytes float64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range t.ingresses {
		for _, n := range c.status {
			requests += n
		}
		bytes += c.bytesIn + c.bytes
	}
	return requests, bytes
}

// cumulative turns per-bucket counts into Prometheus's cumulative ones by bound.
func cumulative(b [12]uint64) map[float64]uint64 {
	m := make(map[float64]uint64, len(telemetryBuckets))
	var n uint64
	for i, le := range telemetryBuckets {
		n += b[i]
		m[le] = n
	}
	return m
}

// add reads the answer of /telemetry: lines of counts (see lua/portico.lua), then
// "dropped <n>". A line that does not parse is skipped and reported; the others
// count.
func (t *telemetry) add(r io.Reader) error {
	var errs []error
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	t.mu.Lock()
	defer t.mu.Unlock()
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		if err := t.addLine(line); err != nil && len(errs) < 3 {
			errs = append(errs, err)
		}
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// addLine adds one line: "dropped <n>", or a record's kind ("r" for an Ingress,
// "u" for an upstream) and name, then pairs of a field's number and its count
// (lua/portico.lua's lines).
func (t *telemetry) addLine(line string) error {
	f := strings.Fields(line)
	if len(f) == 2 && f[0] == "dropped" {
		n, err := strconv.ParseFloat(f[1], 64)
		if err != nil || !(n >= 0) || math.IsInf(n, 0) {
			return fmt.Errorf("telemetry: bad line %.80q", line)
		}
		if n < t.nginxDrop { // a new master counts from 0
			t.nginxDrop = 0
		}
		t.dropped += n - t.nginxDrop
		t.nginxDrop = n
		return nil
	}
	if len(f) < 2 || (f[0] != "r" && f[0] != "u") {
		return fmt.Errorf("telemetry: bad line %.80q", line)
	}
	want := ingressFields
	if f[0] == "u" {
		want = upstreamFields
	}
	if len(f)%2 != 0 {
		return fmt.Errorf("telemetry: %s line of %.80s: a field without its count", f[0], f[1])
	}
	var v [ingressFields]float64
	for i := 2; i < len(f); i += 2 {
		k, err := strconv.Atoi(f[i])
		if err != nil || k < 1 || k > want {
			return fmt.Errorf("telemetry: %s line of %.80s: bad field %.20q", f[0], f[1], f[i])
		}
		x, err := strconv.ParseFloat(f[i+1], 64)
		if err != nil || !(x >= 0) || math.IsInf(x, 0) { // NaN too
			return fmt.Errorf("telemetry: %s line of %.80s: bad count %.20q", f[0], f[1], f[i+1])
		}
		v[k-1] += x
	}
	name := f[1]
	if f[0] == "r" {
		if name == "-" {
			name = ""
		} else if !tableSource(name) {
			return fmt.Errorf("telemetry: bad Ingress %.80q", name)
		}
		c := t.ingresses[name]
		if c == nil {
			c = &ingressCounts{}
			t.ingresses[name] = c
		}
		for i := range c.status {
			c.status[i] += v[i]
		}
		c.bytesIn += v[6]
		c.bytes += v[7]
		c.seconds += v[8] / 1000
		for i := range c.buckets {
			c.buckets[i] += uint64(v[9+i])
			c.requests += uint64(v[9+i])
		}
		c.touched = true
		return nil
	}
	if !tableName(name) {
		return fmt.Errorf("telemetry: bad upstream %.80q", name)
	}
	c := t.upstreams[name]
	if c == nil {
		c = &upstreamCounts{}
		t.upstreams[name] = c
	}
	c.tries += v[0]
	c.retries += v[1]
	c.connectErrors += v[2]
	c.seconds += v[3] / 1000
	for i := range c.buckets {
		c.buckets[i] += uint64(v[4+i])
		c.responses += uint64(v[4+i])
	}
	c.touched = true
	return nil
}

// prune forgets the Ingresses and upstreams that the table no longer names and
// that counted nothing since the last prune, so that deleted objects' series go.
func (t *telemetry) prune(ingresses, upstreams map[string]bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for name, c := range t.ingresses {
		if name != "" && !ingresses[name] && !c.touched {
			delete(t.ingresses, name)
		}
		c.touched = false
	}
	for name, c := range t.upstreams {
		if !upstreams[name] && !c.touched {
			delete(t.upstreams, name)
		}
		c.touched = false
	}
}

// telemetrySample is one Ingress's and one upstream's line, with no counts.
func telemetrySample() string {
	return "r -\nu sample\n"
}

// telemetryURL is where the control socket answers the workers' counts.
const telemetryURL = "http://portico-control/telemetry"

// takeTelemetry takes the counts nginx's workers pushed since the last call.
func (r *Reloader) takeTelemetry(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, telemetryURL, nil)
	if err != nil {
		return err
	}
	resp, err := r.ctl.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return fmt.Errorf("telemetry: status %d", resp.StatusCode)
	}
	return r.tel.add(resp.Body)
}

// telemetryPeriod is how often the agent takes the workers' counts: each worker
// pushes once a second, and nginx keeps 1,024 entries.
const telemetryPeriod = time.Second

// pruneEvery is how many takes go by between two prunes of deleted objects' series.
const pruneEvery = 300

// runTelemetry takes the workers' counts every telemetryPeriod until ctx ends.
func (r *Reloader) runTelemetry(ctx context.Context) {
	tick := time.NewTicker(telemetryPeriod)
	defer tick.Stop()
	failing := false
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		err := r.takeTelemetry(ctx)
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			r.log.Warn("take nginx's telemetry", zap.Error(err))
			failing = true
		case err == nil && failing:
			r.log.Info("nginx's telemetry comes again")
			failing = false
		}
		if n%pruneEvery == 0 {
			r.applyMu.Lock()
			ing, ups := r.appliedTable.names()
			r.applyMu.Unlock()
			r.tel.prune(ing, ups)
		}
	}
}

// names returns the Ingresses the table's routes name and its upstreams.
func (t table) names() (ingresses, upstreams map[string]bool) {
	ingresses, upstreams = map[string]bool{}, map[string]bool{}
	for k, v := range t {
		switch {
		case strings.HasPrefix(k, "u:"):
			upstreams[k[2:]] = true
		case strings.HasPrefix(k, "h:"):
			for _, w := range strings.Fields(v) {
				if _, src, ok := strings.Cut(w, "#"); ok {
					ingresses[src] = true
				}
			}
		}
	}
	return ingresses, upstreams
}
