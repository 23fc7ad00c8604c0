package deploy_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/portico-edge/portico/test/testenv"
)

// The chart's monitoring files: the alert rules and the dashboard, which the
// PrometheusRule and the dashboard ConfigMap carry as they are.
const (
	rulesFile     = chart + "/rules/portico.rules.yaml"
	rulesTestFile = "testdata/portico.rules.test.yaml"
	dashboardFile = chart + "/dashboards/portico.json"
	metricsDoc    = "../docs/metrics.md"
)

// monitoringValues turn every monitoring object on, with every setting away
// from its default.
var monitoringValues = []string{
	"metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.namespace=monitoring",
	"metrics.serviceMonitor.labels.release=kube-prometheus-stack", "metrics.serviceMonitor.interval=15s",
	"metrics.serviceMonitor.scrapeTimeout=10s",
	"metrics.serviceMonitor.relabelings[0].sourceLabels[0]=__meta_kubernetes_pod_node_name",
	"metrics.serviceMonitor.relabelings[0].targetLabel=node",
	"metrics.serviceMonitor.metricRelabelings[0].action=drop", "metrics.serviceMonitor.metricRelabelings[0].regex=go_.*",
	"metrics.serviceMonitor.metricRelabelings[0].sourceLabels[0]=__name__",
	"metrics.podMonitor.enabled=true", "metrics.podMonitor.labels.release=kube-prometheus-stack", "metrics.podMonitor.interval=1m",
	"metrics.podMonitor.relabelings[0].sourceLabels[0]=__meta_kubernetes_pod_node_name",
	"metrics.podMonitor.relabelings[0].targetLabel=node",
	"metrics.prometheusRule.enabled=true", "metrics.prometheusRule.namespace=monitoring",
	"metrics.prometheusRule.labels.release=kube-prometheus-stack",
	"metrics.grafanaDashboard.enabled=true", "metrics.grafanaDashboard.namespace=grafana",
	"metrics.grafanaDashboard.annotations.grafana_folder=Portico",
}

// promtoolBinary returns the promtool hack/promtool.sh builds (make promtool),
// and promql-selectors beside it, or skips the test (fails it in CI) when they
// are not built.
func promtoolBinary(t testing.TB) (promtool, selectors string) {
	t.Helper()
	out, err := exec.Command("../hack/promtool.sh", "path").Output()
	if err != nil {
		t.Fatalf("hack/promtool.sh path: %v", err)
	}
	promtool = strings.TrimSpace(string(out))
	selectors = filepath.Join(filepath.Dir(promtool), "promql-selectors")
	for _, p := range []string{promtool, selectors} {
		if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
			testenv.Unavailable(t, "promtool is not built (make promtool): %s", p)
		}
	}
	return promtool, selectors
}

