package docs_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/kube-openapi/pkg/validation/spec"
	"k8s.io/kube-openapi/pkg/validation/strfmt"
	"k8s.io/kube-openapi/pkg/validation/validate"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	sjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/federation/gslb"
)

// A checker holds what the docs are checked against: the Makefile's targets, the
// portico binary, the chart's values schema, the CRDs, and (when built) helm.
type checker struct {
	root    string // the repository
	portico string // the built binary
	helm    string // hack/helm.sh's helm, or "" when it is not built

	targets   map[string]bool
	schema    map[string]any // values.schema.json
	valueKeys map[string]bool
	crds      map[string]*spec.Schema // by kind, portico.io/v1alpha1
	summaries map[string]string       // portico's subcommands and their summaries
	helps     map[string]help         // by "sub" or "sub nested"
}

// help is what a command's -h lists: each flag and whether it takes a value.
type help struct {
	text  string
	flags map[string]bool
}

// run is a command the docs show that the test runs: it needs no cluster and no root.
type run struct {
	where  string
	name   string   // portico or helm
	args   []string // "block:NAME" stands for the page's block NAME, written to a file
	dir    string
	blocks map[string]block
}

// result is what checking a page found: problems, and the commands to run.
type result struct {
	errs []error
	runs []run
}

func (r *result) errorf(where, format string, args ...any) {
	r.errs = append(r.errs, fmt.Errorf("%s: %s", where, fmt.Sprintf(format, args...)))
}

func newChecker(root, portico, helm string) (*checker, error) {
	c := &checker{root: root, portico: portico, helm: helm, targets: map[string]bool{}, valueKeys: map[string]bool{},
		crds: map[string]*spec.Schema{}, summaries: map[string]string{}, helps: map[string]help{}}
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		return nil, err
	}
	for _, l := range strings.Split(string(mk), "\n") {
		if m := makeTarget.FindStringSubmatch(l); m != nil && !strings.HasPrefix(m[1], ".") {
			c.targets[m[1]] = true
		}
		if rest, ok := strings.CutPrefix(l, ".PHONY:"); ok {
			for _, t := range strings.Fields(rest) {
				c.targets[t] = true
			}
		}
	}
	raw, err := os.ReadFile(filepath.Join(root, "deploy/helm/portico/values.schema.json"))
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(raw, &c.schema); err != nil {
		return nil, fmt.Errorf("values.schema.json: %w", err)
	}
	raw, err = os.ReadFile(filepath.Join(root, "deploy/helm/portico/values.yaml"))
	if err != nil {
		return nil, err
	}
	var values map[string]any
	if err := yaml.Unmarshal(raw, &values); err != nil {
		return nil, fmt.Errorf("values.yaml: %w", err)
	}
	for k := range values {
		c.valueKeys[k] = true
	}
	crdFiles, _ := filepath.Glob(filepath.Join(root, "deploy/helm/portico/crds/*.yaml"))
	fed, _ := filepath.Glob(filepath.Join(root, "deploy/federation/*.portico.io.yaml"))
	for _, f := range append(crdFiles, fed...) {
		if err := c.loadCRD(f); err != nil {
			return nil, err
		}
	}
	out, _ := exec.Command(portico).CombinedOutput() // usage, exit 2
	for _, l := range strings.Split(string(out), "\n") {
		if m := usageLine.FindStringSubmatch(l); m != nil {
			c.summaries[m[1]] = m[2]
		}
	}
	if len(c.summaries) == 0 {
		return nil, fmt.Errorf("portico without arguments listed no commands:\n%s", out)
	}
	return c, nil
}

