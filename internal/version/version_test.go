package version

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestLinkTimeVersionWins(t *testing.T) {
	defer func(v string) { Version = v }(Version)
	Version = "v1.2.3-4-gabcdef0"
	in := Get()
	if in.Version != "v1.2.3-4-gabcdef0" || !strings.HasPrefix(in.String(), "portico v1.2.3-4-gabcdef0") || in.Go == "" {
		t.Errorf("Get() = %+v, String %q", in, in.String())
	}
	Version = ""
	if got := Get().Version; got != "devel" {
		t.Errorf("no link-time version, test binary: %q, want devel", got)
	}
}

func TestBuildInfoMetric(t *testing.T) {
	defer func(v string) { Version = v }(Version)
	Version = "v9.9.9"
	reg := prometheus.NewRegistry()
	reg.MustRegister(Collector())
	want := `
# HELP portico_build_info Always 1; its labels say which Portico this is: version (a git tag, or git describe between releases), revision (the commit) and goversion.
# TYPE portico_build_info gauge
portico_build_info{goversion="` + Get().Go + `",revision="` + Get().Revision + `",version="v9.9.9"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "portico_build_info"); err != nil {
		t.Error(err)
	}
}
