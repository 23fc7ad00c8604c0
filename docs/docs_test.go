// Package docs_test checks the documentation against the code: every relative
// link of README.md and docs/*.md leads to a file (and a heading, where it names
// one), and every command of their shell blocks is a real one — each `make`
// target is the Makefile's, each `portico` subcommand and flag the binary's, each
// `helm --set` key a value of the chart — and the commands that need no cluster
// and no root run.
package docs_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// page is one markdown file: its path from the repository's root, and its text.
type page struct{ path, text string }

func pages(t *testing.T) []page {
	t.Helper()
	files, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []page
	for _, f := range append([]string{"../README.md"}, files...) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, page{path: filepath.Clean(filepath.Join("docs", f)), text: string(b)})
	}
	return out
}

var linkRE = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// slug is GitHub's anchor for a heading: lower case, punctuation but '-' and '_'
// dropped, spaces turned into '-'.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors are the headings' slugs of a markdown file.
func anchors(text string) []string {
	var out []string
	fence := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "```") {
			fence = !fence
		}
		if !fence && strings.HasPrefix(l, "#") {
			out = append(out, slug(strings.TrimLeft(l, "#")))
		}
	}
	return out
}

// linkProblems lists the relative links of p (at path, from the repository's
// root, read from root) that lead nowhere.
func linkProblems(root string, p page) []string {
	var bad []string
	for _, m := range linkRE.FindAllStringSubmatch(p.text, -1) {
		target := m[1]
		if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
			continue
		}
		file, anchor, _ := strings.Cut(target, "#")
		path := filepath.Join(root, filepath.Dir(p.path), file)
		if file == "" {
			path = filepath.Join(root, p.path)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			if st, serr := os.Stat(path); serr == nil && st.IsDir() {
				continue
			}
			bad = append(bad, fmt.Sprintf("%s: link %s: no such file", p.path, target))
			continue
		}
		if anchor != "" && strings.HasSuffix(path, ".md") && !slices.Contains(anchors(string(b)), anchor) {
			bad = append(bad, fmt.Sprintf("%s: link %s: no such heading", p.path, target))
		}
	}
	return bad
}

// commands are the command lines of a page's sh/bash/console blocks, with
// continuations joined, prompts and comments dropped.
func commands(text string) []string {
	var out []string
	in := false
	var cont string
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "```") {
			lang := strings.TrimPrefix(l, "```")
			in = !in && (lang == "sh" || lang == "bash" || lang == "console")
			continue
		}
		if !in {
			continue
		}
		l = strings.TrimPrefix(strings.TrimSpace(l), "$ ")
		if i := strings.Index(l, " #"); i >= 0 {
			l = l[:i]
		}
		if strings.HasPrefix(l, "#") {
			continue
		}
		l = strings.TrimSpace(l)
		if strings.HasSuffix(l, "\\") {
			cont += strings.TrimSpace(strings.TrimSuffix(l, "\\")) + " "
			continue
		}
		if l = strings.TrimSpace(cont + l); l != "" {
			out = append(out, l)
		}
		cont = ""
	}
	return out
}

// checker knows the real commands: the Makefile's targets, the binary's
// subcommands and their flags, the chart's values.
type checker struct {
	targets []string
	help    func(sub string) (string, error) // `portico sub -h`; "" for an unknown sub
	values  map[string]any
}

var targetRE = regexp.MustCompile(`(?m)^([a-zA-Z0-9_-]+):`)

func newChecker(t *testing.T, portico string) *checker {
	t.Helper()
	mk, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	c := &checker{}
	for _, m := range targetRE.FindAllStringSubmatch(string(mk), -1) {
		c.targets = append(c.targets, m[1])
	}
	vb, err := os.ReadFile("../deploy/helm/portico/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(vb, &c.values); err != nil {
		t.Fatal(err)
	}
	c.help = func(sub string) (string, error) {
		out, _ := exec.Command(portico, sub, "-h").CombinedOutput()
		if strings.Contains(string(out), "unknown command") {
			return "", nil
		}
		return string(out), nil
	}
	return c
}

// hasValue reports whether the dotted key (a[0].b) names a value of the chart,
// or lies inside a map or list value the chart leaves open.
func hasValue(values map[string]any, key string) bool {
	var cur any = values
	for i, part := range strings.Split(key, ".") {
		part, _, _ = strings.Cut(part, "[")
		m, ok := cur.(map[string]any)
		if !ok {
			return true // inside a list or a free-form value
		}
		v, ok := m[part]
		if !ok {
			return len(m) == 0 && i > 0 // an empty map below the top: free-form
		}
		cur = v
	}
	return true
}