// loadCRD reads a CRD's v1alpha1 schema.
func (c *checker) loadCRD(file string) error {
	raw, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var crd struct {
		Spec struct {
			Group string `json:"group"`
			Names struct {
				Kind string `json:"kind"`
			} `json:"names"`
			Versions []struct {
				Name   string `json:"name"`
				Schema struct {
					OpenAPIV3Schema json.RawMessage `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &crd); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	for _, v := range crd.Spec.Versions {
		if crd.Spec.Group+"/"+v.Name != v1alpha1.GroupVersion.String() {
			continue
		}
		s := new(spec.Schema)
		if err := json.Unmarshal(v.Schema.OpenAPIV3Schema, s); err != nil {
			return fmt.Errorf("%s: schema: %w", file, err)
		}
		c.crds[crd.Spec.Names.Kind] = s
	}
	return nil
}

// checkPage checks one page's blocks and links; name is its path in the repository.
func (c *checker) checkPage(name, src string) result {
	var r result
	p := parsePage(src)
	if p.unclosed != 0 {
		r.errorf(fmt.Sprintf("%s:%d", name, p.unclosed), "a fence that is never closed")
	}
	named := map[string]block{}
	for _, b := range p.blocks {
		if b.lang == "yaml" && len(b.info) == 2 {
			named[b.info[1]] = b
		}
	}
	for _, b := range p.blocks {
		where := fmt.Sprintf("%s:%d", name, b.line)
		switch b.lang {
		case "sh", "bash", "console":
			for _, cmd := range commands(b) {
				c.checkLine(&r, fmt.Sprintf("%s:%d", name, cmd.line), cmd.text, named)
			}
		case "yaml":
			c.checkYAML(&r, where, b)
		case "text":
		case "":
			r.errorf(where, "a fence without a language: say sh, console, yaml or text, so the docs test knows what to check")
		default:
			r.errorf(where, "fence language %q: the docs test knows sh, bash, console, yaml and text", b.lang)
		}
	}
	dir := filepath.Dir(filepath.Join(c.root, name))
	for _, l := range p.links() {
		where := fmt.Sprintf("%s:%d", name, l.line)
		path, frag, _ := strings.Cut(l.target, "#")
		target := filepath.Join(c.root, name)
		if path != "" {
			target = filepath.Join(dir, path)
		}
		if _, err := os.Stat(target); path != "" && err != nil {
			r.errorf(where, "link %s: %s does not exist", l.target, rel(c.root, target))
			continue
		}
		if frag == "" {
			continue
		}
		if !strings.HasSuffix(target, ".md") {
			r.errorf(where, "link %s: an anchor into a file that is not Markdown", l.target)
			continue
		}
		src := src
		if path != "" {
			b, err := os.ReadFile(target)
			if err != nil {
				r.errorf(where, "link %s: %v", l.target, err)
				continue
			}
			src = string(b)
		}
		if !anchors(parsePage(src).headings)[frag] {
			r.errorf(where, "link %s: %s has no heading #%s", l.target, rel(c.root, target), frag)
		}
	}
	return r
}

func rel(root, p string) string {
	if r, err := filepath.Rel(root, p); err == nil {
		return r
	}
	return p
}

// checkLine checks every simple command of one command line, and those of its
// $(...) substitutions.
func (c *checker) checkLine(r *result, where, line string, named map[string]block) {
	words, ops, err := lexShell(line)
	if err != nil {
		r.errorf(where, "%v", err)
		return
	}
	for _, cmd := range simpleCommands(words, ops) {
		args := make([]string, len(cmd))
		for i, w := range cmd {
			args[i] = w.text
			for _, s := range w.subs {
				c.checkLine(r, where, s, named)
			}
		}
		c.checkCommand(r, where, args, named)
	}
}

// checkCommand checks one simple command by its program. Programs the docs may
// show that the test has no check for are listed so a misspelt one still fails.
func (c *checker) checkCommand(r *result, where string, args []string, named map[string]block) {
	for len(args) > 0 && (envAssign.MatchString(args[0]) || args[0] == "sudo") {
		args = args[1:]
	}
	if len(args) == 0 {
		return
	}
	switch args[0] {
	case "make":
		c.checkMake(r, where, args[1:])
	case "portico":
		c.checkPortico(r, where, args[1:])
	case "helm":
		c.checkHelm(r, where, args[1:], named)
	case "kubectl":
		c.checkKubectl(r, where, args[1:], named)
	case "go":
		c.checkGo(r, where, args[1:])
	case "bpftool", "ip", "curl", "docker", "ctr", "skopeo", "crane", "od", "tr", "sysctl", "ethtool", "kind", "journalctl":
	default:
		r.errorf(where, "%s: a program the docs test does not know (a typo, or add it to checkCommand)", args[0])
	}
}

func (c *checker) checkMake(r *result, where string, args []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-C" || a == "-f":
			i++
		case strings.HasPrefix(a, "-"), strings.Contains(a, "="):
		case !c.targets[a]:
			r.errorf(where, "make %s: the Makefile has no target %q", a, a)
		}
	}
}

// checkPortico checks that the subcommand exists and parses the flags shown as the
// binary's flag package would: each flag is one its -h lists, before the first
// argument that is not a flag. version and maglev (no cluster, no root) are run.
func (c *checker) checkPortico(r *result, where string, args []string) {
	if len(args) == 0 {
		r.errorf(where, "portico without a subcommand")
		return
	}
	sub, rest := args[0], args[1:]
	summary, ok := c.summaries[sub]
	if !ok {
		r.errorf(where, "portico %s: no such subcommand (portico lists %s)", sub, strings.Join(slices.Sorted(maps.Keys(c.summaries)), ", "))
		return
	}
	name := sub
	if len(rest) > 0 && bareWord.MatchString(rest[0]) && regexp.MustCompile(`\b`+rest[0]+`\b`).MatchString(summary) {
		if h := c.help(sub, rest[0]); strings.Contains(h.text, "Usage of "+sub+" "+rest[0]+":") {
			name, rest = sub+" "+rest[0], rest[1:]
		}
	}
	h := c.help(strings.Fields(name)...)
	if len(h.flags) == 0 && !strings.Contains(h.text, "Usage of "+name) {
		r.errorf(where, "portico %s -h printed no usage:\n%s", name, h.text)
		return
	}
	positional := ""
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			if positional == "" {
				positional = a
			}
			continue
		}
		f, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if positional != "" {
			r.errorf(where, "portico %s: %s comes after the argument %s, where the flag package no longer reads flags", name, a, positional)
			continue
		}
		if f == "h" || f == "help" {
			continue
		}
		takes, ok := h.flags[f]
		if !ok {
			r.errorf(where, "portico %s: -%s is not a flag of it (portico %s -h)", name, f, name)
			continue
		}
		if takes && !hasValue {
			i++
		}
	}
	if sub == "version" || sub == "maglev" {
		r.runs = append(r.runs, run{where: where, name: "portico", args: args})
	}
}

var (
	makeTarget   = regexp.MustCompile(`^([A-Za-z0-9_.-]+)\s*:([^=]|$)`)
	usageLine    = regexp.MustCompile(`^  ([a-z]+)\s+(.*)$`)
	envAssign    = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=`)
	bareWord     = regexp.MustCompile(`^[a-z]+$`)
	flagLine     = regexp.MustCompile(`(?m)^  -([A-Za-z0-9][A-Za-z0-9_.-]*)(?: (\S+))?`)
	helmFlagLine = regexp.MustCompile(`(?m)^\s+(?:-(\w), )?--([\w-]+)(?: (\w+))?`)
	docSeparator = regexp.MustCompile(`(?m)^---\s*$`)
)

// help runs `portico words... -h` once and reads the flags it lists.
func (c *checker) help(words ...string) help {
	key := strings.Join(words, " ")
	if h, ok := c.helps[key]; ok {
		return h
	}
	out, _ := exec.Command(c.portico, append(slices.Clone(words), "-h")...).CombinedOutput()
	h := help{text: string(out), flags: map[string]bool{}}
	for _, m := range flagLine.FindAllStringSubmatch(h.text, -1) {
		h.flags[m[1]] = m[2] != ""
	}
	c.helps[key] = h
	return h
}

// helm flags that take a value, when helm itself is not there to say.
var helmValueFlags = map[string]bool{"n": true, "namespace": true, "set": true, "set-string": true, "set-file": true,
	"set-json": true, "f": true, "values": true, "version": true, "kubeconfig": true, "kube-context": true,
	"s": true, "show-only": true, "timeout": true, "o": true, "output": true, "kube-version": true}

// checkHelm checks the chart path, every --set key and -f file against the chart's
// values schema, and each flag against helm's own help when helm is built;
// install, upgrade and template become a helm template run, lint a lint run.
func (c *checker) checkHelm(r *result, where string, args []string, named map[string]block) {
	var sub, namespace string
	var positional, sets, files []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			if sub == "" {
				sub = a
			} else {
				positional = append(positional, a)
			}
			continue
		}
		f, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		takes, known := helmValueFlags[f], true
		if c.helm != "" && sub != "" {
			flags := c.helmFlags(sub)
			takes, known = flags[f]
		}
		if !known {
			r.errorf(where, "helm %s: %s is not a flag of it (helm %s --help)", sub, a, sub)
			continue
		}
		if takes && !hasValue {
			if i+1 >= len(args) {
				r.errorf(where, "helm %s: %s without its value", sub, a)
				break
			}
			i++
			value = args[i]
		}
		switch f {
		case "n", "namespace":
			namespace = value
		case "set", "set-string":
			for _, kv := range splitSet(value) {
				k, _, ok := strings.Cut(kv, "=")
				if !ok {
					r.errorf(where, "helm --%s %s: not key=value", f, kv)
					continue
				}
				if err := c.valuePath(parseKey(k)); err != nil {
					r.errorf(where, "helm --%s %s: %v", f, kv, err)
				}
			}
			sets = append(sets, "--"+f, value)
		case "f", "values":
			path := value
			if b, ok := named[value]; ok {
				if err := c.checkValues(b.text); err != nil {
					r.errorf(where, "helm -f %s: %v", value, err)
				}
				path = "block:" + value
			} else if _, err := os.Stat(filepath.Join(c.root, value)); err != nil {
				r.errorf(where, "helm -f %s: neither a file of the repository nor a block `yaml helm-values %s` on this page", value, value)
				continue
			}
			files = append(files, path)
		}
	}
	chartArg := ""
	switch sub {
	case "install", "upgrade", "template":
		if len(positional) == 2 {
			chartArg = positional[1]
		} else if sub == "template" && len(positional) == 1 {
			chartArg = positional[0]
		}
	case "lint":
		if len(positional) == 1 {
			chartArg = positional[0]
		}
	}
	if chartArg == "" {
		return
	}
	if _, err := os.Stat(filepath.Join(c.root, chartArg, "Chart.yaml")); err != nil {
		r.errorf(where, "helm %s: %s is not a chart of the repository", sub, chartArg)
		return
	}
	var runArgs []string
	if sub == "lint" {
		runArgs = []string{"lint", chartArg}
	} else {
		runArgs = []string{"template", "portico", chartArg}
	}
	if namespace != "" {
		runArgs = append(runArgs, "--namespace", namespace)
	}
	runArgs = append(runArgs, sets...)
	for _, f := range files {
		runArgs = append(runArgs, "--values", f)
	}
	r.runs = append(r.runs, run{where: where, name: "helm", args: runArgs, dir: c.root, blocks: named})
}

// helmFlags reads `helm sub --help`: each flag and whether it takes a value.
func (c *checker) helmFlags(sub string) map[string]bool {
	key := "helm " + sub
	if h, ok := c.helps[key]; ok {
		return h.flags
	}
	out, _ := exec.Command(c.helm, sub, "--help").CombinedOutput()
	h := help{text: string(out), flags: map[string]bool{}}
	for _, m := range helmFlagLine.FindAllStringSubmatch(h.text, -1) {
		takes := m[3] != ""
		h.flags[m[2]] = takes
		if m[1] != "" {
			h.flags[m[1]] = takes
		}
	}
	c.helps[key] = h
	return h.flags
}

// splitSet splits a --set value at the commas that separate key=value pairs (not
// those escaped or inside {...} lists).
func splitSet(v string) []string {
	var out []string
	depth, start := 0, 0
	for i := 0; i < len(v); i++ {
		switch v[i] {
		case '\\':
			i++
		case '{', '[':
			depth++
		case '}', ']':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, v[start:i])
				start = i + 1
			}
		}
	}
	return append(out, v[start:])
}

