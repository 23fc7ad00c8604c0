// Command metricsdoc writes the table of every Prometheus series Portico's
// processes define (docs/metrics.md; make metrics-doc, checked by make verify).
// It registers each package's metrics on a Registerer that only records their
// descriptions, so a series is listed whether or not it has a value yet, and the
// table cannot miss a label or say another help text than /metrics does.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/portico-edge/portico/agent"
	"github.com/portico-edge/portico/bgp"
	"github.com/portico-edge/portico/controlplane"
	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/dataplane/steer"
	"github.com/portico-edge/portico/federation"
	"github.com/portico-edge/portico/federation/gslb"
	"github.com/portico-edge/portico/internal/version"
	"github.com/portico-edge/portico/liveness"
	"github.com/portico-edge/portico/nginx"
	"github.com/portico-edge/portico/vrrp"
)

// source is one process's part: what serves the series, and how to register them.
type source struct {
	where    string
	register func(prometheus.Registerer) error
}

var sources = []source{
	{"agent, controller", func(r prometheus.Registerer) error { return r.Register(version.Collector()) }},
	{"agent, controller", controlplane.DescribeMetrics},
	{"agent", dataplane.DescribeMetrics},
	{"agent", func(r prometheus.Registerer) error { return r.Register(steer.NewCollector(nil)) }},
	{"agent", nginx.DescribeMetrics},
	{"agent", liveness.DescribeMetrics},
	{"agent, portico vrrp", func(r prometheus.Registerer) error { _, err := vrrp.NewMetrics(r); return err }},
	{"agent (--announce=bgp)", func(r prometheus.Registerer) error { _, err := bgp.NewMetrics(r); return err }},
	{"agent", agent.DescribeMetrics},
	{"agent (--federation-peers)", agent.DescribeSiteMetrics},
	{"portico federation", federation.DescribeMetrics},
	{"portico federation dns", gslb.DescribeMetrics},
}

// series is one metric as the table shows it.
type series struct {
	name, typ, help, where string
	labels                 []string
}

// recorder is a Registerer that keeps what each collector describes.
type recorder struct {
	where string
	out   map[string]*series
}

func (r *recorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 64)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		s, err := parseDesc(d.String())
		if err != nil {
			return err
		}
		s.typ = typeOf(c, s.name)
		if old, ok := r.out[s.name]; ok {
			if old.help != s.help || old.typ != s.typ || !slices.Equal(old.labels, s.labels) {
				return fmt.Errorf("%s is defined twice, differently", s.name)
			}
			continue
		}
		s.where = r.where
		r.out[s.name] = &s
	}
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *recorder) Unregister(prometheus.Collector) bool { return false }

// parseDesc reads Desc.String(): Desc{fqName: "..", help: "..", unit: "..",
// constLabels: {..}, variableLabels: {a,b}}.
func parseDesc(s string) (series, error) {
	var out series
	rest, ok := strings.CutPrefix(s, "Desc{fqName: ")
	if !ok {
		return out, fmt.Errorf("unexpected description %q", s)
	}
	next := func(prefix string) (string, error) {
		r, ok := strings.CutPrefix(rest, prefix)
		if !ok {
			return "", fmt.Errorf("unexpected description %q", s)
		}
		q, err := strconv.QuotedPrefix(r)
		if err != nil {
			return "", fmt.Errorf("description %q: %w", s, err)
		}
		rest = r[len(q):]
		return strconv.Unquote(q)
	}
	var err error
	if out.name, err = next(""); err != nil {
		return out, err
	}
	if out.help, err = next(", help: "); err != nil {
		return out, err
	}
	if _, err = next(", unit: "); err != nil {
		return out, err
	}
	_, vl, ok := strings.Cut(rest, "variableLabels: {")
	if !ok {
		return out, fmt.Errorf("unexpected description %q", s)
	}
	if vl = strings.TrimSuffix(vl, "}}"); vl != "" {
		out.labels = strings.Split(vl, ",")
	}
	return out, nil
}

// typeOf is the series' type: the collector's own for the library's metrics;
// for a custom collector, the one its Collect reports, or, when it reports
// nothing without data behind it, counter for a name ending in _total and
// gauge otherwise (Prometheus' naming convention).
func typeOf(c prometheus.Collector, name string) string {
	switch c.(type) { // Gauge before Counter: a Gauge has a Counter's methods too
	case *prometheus.GaugeVec, prometheus.Gauge:
		return "gauge"
	case *prometheus.CounterVec, prometheus.Counter:
		return "counter"
	case *prometheus.HistogramVec, prometheus.Histogram:
		return "histogram"
	case *prometheus.SummaryVec, prometheus.Summary:
		return "summary"
	}
	if t := collected(c, name); t != "" {
		return t
	}
	if strings.HasSuffix(name, "_total") {
		return "counter"
	}
	return "gauge"
}

// collected is the type of name's first metric that c collects, "" if none (or
// if collecting fails without the data behind it).
func collected(c prometheus.Collector, name string) (typ string) {
	defer func() {
		if recover() != nil {
			typ = ""
		}
	}()
	ch := make(chan prometheus.Metric, 64)
	go func() {
		defer close(ch)
		defer func() { _ = recover() }()
		c.Collect(ch)
	}()
	for m := range ch {
		if typ != "" || !strings.Contains(m.Desc().String(), strconv.Quote(name)) {
			continue
		}
		var pb dto.Metric
		if m.Write(&pb) != nil {
			continue
		}
		switch {
		case pb.Counter != nil:
			typ = "counter"
		case pb.Gauge != nil:
			typ = "gauge"
		case pb.Histogram != nil:
			typ = "histogram"
		case pb.Summary != nil:
			typ = "summary"
		}
	}
	return typ
}

func main() {
	out := flag.String("o", "", "file to write (default: standard output)")
	flag.Parse()
	all := map[string]*series{}
	for _, s := range sources {
		if err := s.register(&recorder{where: s.where, out: all}); err != nil {
			fmt.Fprintln(os.Stderr, "metricsdoc:", err)
			os.Exit(1)
		}
	}
	text := render(all)
	if *out == "" {
		os.Stdout.Write(text)
		return
	}
	if err := os.WriteFile(*out, text, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "metricsdoc:", err)
		os.Exit(1)
	}
}

func render(all map[string]*series) []byte {
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	slices.Sort(names)
	var b bytes.Buffer
	b.WriteString(`# Metrics

<!-- generated by make metrics-doc (hack/metricsdoc) from the code that registers them; make verify fails when it is stale. Edit the help texts in the code. -->

Every series Portico's processes export on their metrics address (the agent's
and the controller's --metrics-addr), besides client_golang's standard go_* and
process_* series. Labels are bounded: none carries a client's address, a host
name from a request or a path.

| metric | type | labels | served by | what it counts |
|---|---|---|---|---|
`)
	for _, n := range names {
		s := all[n]
		labels := "—"
		if len(s.labels) > 0 {
			labels = "`" + strings.Join(s.labels, "`, `") + "`"
		}
		help := strings.ReplaceAll(strings.ReplaceAll(s.help, "|", "\\|"), "\n", " ")
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", n, s.typ, labels, s.where, help)
	}
	return b.Bytes()
}
