// The docs test reads README.md and docs/*.md as an operator would copy from them:
// every command, Helm value, Kubernetes object and link must be one the code has.
package docs_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/portico-edge/portico/test/testenv"
)

// root is the repository: the test runs in docs/.
const root = ".."

var (
	buildOnce  sync.Once
	binDir     string
	porticoBin string
	buildErr   error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// newTestChecker builds cmd/portico once for the package's tests and returns a
// checker over the repository, with hack/helm.sh's helm when it is built.
func newTestChecker(t *testing.T) *checker {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "portico-docs-")
		if buildErr != nil {
			return
		}
		porticoBin = filepath.Join(binDir, "portico")
		gobin, err := exec.LookPath("go")
		if err != nil {
			gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		out, err := exec.Command(gobin, "build", "-o", porticoBin, "../cmd/portico").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/portico: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	c, err := newChecker(root, porticoBin, helmPath())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// helmPath is the helm hack/helm.sh builds (make helm), or "" when it is not built.
func helmPath() string {
	out, err := exec.Command(filepath.Join(root, "hack/helm.sh"), "path").Output()
	if err != nil {
		return ""
	}
	p := strings.TrimSpace(string(out))
	if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
		return ""
	}
	return p
}

// pages are the README and every page of docs/, as repository paths.
func pages(t *testing.T) []string {
	t.Helper()
	ps, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md"}
	for _, p := range ps {
		out = append(out, filepath.ToSlash(rel(root, p)))
	}
	sort.Strings(out[1:])
	return out
}

// TestDocs checks every page: each make target, portico subcommand and flag (parsed
// as the binary's flag package parses them), helm flag, chart value (--set, -f, a
// yaml helm-values block) and repository file it names exists; its Kubernetes
// objects decode strictly, portico.io ones against their CRD's schema; its relative
// links reach a file and heading. The commands that need no cluster and no root run
// and must succeed: portico version and maglev, and helm template (or lint) of the
// chart with the values shown, when helm is built.
func TestDocs(t *testing.T) {
	c := newTestChecker(t)
	for _, name := range pages(t) {
		t.Run(name, func(t *testing.T) {
			src, err := os.ReadFile(filepath.Join(root, name))
			if err != nil {
				t.Fatal(err)
			}
			r := c.checkPage(name, string(src))
			for _, err := range r.errs {
				t.Error(err)
			}
			for _, ru := range r.runs {
				t.Run(strings.TrimPrefix(ru.where, name+":")+" "+ru.name, func(t *testing.T) {
					if ru.name == "helm" && c.helm == "" {
						testenv.Unavailable(t, "helm is not built (make helm)")
					}
					if err := c.runCommand(t.TempDir(), ru); err != nil {
						t.Error(err)
					}
				})
			}
		})
	}
}

// TestDocsREADMELength: the README stays an entrance (what Portico is, a picture,
// prerequisites, a quick start, the commands for a fresh machine, links); the rest
// belongs in docs/.
func TestDocsREADMELength(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > 150 {
		t.Errorf("README.md has %d lines, want at most 150: move the detail to docs/", n)
	}
}

// TestDocsCheckerCatches feeds the checker pages with one mistake each and wants
// each found (and a page without one to pass), so TestDocs can fail.
func TestDocsCheckerCatches(t *testing.T) {
	c := newTestChecker(t)
	fenced := func(lang, body string) string { return "# Page\n\n```" + lang + "\n" + body + "\n```\n" }
	for _, tc := range []struct {
		name, page, want string // want: a part of the one error expected; "" for none
	}{
		{"a good page", "# Page\n\nSee [the README](../README.md#prerequisites) and [below](#page).\n\n" +
			fenced("sh", "make demo\nportico flows -n 20\nportico maglev -m 4099 10.0.0.1\nhelm install portico deploy/helm/portico --set iface=eth1 --set bgp.peers[0].asn=65000\n"+
				"kubectl -n portico-system exec pod -c agent -- portico counters\nkubectl apply -f deploy/federation/controller.yaml") +
			fenced("yaml", "apiVersion: portico.io/v1alpha1\nkind: VIPPool\nmetadata: {name: p}\nspec: {addresses: [192.0.2.0/28]}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {ports: [{port: 80}]}"), ""},
		{"unknown make target", fenced("sh", "make tset"), `no target "tset"`},
		{"unknown subcommand", fenced("sh", "portico stauts"), "no such subcommand"},
		{"unknown flag", fenced("sh", "portico flows --limit 20"), "-limit is not a flag"},
		{"flag after an argument", fenced("sh", "portico maglev 10.0.0.1 -m 4099"), "no longer reads flags"},
		{"nested command's flag", fenced("sh", "portico federation dns -config a.yaml -ttl 5s"), "-ttl is not a flag"},
		{"command in kubectl exec", fenced("sh", "kubectl exec pod -- portico flows -x"), "-x is not a flag"},
		{"command in $(...)", fenced("sh", "kubectl create secret generic s --from-literal=seed=$(portico nosuch)"), "no such subcommand"},
		{"unknown program", fenced("sh", "portcio status"), "portcio: a program"},
		{"unknown chart value", fenced("sh", "helm install portico deploy/helm/portico --set ifac=eth1"), "ifac is not a value"},
		{"unknown nested chart value", fenced("sh", "helm upgrade portico deploy/helm/portico --set vrrp.prio=3"), "vrrp.prio: values.schema.json has no such key"},
		{"missing values file", fenced("sh", "helm install portico deploy/helm/portico -f mine.yaml"), "neither a file"},
		{"values block with a bad key", fenced("yaml helm-values v.yaml", "bgp:\n  peer: []"), "bgp.peer"},
		{"missing chart", fenced("sh", "helm install portico deploy/helm/portic"), "not a chart"},
		{"missing repository file", fenced("sh", "kubectl apply -f deploy/examples/nosuch.yaml"), "no such file"},
		{"missing go package", fenced("sh", "go test ./test/nosuch -run X"), "no package"},
		{"link to a missing file", "# Page\n\nSee [x](nosuch.md).\n", "does not exist"},
		{"link to a missing heading", "# Page\n\nSee [x](../README.md#nosuch).\n", "no heading #nosuch"},
		{"unknown field of a CRD kind", fenced("yaml", "apiVersion: portico.io/v1alpha1\nkind: VIPPool\nmetadata: {name: p}\nspec: {addresses: [192.0.2.0/28], autoassign: true}"), "unknown field"},
		{"a value the CRD refuses", fenced("yaml", "apiVersion: portico.io/v1alpha1\nkind: VIPPool\nmetadata: {name: p}\nspec: {addresses: [192.0.2.0/28], autoAssign: maybe}"), "refused by the CRD's schema"},
		{"unknown kind of portico.io", fenced("yaml", "apiVersion: portico.io/v1alpha1\nkind: Pool\nmetadata: {name: p}"), "no CRD"},
		{"unknown field of a core object", fenced("yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {typo: 1}"), "unknown field"},
		{"YAML that is no object", fenced("yaml", "announce: bgp"), "not a Kubernetes object"},
		{"a gslb file that does not validate", fenced("yaml gslb s.yaml", "self: east\nnames: [a.example]\nsites: [{name: west, addrs: [192.0.2.1], health: http://x/health}]"), "not among the sites"},
		{"a fence without a language", fenced("", "make demo"), "without a language"},
		{"a here-document", fenced("sh", "kubectl apply -f - <<EOF"), "here-document"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := c.checkPage("docs/test.md", tc.page)
			var got []string
			for _, err := range r.errs {
				got = append(got, err.Error())
			}
			switch {
			case tc.want == "" && len(got) > 0:
				t.Errorf("errors on a good page:\n%s", strings.Join(got, "\n"))
			case tc.want != "" && (len(got) != 1 || !strings.Contains(got[0], tc.want)):
				t.Errorf("got %d errors:\n%s\nwant one containing %q", len(got), strings.Join(got, "\n"), tc.want)
			}
		})
	}
}

// TestDocsRunsFail: a command the test runs fails it when it exits non-zero: a
// Maglev weight that is no number, and (with helm) a value the chart's schema
// refuses.
func TestDocsRunsFail(t *testing.T) {
	c := newTestChecker(t)
	for _, tc := range []struct{ name, line string }{
		{"portico", "portico maglev 10.0.0.1=x"},
		{"helm", "helm template portico deploy/helm/portico --set vrrp.version=4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "helm" && c.helm == "" {
				testenv.Unavailable(t, "helm is not built (make helm)")
			}
			r := c.checkPage("docs/test.md", "# Page\n\n```sh\n"+tc.line+"\n```\n")
			if len(r.errs) > 0 || len(r.runs) != 1 {
				t.Fatalf("errors %v, runs %v: want no error and one run", r.errs, r.runs)
			}
			if err := c.runCommand(t.TempDir(), r.runs[0]); err == nil {
				t.Errorf("%s: ran without an error, want it to fail", tc.line)
			}
		})
	}
}