// parseKey splits a --set key at its unescaped dots; a[0] becomes "a", "[0]".
func parseKey(k string) []string {
	var out []string
	var cur strings.Builder
	for i := 0; i < len(k); i++ {
		switch {
		case k[i] == '\\' && i+1 < len(k):
			i++
			cur.WriteByte(k[i])
		case k[i] == '.':
			out = append(out, cur.String())
			cur.Reset()
		case k[i] == '[':
			out = append(out, cur.String())
			cur.Reset()
			j := strings.IndexByte(k[i:], ']')
			if j < 0 {
				return append(out, k[i:])
			}
			out = append(out, k[i:i+j+1])
			i += j
			if i+1 < len(k) && k[i+1] == '.' {
				i++
			}
		default:
			cur.WriteByte(k[i])
		}
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return slices.DeleteFunc(out, func(s string) bool { return s == "" })
}

// valuePath reports whether a value path is one the chart takes: its top-level key
// is documented in values.yaml, and values.schema.json (which makes Helm refuse a
// misspelt key) declares the whole path.
func (c *checker) valuePath(path []string) error {
	if len(path) == 0 {
		return errors.New("an empty key")
	}
	if !c.valueKeys[path[0]] {
		return fmt.Errorf("%s is not a value of deploy/helm/portico/values.yaml", path[0])
	}
	node := c.schema
	for i, seg := range path {
		node = c.deref(node)
		at := strings.Join(path[:i+1], ".")
		if strings.HasPrefix(seg, "[") {
			if node["type"] != "array" {
				return fmt.Errorf("%s: not a list in values.schema.json", at)
			}
			items, ok := node["items"].(map[string]any)
			if !ok {
				return nil
			}
			node = items
			continue
		}
		props, _ := node["properties"].(map[string]any)
		if p, ok := props[seg].(map[string]any); ok {
			node = p
			continue
		}
		switch ap := node["additionalProperties"].(type) {
		case map[string]any:
			node = ap
			continue
		case bool:
			if !ap {
				return fmt.Errorf("%s: values.schema.json has no such key", at)
			}
			return nil
		}
		if t, _ := node["type"].(string); t != "" && t != "object" {
			return fmt.Errorf("%s: %s is a %s, not a map, in values.schema.json", at, strings.Join(path[:i], "."), t)
		}
		return nil // a free-form object
	}
	return nil
}

func (c *checker) deref(node map[string]any) map[string]any {
	ref, ok := node["$ref"].(string)
	if !ok {
		return node
	}
	defs, _ := c.schema["definitions"].(map[string]any)
	if d, ok := defs[strings.TrimPrefix(ref, "#/definitions/")].(map[string]any); ok {
		return d
	}
	return node
}

// checkValues checks every path of a values file against the schema.
func (c *checker) checkValues(text string) error {
	var v map[string]any
	if err := yaml.Unmarshal([]byte(text), &v); err != nil {
		return err
	}
	var errs []error
	var walk func(path []string, v any)
	walk = func(path []string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				walk(append(slices.Clone(path), k), e)
			}
			if len(x) == 0 && len(path) > 0 {
				errs = append(errs, c.valuePath(path))
			}
		case []any:
			for i, e := range x {
				walk(append(slices.Clone(path), fmt.Sprintf("[%d]", i)), e)
			}
			if len(x) == 0 {
				errs = append(errs, c.valuePath(path))
			}
		default:
			errs = append(errs, c.valuePath(path))
		}
	}
	walk(nil, v)
	return errors.Join(errs...)
}

