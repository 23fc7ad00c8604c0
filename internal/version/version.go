// Package version says which Portico a binary is: the release it was built
// from (a git tag vX.Y.Z, or git describe's vX.Y.Z-N-gREV between releases),
// its commit and its Go. make build and make image set Version from git
// describe --tags (-ldflags -X); a binary built otherwise (go build, go
// install) reads what the Go toolchain stamped into it.
package version

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// Version is set at link time: -ldflags "-X github.com/portico-edge/portico/internal/version.Version=v0.1.0".
var Version = ""

// Info is what `portico version` prints and portico_build_info labels.
type Info struct {
	Version  string `json:"version"`  // "v0.1.0", "v0.1.0-3-gabcdef0", or "devel"
	Revision string `json:"revision"` // the commit, when the toolchain stamped it
	Modified bool   `json:"modified"` // built from a tree with uncommitted changes
	Go       string `json:"go"`
}

// Get returns this binary's Info.
func Get() Info {
	in := Info{Version: Version, Go: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if in.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			in.Version = bi.Main.Version // go install ...@vX.Y.Z
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				in.Revision = s.Value
			case "vcs.modified":
				in.Modified = s.Value == "true"
			}
		}
	}
	if in.Version == "" {
		in.Version = "devel"
	}
	return in
}

// String is the one line `portico version` prints.
func (in Info) String() string {
	s := "portico " + in.Version
	if in.Revision != "" {
		s += " (commit " + in.Revision
		if in.Modified {
			s += ", modified"
		}
		s += ")"
	}
	return s + " " + in.Go
}

// Collector is the gauge portico_build_info{version,revision,goversion}, always
// 1, as Prometheus' own exporters report their build: `count by (version)` shows
// an upgrade's progress across the edges.
func Collector() prometheus.Collector {
	in := Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "portico_build_info",
		Help:        "Always 1; its labels say which Portico this is: version (a git tag, or git describe between releases), revision (the commit) and goversion.",
		ConstLabels: prometheus.Labels{"version": in.Version, "revision": in.Revision, "goversion": in.Go},
	})
	g.Set(1)
	return g
}