// problems lists what is wrong with one command line.
func (c *checker) problems(line string) []string {
	f := strings.Fields(line)
	if len(f) == 0 {
		return nil
	}
	var bad []string
	switch f[0] {
	case "make":
		for _, a := range f[1:] {
			if strings.HasPrefix(a, "-") || strings.Contains(a, "=") {
				continue
			}
			if !slices.Contains(c.targets, a) {
				bad = append(bad, fmt.Sprintf("%q: make has no target %s", line, a))
			}
		}
	case "portico":
		if len(f) < 2 {
			return nil
		}
		help, err := c.help(f[1])
		if err != nil || help == "" {
			return append(bad, fmt.Sprintf("%q: portico has no subcommand %s", line, f[1]))
		}
		for _, a := range f[2:] {
			if !strings.HasPrefix(a, "-") {
				continue
			}
			name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if !regexp.MustCompile(`(?m)^\s+-` + regexp.QuoteMeta(name) + `\b`).MatchString(help) {
				bad = append(bad, fmt.Sprintf("%q: portico %s has no flag -%s", line, f[1], name))
			}
		}
	case "helm":
		for i, a := range f {
			if a != "--set" && a != "--set-string" || i+1 >= len(f) {
				continue
			}
			for _, kv := range strings.Split(f[i+1], ",") {
				k, _, _ := strings.Cut(kv, "=")
				if !hasValue(c.values, k) {
					bad = append(bad, fmt.Sprintf("%q: the chart has no value %s", line, k))
				}
			}
		}
	}
	return bad
}

// runnable are the commands that need no cluster, no root and no network,
// which the test runs.
func runnable(line string) bool {
	f := strings.Fields(line)
	return len(f) >= 2 && f[0] == "portico" && (f[1] == "maglev" || f[1] == "version")
}

func buildPortico(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "portico")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/portico").CombinedOutput(); err != nil {
		t.Fatalf("build portico: %v\n%s", err, out)
	}
	return bin
}

func TestDocs(t *testing.T) {
	bin := buildPortico(t)
	c := newChecker(t, bin)
	n, ran := 0, 0
	for _, p := range pages(t) {
		for _, b := range linkProblems("..", p) {
			t.Error(b)
		}
		for _, line := range commands(p.text) {
			n++
			for _, b := range c.problems(line) {
				t.Errorf("%s: %s", p.path, b)
			}
			if runnable(line) {
				ran++
				f := strings.Fields(line)
				if out, err := exec.Command(bin, f[1:]...).CombinedOutput(); err != nil {
					t.Errorf("%s: %q: %v\n%s", p.path, line, err, out)
				}
			}
		}
	}
	t.Logf("%d commands checked, %d run", n, ran)
}

// TestChecker: the checks find what is wrong (a test of the test).
func TestChecker(t *testing.T) {
	c := &checker{
		targets: []string{"test", "demo"},
		help: func(sub string) (string, error) {
			if sub == "flows" {
				return "Usage of flows:\n  -n int\n    \tentries\n  -pin string\n", nil
			}
			return "", nil
		},
		values: map[string]any{"iface": "eth0", "group": map[string]any{"vip": ""}, "podAnnotations": map[string]any{}},
	}
	for _, tc := range []struct {
		line string
		bad  bool
	}{
		{"make test demo", false},
		{"make tset", true},
		{"make -s test IMAGE=x", false},
		{"portico flows -n 20", false},
		{"portico flows --pin=/x", false},
		{"portico flows -m 20", true},
		{"portico flow", true},
		{"helm install p chart --set iface=eth1 --set group.vip=10.0.0.1", false},
		{"helm install p chart --set group.vipp=10.0.0.1", true},
		{"helm install p chart --set ifac=eth1", true},
		{"helm install p chart --set podAnnotations.a=b", false},
		{"kubectl get pods", false},
	} {
		if got := len(c.problems(tc.line)) > 0; got != tc.bad {
			t.Errorf("%q: problems %v, want some: %v", tc.line, c.problems(tc.line), tc.bad)
		}
	}
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "docs"), 0o755)
	os.WriteFile(filepath.Join(root, "docs", "a.md"), []byte("# A page\n\n## Some heading\n"), 0o644)
	p := page{path: "docs/b.md", text: "[ok](a.md) [ok](a.md#some-heading) [no](c.md) [no](a.md#other) [web](https://x.example/y)"}
	if got := linkProblems(root, p); len(got) != 2 {
		t.Errorf("link problems %v, want the two links that lead nowhere", got)
	}
	if got := commands("```sh\nmake a \\\n  b   # two\n# only a comment\n$ portico x\n```\n```yaml\nmake c\n```\n"); !slices.Equal(got, []string{"make a b", "portico x"}) {
		t.Errorf("commands %q", got)
	}
}