// checkKubectl checks the repository files -f and -k name, and a command run
// with exec (after --) as a command of its own.
func (c *checker) checkKubectl(r *result, where string, args []string, named map[string]block) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			c.checkCommand(r, where, args[i+1:], named)
			return
		}
		var path string
		switch {
		case a == "-f" || a == "-k" || a == "--filename" || a == "--kustomize":
			if i+1 < len(args) {
				i++
				path = args[i]
			}
		case strings.HasPrefix(a, "--filename=") || strings.HasPrefix(a, "--kustomize="):
			_, path, _ = strings.Cut(a, "=")
		}
		if path == "" || path == "-" {
			continue
		}
		first, _, _ := strings.Cut(path, "/")
		if _, err := os.Stat(filepath.Join(c.root, first)); err != nil {
			continue // a file of the reader's, not of the repository
		}
		if _, err := os.Stat(filepath.Join(c.root, path)); err != nil {
			r.errorf(where, "kubectl %s %s: no such file in the repository", a, path)
		}
	}
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// checkGo checks that the packages go test, run, build or vet names exist.
func (c *checker) checkGo(r *result, where string, args []string) {
	for _, a := range args {
		if !strings.HasPrefix(a, "./") {
			continue
		}
		dir := strings.TrimSuffix(strings.TrimSuffix(a, "..."), "/")
		if !isDir(filepath.Join(c.root, dir)) {
			r.errorf(where, "go %s: no package %s in the repository", args[0], a)
		}
	}
}