// renderMonitoring renders the chart with sets and returns its objects.
func renderMonitoring(t *testing.T, helm string, sets []string) []*unstructured.Unstructured {
	t.Helper()
	out := run(t, nil, helm, append([]string{"template", "portico", chart, "--namespace", namespace}, setArgs(sets)...)...)
	objs, err := decodeAll(out)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func byKind(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, u := range objs {
		if u.GetKind() == kind {
			out = append(out, u)
		}
	}
	return out
}

// TestMonitoringObjects: by default the chart makes no monitoring object; with
// metrics.* on, the ServiceMonitor selects headless Services that select the
// agent and controller pods on their metrics port, the PodMonitor selects those
// pods, both carry the values' labels, interval, timeout and relabelings, the
// PrometheusRule carries rules/portico.rules.yaml and the ConfigMap the dashboard
// as they are, each in its namespace.
func TestMonitoringObjects(t *testing.T) {
	helm := helmBinary(t)
	for _, u := range renderMonitoring(t, helm, nil) {
		if u.GetAPIVersion() == "monitoring.coreos.com/v1" || strings.HasSuffix(u.GetName(), "-metrics") || u.GetName() == "portico-dashboard" {
			t.Errorf("default values render %s", identity(u))
		}
	}
	objs := renderMonitoring(t, helm, monitoringValues)

	// The Services select the pods of the DaemonSet and the Deployment, on a
	// port those pods name.
	ds := find[appsv1.DaemonSet](t, objs, "DaemonSet", "portico-agent")
	dep := find[appsv1.Deployment](t, objs, "Deployment", "portico-controller")
	for name, pod := range map[string]corev1.PodTemplateSpec{"portico-agent-metrics": ds.Spec.Template, "portico-controller-metrics": dep.Spec.Template} {
		svc := find[corev1.Service](t, objs, "Service", name)
		if svc.Spec.ClusterIP != corev1.ClusterIPNone || svc.Namespace != namespace {
			t.Errorf("Service %s: clusterIP %q namespace %q, want headless in %s", name, svc.Spec.ClusterIP, svc.Namespace, namespace)
		}
		for k, v := range svc.Spec.Selector {
			if pod.Labels[k] != v {
				t.Errorf("Service %s selects %s=%s, which its pods do not have (%v)", name, k, v, pod.Labels)
			}
		}
		if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "metrics" ||
			!slices.ContainsFunc(pod.Spec.Containers[0].Ports, func(p corev1.ContainerPort) bool {
				return p.Name == svc.Spec.Ports[0].TargetPort.StrVal && p.ContainerPort == svc.Spec.Ports[0].Port
			}) {
			t.Errorf("Service %s ports %+v: not the pods' metrics port", name, svc.Spec.Ports)
		}
		if svc.Labels["portico.io/group"] != "" {
			t.Errorf("Service %s is labelled a group", name)
		}
	}
	// The other Services of the chart (the group's) are not scraped.
	sm := byKind(objs, "ServiceMonitor")
	if len(sm) != 1 {
		t.Fatalf("%d ServiceMonitors, want 1", len(sm))
	}
	sel, _, _ := unstructured.NestedStringMap(sm[0].Object, "spec", "selector", "matchLabels")
	var selected []string
	for _, u := range byKind(objs, "Service") {
		if matches(sel, u.GetLabels()) {
			selected = append(selected, u.GetName())
		}
	}
	slices.Sort(selected)
	if d := cmp.Diff([]string{"portico-agent-metrics", "portico-controller-metrics"}, selected); d != "" {
		t.Errorf("the ServiceMonitor selects these Services (-want +got):\n%s", d)
	}
	want := map[string]any{
		"jobLabel":          "app.kubernetes.io/name",
		"namespaceSelector": map[string]any{"matchNames": []any{namespace}},
		"endpoints": []any{map[string]any{"port": "metrics", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s",
			"relabelings":       []any{map[string]any{"sourceLabels": []any{"__meta_kubernetes_pod_node_name"}, "targetLabel": "node"}},
			"metricRelabelings": []any{map[string]any{"action": "drop", "regex": "go_.*", "sourceLabels": []any{"__name__"}}}}},
	}
	for k, v := range want {
		if d := cmp.Diff(v, sm[0].Object["spec"].(map[string]any)[k]); d != "" {
			t.Errorf("ServiceMonitor spec.%s (-want +got):\n%s", k, d)
		}
	}
	pm := byKind(objs, "PodMonitor")
	if len(pm) != 1 {
		t.Fatalf("%d PodMonitors, want 1", len(pm))
	}
	endpoints, _, _ := unstructured.NestedSlice(pm[0].Object, "spec", "podMetricsEndpoints")
	if d := cmp.Diff([]any{map[string]any{"port": "metrics", "path": "/metrics", "interval": "1m",
		"relabelings": []any{map[string]any{"sourceLabels": []any{"__meta_kubernetes_pod_node_name"}, "targetLabel": "node"}}}}, endpoints); d != "" {
		t.Errorf("PodMonitor podMetricsEndpoints (-want +got):\n%s", d)
	}
	exprs, _, _ := unstructured.NestedSlice(pm[0].Object, "spec", "selector", "matchExpressions")
	for name, pod := range map[string]corev1.PodTemplateSpec{"agent": ds.Spec.Template, "controller": dep.Spec.Template} {
		if len(exprs) != 1 || !slices.Contains(exprs[0].(map[string]any)["values"].([]any), any(pod.Labels["app.kubernetes.io/name"])) {
			t.Errorf("the PodMonitor's selector %v does not select the %s pods (%v)", exprs, name, pod.Labels)
		}
	}

	rule := byKind(objs, "PrometheusRule")
	cms := slices.DeleteFunc(byKind(objs, "ConfigMap"), func(u *unstructured.Unstructured) bool { return u.GetName() != "portico-dashboard" })
	if len(rule) != 1 || len(cms) != 1 {
		t.Fatalf("%d PrometheusRules and %d dashboard ConfigMaps, want 1 each", len(rule), len(cms))
	}
	var file map[string]any
	if err := sigsyaml.Unmarshal(readFile(t, rulesFile), &file); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(file, rule[0].Object["spec"]); d != "" {
		t.Errorf("PrometheusRule spec is not %s (-file +rendered):\n%s", rulesFile, d)
	}
	data, _, _ := unstructured.NestedString(cms[0].Object, "data", "portico.json")
	if data != strings.TrimRight(string(readFile(t, dashboardFile)), "\n") {
		t.Errorf("the dashboard ConfigMap's portico.json is not %s", dashboardFile)
	}
	for _, tc := range []struct {
		u           *unstructured.Unstructured
		namespace   string
		labels      map[string]string
		annotations map[string]string
	}{
		{sm[0], "monitoring", map[string]string{"app.kubernetes.io/part-of": "portico", "release": "kube-prometheus-stack"}, nil},
		{pm[0], namespace, map[string]string{"app.kubernetes.io/part-of": "portico", "release": "kube-prometheus-stack"}, nil},
		{rule[0], "monitoring", map[string]string{"app.kubernetes.io/part-of": "portico", "release": "kube-prometheus-stack"}, nil},
		{cms[0], "grafana", map[string]string{"app.kubernetes.io/part-of": "portico", "grafana_dashboard": "1"}, map[string]string{"grafana_folder": "Portico"}},
	} {
		if tc.u.GetNamespace() != tc.namespace || !maps.Equal(tc.labels, tc.u.GetLabels()) || !maps.Equal(tc.annotations, tc.u.GetAnnotations()) {
			t.Errorf("%s: labels %v annotations %v, want namespace %s labels %v annotations %v", identity(tc.u), tc.u.GetLabels(), tc.u.GetAnnotations(), tc.namespace, tc.labels, tc.annotations)
		}
	}
	// Lint with the monitoring on, and the schema refuses bad monitoring values.
	run(t, nil, helm, append([]string{"lint", "--strict", chart}, setArgs(monitoringValues)...)...)
	for _, bad := range []string{"metrics.serviceMonitor.interval=30", "metrics.podMonitor.enabled=yes", "metrics.prometheusRule.namespace=Monitoring",
		"metrics.grafanaDashboard.lables.a=b", "metrics.serviceMonitor.relabelings[0]=x", "metrics.prometheusRules.enabled=true"} {
		out, err := exec.Command(helm, "template", "portico", chart, "--set", bad).CombinedOutput()
		if err == nil || !bytes.Contains(out, []byte("schema")) {
			t.Errorf("helm template --set %s: %v %s, want the values refused by values.schema.json", bad, err, out)
		}
	}
}

// matches reports whether labels has every key and value of sel.
func matches(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}

func readFile(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ruleFile is the part of a Prometheus rule file the tests read.
type ruleFile struct {
	Groups []struct {
		Rules []struct {
			Alert  string `json:"alert"`
			Record string `json:"record"`
			Expr   string `json:"expr"`
		} `json:"rules"`
	} `json:"groups"`
}

// renderedRules renders the chart's PrometheusRule and returns its spec as a
// rule file.
func renderedRules(t *testing.T) []byte {
	t.Helper()
	objs := renderMonitoring(t, helmBinary(t), []string{"metrics.prometheusRule.enabled=true"})
	rules := byKind(objs, "PrometheusRule")
	if len(rules) != 1 {
		t.Fatalf("%d PrometheusRules, want 1", len(rules))
	}
	out, err := sigsyaml.Marshal(rules[0].Object["spec"])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestAlertRules runs promtool check rules and promtool test rules
// (testdata/portico.rules.test.yaml) on the rules the chart renders into its
// PrometheusRule, and checks that the unit tests expect every alert to fire
// somewhere and, somewhere else, not to.
func TestAlertRules(t *testing.T) {
	promtool, _ := promtoolBinary(t)
	dir := t.TempDir()
	rules := renderedRules(t)
	if err := os.WriteFile(filepath.Join(dir, "portico.rules.yaml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := readFile(t, rulesTestFile)
	if err := os.WriteFile(filepath.Join(dir, "portico.rules.test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", run(t, nil, promtool, "check", "rules", filepath.Join(dir, "portico.rules.yaml")))
	t.Logf("%s", run(t, nil, promtool, "test", "rules", filepath.Join(dir, "portico.rules.test.yaml")))

	var rf ruleFile
	if err := sigsyaml.Unmarshal(rules, &rf); err != nil {
		t.Fatal(err)
	}
	var tf struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := sigsyaml.Unmarshal(tests, &tf); err != nil {
		t.Fatal(err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tf.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	n := 0
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			if !fires[r.Alert] || !quiet[r.Alert] {
				t.Errorf("alert %s: %s has a case where it fires: %v, one where it does not: %v; want both", r.Alert, rulesTestFile, fires[r.Alert], quiet[r.Alert])
			}
		}
	}
	if n < 10 {
		t.Errorf("%d alerts in the rendered rules, want the 11 of %s", n, rulesFile)
	}
}

// TestQueriesNameExportedMetrics: every PromQL expression of the alert rules and
// of the dashboard (its panels' queries and its variables' label_values) names
// only metrics docs/metrics.md lists, and only labels those metrics have (or
// Prometheus gives every target), as Prometheus's parser reads them
// (promql-selectors).
func TestQueriesNameExportedMetrics(t *testing.T) {
	_, selectors := promtoolBinary(t)
	doc := exportedMetrics(t)

	var exprs []string
	var rf ruleFile
	if err := sigsyaml.Unmarshal(readFile(t, rulesFile), &rf); err != nil {
		t.Fatal(err)
	}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
		}
	}
	dash := dashboardQueries(t, readFile(t, dashboardFile))
	if len(dash) < 20 {
		t.Fatalf("%d queries read from the dashboard, want its 40 or so", len(dash))
	}
	exprs = append(exprs, dash...)
	for _, p := range checkQueries(t, selectors, doc, exprs) {
		t.Error(p)
	}

	// The check finds what it is for: a metric nobody exports, a label a
	// metric does not have, a grouping by one, a histogram's series of a
	// gauge, a selector without a metric name, an expression that does not
	// parse.
	bad := []string{
		`rate(portico_nginx_requests_total[5m])`,
		`portico_bgp_session_up{vip="192.0.2.80"}`,
		`sum by (peer) (portico_agent_healthy)`,
		`portico_agent_healthy_bucket`,
		`{__name__=~"portico_.*"}`,
		`sum(rate(portico_xdp_packets_total[5m])`,
		`portico_vrrp_state{exported_peer="x"}`,
	}
	got := checkQueries(t, selectors, doc, bad)
	for _, e := range bad {
		if !slices.ContainsFunc(got, func(p string) bool { return strings.Contains(p, e) }) {
			t.Errorf("checkQueries finds nothing wrong with %s", e)
		}
	}
	good := []string{`histogram_quantile(0.9, sum by (le, instance) (rate(portico_nginx_reload_duration_seconds_bucket{job="portico-agent"}[5m])))`,
		`max by (exported_instance) (portico_vrrp_state)`, `portico_agent_healthy * on (instance) group_left (reason) portico_agent_unhealthy`}
	if p := checkQueries(t, selectors, doc, good); len(p) > 0 {
		t.Errorf("checkQueries refuses good expressions: %v", p)
	}
}

// docMetric is one row of docs/metrics.md.
type docMetric struct {
	typ    string
	labels []string
}

// exportedMetrics reads the table of docs/metrics.md (make metrics-doc,
// hack/metricsdoc: every series Portico registers).
func exportedMetrics(t *testing.T) map[string]docMetric {
	t.Helper()
	row := regexp.MustCompile("^\\| `([a-z_:][a-z0-9_:]*)` \\| ([a-z]+) \\| ([^|]*) \\|")
	out := map[string]docMetric{}
	sc := bufio.NewScanner(bytes.NewReader(readFile(t, metricsDoc)))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		m := row.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		var labels []string
		for _, l := range strings.Split(m[3], ",") {
			if l = strings.Trim(strings.TrimSpace(l), "`"); l != "" && l != "—" {
				labels = append(labels, l)
			}
		}
		out[m[1]] = docMetric{typ: m[2], labels: labels}
	}
	if len(out) < 50 {
		t.Fatalf("%d metrics read from %s: its table changed form?", len(out), metricsDoc)
	}
	return out
}

// targetLabels are the labels Prometheus gives every series of a target scraped
// through a ServiceMonitor or PodMonitor; a metric's own label of the same name is
// renamed exported_<name>.
var targetLabels = []string{"job", "instance", "namespace", "pod", "service", "endpoint", "container"}

// grafanaVariables stand in for the dashboard's variables that are not inside
// a string (where they are regular expressions, valid as they are).
var grafanaVariables = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

// labelValues is a Grafana variable's query label_values(metric, label).
var labelValues = regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`)

// dashboardQueries returns the PromQL of a dashboard's panels (in rows too) and
// variables; a variable's label_values(metric, label) becomes the expression
// count by (label) (metric).
func dashboardQueries(t *testing.T, data []byte) []string {
	t.Helper()
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var d struct {
		Panels     []json.RawMessage `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var out []string
	var walk func([]json.RawMessage)
	walk = func(ps []json.RawMessage) {
		for _, raw := range ps {
			var p panel
			if err := json.Unmarshal(raw, &p); err != nil {
				t.Fatalf("%s: %v", dashboardFile, err)
			}
			for _, tg := range p.Targets {
				if tg.Expr == "" {
					t.Errorf("%s: panel %q has a query without an expression", dashboardFile, p.Title)
				}
				out = append(out, grafanaVariables.Replace(tg.Expr))
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			if err := json.Unmarshal(v.Query, &q.Query); err != nil {
				t.Fatalf("%s: variable %s: %v", dashboardFile, v.Name, err)
			}
		}
		m := labelValues.FindStringSubmatch(strings.TrimSpace(q.Query))
		if m == nil {
			t.Errorf("%s: variable %s: query %q is not label_values(metric, label)", dashboardFile, v.Name, q.Query)
			continue
		}
		out = append(out, fmt.Sprintf("count by (%s) (%s)", m[2], m[1]))
	}
	return out
}

// checkQueries returns what is wrong with each expression: one that does not
// parse, a selector of a metric docs/metrics.md does not list (a histogram's
// _bucket, _sum and _count series are its own), or a label matched or grouped
// by that none of the metrics concerned has.
func checkQueries(t *testing.T, selectors string, doc map[string]docMetric, exprs []string) []string {
	t.Helper()
	in, err := json.Marshal(exprs)
	if err != nil {
		t.Fatal(err)
	}
	var results []struct {
		Expr      string `json:"expr"`
		Error     string `json:"error"`
		Selectors []struct {
			Metric string   `json:"metric"`
			Labels []string `json:"labels"`
		} `json:"selectors"`
		Groupings []struct {
			Labels  []string `json:"labels"`
			Metrics []string `json:"metrics"`
		} `json:"groupings"`
	}
	if err := json.Unmarshal(run(t, in, selectors), &results); err != nil {
		t.Fatal(err)
	}
	// labelsOf returns the labels a series name has, and whether Portico
	// exports it.
	labelsOf := func(name string) ([]string, bool) {
		m, ok := doc[name]
		var extra []string
		if !ok {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				base, cut := strings.CutSuffix(name, suffix)
				if bm, found := doc[base]; cut && found && (bm.typ == "histogram" || bm.typ == "summary") {
					m, ok = bm, true
					if suffix == "_bucket" {
						extra = append(extra, "le")
					}
				}
			}
		}
		if !ok {
			return nil, false
		}
		out := append(slices.Clone(targetLabels), extra...)
		for _, l := range m.labels {
			if slices.Contains(targetLabels, l) {
				out = append(out, "exported_"+l)
			} else {
				out = append(out, l)
			}
		}
		return out, true
	}
	var problems []string
	for _, r := range results {
		if r.Error != "" {
			problems = append(problems, fmt.Sprintf("%s: does not parse: %s", r.Expr, r.Error))
			continue
		}
		for _, s := range r.Selectors {
			if s.Metric == "" {
				problems = append(problems, fmt.Sprintf("%s: a selector without a metric name", r.Expr))
				continue
			}
			have, ok := labelsOf(s.Metric)
			if !ok {
				problems = append(problems, fmt.Sprintf("%s: %s is no metric Portico exports (%s)", r.Expr, s.Metric, metricsDoc))
				continue
			}
			for _, l := range s.Labels {
				if !slices.Contains(have, l) {
					problems = append(problems, fmt.Sprintf("%s: %s has no label %s (it has %v)", r.Expr, s.Metric, l, have))
				}
			}
		}
		for _, g := range r.Groupings {
			var have []string
			for _, m := range g.Metrics {
				ls, _ := labelsOf(m)
				have = append(have, ls...)
			}
			for _, l := range g.Labels {
				if !slices.Contains(have, l) {
					problems = append(problems, fmt.Sprintf("%s: grouped by %s, which none of %v has", r.Expr, l, g.Metrics))
				}
			}
		}
	}
	return problems
}
