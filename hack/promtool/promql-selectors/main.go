// Command promql-selectors parses PromQL expressions with Prometheus's own
// parser and prints what each one reads: the metric names of its selectors
// with the labels they match on, and the labels of its groupings (by, without,
// on, ignoring, group_left, group_right) with the metrics beneath them. go test
// ./deploy checks with it that the chart's alert rules and dashboard name only
// metrics and labels Portico exports (docs/metrics.md). hack/promtool.sh builds
// it beside promtool, from the same pinned Prometheus.
//
// Input: a JSON array of expressions on standard input. Output: a JSON array,
// one object per expression, with "error" set where one does not parse.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// Selector is one vector or matrix selector.
type Selector struct {
	Metric string   `json:"metric"` // "" when the selector names no metric
	Labels []string `json:"labels"` // labels matched on, besides __name__
}

// Grouping is one aggregation's or vector matching's label list.
type Grouping struct {
	Labels  []string `json:"labels"`
	Metrics []string `json:"metrics"` // the metrics of the expressions it groups
}

// Result is what one expression reads.
type Result struct {
	Expr      string     `json:"expr"`
	Error     string     `json:"error,omitempty"`
	Selectors []Selector `json:"selectors,omitempty"`
	Groupings []Grouping `json:"groupings,omitempty"`
}

func main() {
	var exprs []string
	if err := json.NewDecoder(os.Stdin).Decode(&exprs); err != nil {
		fmt.Fprintln(os.Stderr, "promql-selectors: read expressions:", err)
		os.Exit(2)
	}
	out := make([]Result, 0, len(exprs))
	for _, e := range exprs {
		out = append(out, inspect(e))
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, "promql-selectors:", err)
		os.Exit(1)
	}
}

func inspect(e string) Result {
	r := Result{Expr: e}
	expr, err := parser.NewParser(parser.Options{}).ParseExpr(e)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			s := Selector{Metric: n.Name, Labels: []string{}}
			for _, m := range n.LabelMatchers {
				if m.Name == labels.MetricName {
					if s.Metric == "" && m.Type == labels.MatchEqual {
						s.Metric = m.Value
					}
					continue
				}
				s.Labels = append(s.Labels, m.Name)
			}
			r.Selectors = append(r.Selectors, s)
		case *parser.AggregateExpr:
			if len(n.Grouping) > 0 {
				r.Groupings = append(r.Groupings, Grouping{Labels: n.Grouping, Metrics: metrics(n.Expr)})
			}
		case *parser.BinaryExpr:
			if vm := n.VectorMatching; vm != nil && (len(vm.MatchingLabels) > 0 || len(vm.Include) > 0) {
				ms := append(metrics(n.LHS), metrics(n.RHS)...)
				slices.Sort(ms)
				ls := append(slices.Clone(vm.MatchingLabels), vm.Include...)
				r.Groupings = append(r.Groupings, Grouping{Labels: ls, Metrics: slices.Compact(ms)})
			}
		}
		return nil
	})
	return r
}

// metrics lists the metric names of the selectors in e.
func metrics(e parser.Expr) []string {
	var out []string
	for _, sel := range parser.ExtractSelectors(e) {
		for _, m := range sel {
			if m.Name == labels.MetricName && m.Type == labels.MatchEqual && !slices.Contains(out, m.Value) {
				out = append(out, m.Value)
			}
		}
	}
	slices.Sort(out)
	return out
}