// checkYAML decodes a yaml block. Kubernetes objects must decode strictly (no
// unknown fields); portico.io objects must pass their CRD's schema and decode into
// api/v1alpha1's types with no unknown field. Anything else says what it is:
// "yaml helm-values NAME" (chart values) or "yaml gslb NAME" (a site's DNS file).
func (c *checker) checkYAML(r *result, where string, b block) {
	kind := ""
	if len(b.info) > 0 {
		kind = b.info[0]
	}
	switch kind {
	case "helm-values":
		if err := c.checkValues(b.text); err != nil {
			r.errorf(where, "helm values: %v", err)
		}
		return
	case "gslb":
		if err := checkGSLB(b.text); err != nil {
			r.errorf(where, "gslb file: %v", err)
		}
		return
	case "":
	default:
		r.errorf(where, "yaml %s: the docs test knows yaml (Kubernetes objects), yaml helm-values and yaml gslb", kind)
		return
	}
	for i, doc := range docSeparator.Split(b.text, -1) {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		w := where
		if i > 0 {
			w = fmt.Sprintf("%s (document %d)", where, i+1)
		}
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil || meta.APIVersion == "" || meta.Kind == "" {
			r.errorf(w, "not a Kubernetes object (%v): mark other YAML as yaml helm-values or yaml gslb", err)
			continue
		}
		if err := c.checkObject(meta.APIVersion, meta.Kind, []byte(doc)); err != nil {
			r.errorf(w, "%s %s: %v", meta.APIVersion, meta.Kind, err)
		}
	}
}

