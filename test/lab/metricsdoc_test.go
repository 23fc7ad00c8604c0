package lab

import (
	"os"
	"strings"
	"testing"
)

// checkMetricsDocumented: every portico_* series an edge's agent exports is in
// docs/metrics.md, the generated table (hack/metricsdoc lists what the packages
// register; a series registered elsewhere would be missing there, and fails
// here).
func (l *Lab) checkMetricsDocumented(t *testing.T) {
	t.Helper()
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	for i := range l.Edges {
		body, err := l.metrics(i)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(body, "\n") {
			name, ok := strings.CutPrefix(line, "# TYPE ")
			if !ok {
				continue
			}
			name, _, _ = strings.Cut(name, " ")
			if strings.HasPrefix(name, "portico_") && !strings.Contains(string(doc), "| `"+name+"` |") {
				t.Errorf("the agent on %s exports %s, which docs/metrics.md does not list (make metrics-doc; register it where hack/metricsdoc looks)",
					l.Edges[i].Name, name)
			}
		}
	}
}