// docScheme is client-go's kinds and Gateway API's (v1).
var docScheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := errors.Join(scheme.AddToScheme(s), gatewayv1.Install(s)); err != nil {
		panic(err)
	}
	return s
}()

var strict = kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, docScheme, docScheme,
	kjson.SerializerOptions{Yaml: true, Strict: true})

func (c *checker) checkObject(apiVersion, kind string, doc []byte) error {
	if apiVersion != v1alpha1.GroupVersion.String() {
		_, _, err := strict.Decode(doc, nil, nil)
		if runtime.IsNotRegisteredError(err) {
			return fmt.Errorf("a kind client-go does not know: %w", err)
		}
		return err
	}
	s, ok := c.crds[kind]
	if !ok {
		return fmt.Errorf("no CRD of the repository defines it")
	}
	var obj map[string]any
	if err := yaml.Unmarshal(doc, &obj); err != nil {
		return err
	}
	if res := validate.NewSchemaValidator(s, nil, "", strfmt.Default).Validate(obj); !res.IsValid() {
		return fmt.Errorf("refused by the CRD's schema: %w", errors.Join(res.Errors...))
	}
	typed := map[string]any{"VIPPool": &v1alpha1.VIPPool{}, "IngressClaim": &v1alpha1.IngressClaim{},
		"FederatedIngress": &v1alpha1.FederatedIngress{}, "BGPPeer": &v1alpha1.BGPPeer{}, "BFDProfile": &v1alpha1.BFDProfile{}}[kind]
	if typed == nil {
		return fmt.Errorf("api/v1alpha1 has no type the test knows for it")
	}
	// Case-sensitive, as the API server decodes: encoding/json would take
	// "autoassign" for autoAssign.
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return err
	}
	strictErrs, err := sjson.UnmarshalStrict(js, typed, sjson.DisallowDuplicateFields, sjson.DisallowUnknownFields)
	if err != nil {
		return fmt.Errorf("decode into api/v1alpha1: %w", err)
	}
	if len(strictErrs) > 0 {
		return fmt.Errorf("decode into api/v1alpha1: %w", errors.Join(strictErrs...))
	}
	return nil
}

func checkGSLB(text string) error {
	f, err := os.CreateTemp("", "gslb-*.yaml")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.WriteString(text); err != nil {
		return err
	}
	f.Close()
	cfg, err := gslb.LoadFile(f.Name())
	if err != nil {
		return err
	}
	cfg.OwnHealth = func(context.Context) gslb.Report { return gslb.Report{Healthy: true} }
	return cfg.Validate()
}

// runCommand runs a command the docs show and returns an error when it exits
// non-zero or prints nothing; the page's named blocks it uses (helm -f) are
// written into dir first.
func (c *checker) runCommand(dir string, ru run) error {
	bin := c.portico
	if ru.name == "helm" {
		bin = c.helm
	}
	args := slices.Clone(ru.args)
	for i, a := range args {
		if name, ok := strings.CutPrefix(a, "block:"); ok {
			p := filepath.Join(dir, filepath.Base(name))
			if err := os.WriteFile(p, []byte(ru.blocks[name].text), 0o644); err != nil {
				return err
			}
			args[i] = p
		}
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = ru.dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %s %s: %v\n%s", ru.where, ru.name, strings.Join(args, " "), err, out.Bytes())
	}
	if out.Len() == 0 {
		return fmt.Errorf("%s: %s %s printed nothing", ru.where, ru.name, strings.Join(args, " "))
	}
	return nil
}
