package cluster

import (
	"archive/tar"
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/miekg/dns"
	yamlutil "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/portico-edge/portico/test/testenv"
)

// notBuilt are the repositories of images the suite's manifests name that
// BuildConformanceImages leaves out on purpose, and why.
var notBuilt = map[string]string{
	"registry.k8s.io/gateway-api/echo-advanced": "the mesh profile's backend (mesh/manifests.yaml), no Gateway's",
}

// TestConformanceImageNames checks that the wrapper modules build the versions the
// constants name, and that every image the conformance suite's manifests name is one
// BuildConformanceImages writes (or one notBuilt lists), and no other: a bump of the
// suite that changes a tag fails here, not on a node that cannot pull it.
func TestConformanceImageNames(t *testing.T) {
	for _, w := range []struct{ gomod, module, want string }{
		{"../../hack/conformance/echo-basic/go.mod", "sigs.k8s.io/gateway-api/conformance", GatewayAPIVersion},
		{"../../hack/conformance/coredns/go.mod", "github.com/coredns/coredns", CoreDNSVersion},
	} {
		if got := requiredVersion(t, w.gomod, w.module); got != w.want {
			t.Errorf("%s requires %s %q, the constant says %q: keep them equal", w.gomod, w.module, got, w.want)
		}
	}
	dir := conformanceModuleDir(t)
	named := manifestImages(t, dir)
	if len(named) == 0 {
		t.Fatalf("no image named in the manifests under %s", dir)
	}
	built := append(slices.Clone(EchoBasicImages), CoreDNSImage)
	for _, ref := range sortedKeys(named) {
		repo := ref[:strings.LastIndex(ref, ":")]
		switch {
		case slices.Contains(built, ref):
		case notBuilt[repo] != "":
			t.Logf("not built: %s (%s), named in %v", ref, notBuilt[repo], named[ref])
		default:
			t.Errorf("%v name %s, which BuildConformanceImages does not write: add it to EchoBasicImages or CoreDNSImage", named[ref], ref)
		}
	}
	for _, ref := range built {
		if named[ref] == nil {
			t.Errorf("BuildConformanceImages writes %s, which no manifest of the suite %s names: drop it", ref, GatewayAPIVersion)
		}
	}
}

// requiredVersion is the version of module that the go.mod at path requires.
func requiredVersion(t *testing.T, path, module string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*(?:require\s+)?` + regexp.QuoteMeta(module) + `\s+(v\S+)`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("%s does not require %s", path, module)
	}
	return string(m[1])
}

// conformanceModuleDir is the folder of the conformance suite's module, the version
// hack/conformance/echo-basic/go.mod requires, downloaded through the module proxy
// (or found in the module cache) and checked against that wrapper's go.sum.
func conformanceModuleDir(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", "sigs.k8s.io/gateway-api/conformance")
	cmd.Dir = "../../hack/conformance/echo-basic"
	cmd.Env = append(os.Environ(), "GOTOOLCHAIN=local")
	out, err := cmd.Output()
	var m struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &m); jerr != nil || err != nil || m.Error != "" {
		t.Fatalf("download sigs.k8s.io/gateway-api/conformance: %v %s %s", err, m.Error, out)
	}
	return m.Dir
}

// manifestImages returns every image named in the YAML files under dir, each with
// the files that name it.
func manifestImages(t *testing.T, dir string) map[string][]string {
	t.Helper()
	named := map[string][]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || (filepath.Ext(path) != ".yaml" && filepath.Ext(path) != ".yml") {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		refs, err := yamlImages(path)
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		for _, ref := range refs {
			if !slices.Contains(named[ref], rel) {
				named[ref] = append(named[ref], rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return named
}

// yamlImages returns the value of every "image" key, at any depth, in each document
// of the YAML file path: containers, init containers, whatever kind holds them.
func yamlImages(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var refs []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && k == "image" {
					refs = append(refs, s)
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	r := yamlutil.NewYAMLReader(bufio.NewReader(f))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return refs, nil
		}
		if err != nil {
			return nil, err
		}
		var v any
		if err := yaml.Unmarshal(doc, &v); err != nil {
			return nil, err
		}
		walk(v)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// TestConformanceImagesServe builds the conformance images twice (the second from the
// cached binaries) and checks that they come out byte for byte the same, that every
// name is in its archive, and that the programs, taken out of the archives and
// started as the suite's pods start them, answer: echo-basic echoes an HTTP request
// as the JSON the suite reads, CoreDNS answers a DNS query over UDP.
func TestConformanceImagesServe(t *testing.T) {
	if testing.Short() {
		t.Skip("builds echo-basic and CoreDNS from the Go module proxy (cold ~6.5 min, cached ~2 s a build)")
	}
	// make test does not build them (cold, ~6.5 min more than its budget holds)
	// until the suite itself runs in it (issue 25); make conformance-images does.
	if missing := conformanceBinariesMissing(t); missing != "" {
		t.Skipf("%s not built: run make conformance-images (cold ~6.5 min)", missing)
	}
	a, b := t.TempDir(), t.TempDir()
	start := time.Now()
	first, err := BuildConformanceImages(a)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first build %s", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	second, err := BuildConformanceImages(b)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("second build %s", time.Since(start).Round(time.Millisecond))
	if len(first) != 2 || len(second) != 2 {
		t.Fatalf("archives %v and %v, want 2 each", first, second)
	}
	for i := range first {
		sameBuild(t, first[i], second[i])
	}
	bin := t.TempDir()
	echo := imageEntrypoint(t, first[0], bin, EchoBasicImages...)
	coredns := imageEntrypoint(t, first[1], bin, CoreDNSImage)
	t.Run("echo-basic", func(t *testing.T) { checkEchoBasic(t, echo) })
	t.Run("coredns", func(t *testing.T) { checkCoreDNS(t, coredns) })
}

// imageEntrypoint unpacks the OCI archive into dir, checks that every one of names is
// an image in it, all the same, with one entry point, and writes that file out of
// the image's layers into dir. It returns the file's path.
func imageEntrypoint(t *testing.T, archive, dir string, names ...string) string {
	t.Helper()
	lay := filepath.Join(dir, filepath.Base(archive)+".d")
	untar(t, archive, lay)
	idx, err := layout.ImageIndexFromPath(lay)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range im.Manifests {
		got = append(got, d.Annotations["io.containerd.image.name"])
		if d.Digest != im.Manifests[0].Digest {
			t.Errorf("%s: %s is another image than %s", archive, got[len(got)-1], got[0])
		}
	}
	if diff := cmp.Diff(names, got); diff != "" {
		t.Fatalf("%s: the names (-want +got):\n%s", archive, diff)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if len(cf.Config.Entrypoint) != 1 || len(cf.Config.Cmd) != 0 || cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Fatalf("%s: entry point %q, command %q, platform %s/%s; want one program, no arguments, linux/amd64",
			archive, cf.Config.Entrypoint, cf.Config.Cmd, cf.OS, cf.Architecture)
	}
	entry := strings.TrimPrefix(cf.Config.Entrypoint[0], "/")
	fsys := mutate.Extract(img)
	defer fsys.Close()
	tr := tar.NewReader(fsys)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s: entry point %s is not in the image: %v", archive, entry, err)
		}
		if h.Name != entry {
			continue
		}
		if h.Mode&0o111 == 0 {
			t.Fatalf("%s: %s is not executable (mode %o)", archive, entry, h.Mode)
		}
		out := filepath.Join(dir, entry)
		f, err := os.OpenFile(out, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(f, tr); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		return out
	}
}

// untar writes the files of the tar archive into dir.
func untar(t *testing.T, archive, dir string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// startServer starts bin with args, its output in a log beside it, and kills it when
// t ends; ready is polled (30 s at most: the machine may be busy) until it returns
// nil, and t fails with the program's log if it does not, or the program exits.
func startServer(t *testing.T, bin string, ready func() error, args ...string) {
	t.Helper()
	log := filepath.Join(t.TempDir(), filepath.Base(bin)+".log")
	p, err := spawn(filepath.Base(bin), log, append([]string{bin}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.kill)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error {
		if !p.alive() {
			return fmt.Errorf("%s exited", filepath.Base(bin))
		}
		return ready()
	}); err != nil {
		out, _ := os.ReadFile(log)
		t.Fatalf("%v; its log:\n%s", err, out)
	}
}

// checkEchoBasic starts echo-basic as the suite's backends run it (its ports and the
// pod's name and namespace from the environment) and checks that it answers a
// request with the request's details, the fields the suite's round tripper
// (CapturedRequest) compares.
func checkEchoBasic(t *testing.T, bin string) {
	ports := testenv.Ports(t, 2)
	t.Setenv("HTTP_PORT", strconv.Itoa(int(ports[0])))
	t.Setenv("H2C_PORT", strconv.Itoa(int(ports[1])))
	t.Setenv("POD_NAME", "infra-backend-v1-abc")
	t.Setenv("NAMESPACE", "gateway-conformance-infra")
	client := &http.Client{Timeout: 2 * time.Second}
	url := fmt.Sprintf("http://127.0.0.1:%d/backend/v1?q=1", ports[0])
	var got struct {
		Path, Host, Method, Proto string
		Headers                   map[string][]string
		Namespace, Pod            string
	}
	startServer(t, bin, func() error {
		req, err := http.NewRequest(http.MethodPost, url, nil)
		if err != nil {
			return err
		}
		req.Host = "example.com"
		req.Header.Set("X-Conformance", "portico")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
			return fmt.Errorf("status %d, content type %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		return json.Unmarshal(body, &got)
	})
	want := []string{"/backend/v1?q=1", "example.com", "POST", "HTTP/1.1", "portico", "gateway-conformance-infra", "infra-backend-v1-abc"}
	seen := []string{got.Path, got.Host, got.Method, got.Proto, strings.Join(got.Headers["X-Conformance"], ","), got.Namespace, got.Pod}
	if diff := cmp.Diff(want, seen); diff != "" {
		t.Errorf("echoed path, host, method, protocol, header, namespace, pod (-want +got):\n%s", diff)
	}
}

// checkCoreDNS starts CoreDNS as the suite's pod does (-conf and a Corefile), with
// the whoami plugin the suite's Corefile serves foo.bar.com with, on a loopback
// port, and checks that it answers the query the suite sends: foo.bar.com, type A.
// The suite's Corefile also forwards everything else to public resolvers; this one
// does not, so nothing leaves the machine.
func checkCoreDNS(t *testing.T, bin string) {
	port := testenv.Ports(t, 1)[0]
	corefile := filepath.Join(t.TempDir(), "Corefile")
	conf := fmt.Sprintf("foo.bar.com:%d {\n    bind 127.0.0.1\n    whoami\n}\n", port)
	if err := os.WriteFile(corefile, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port)))
	msg := new(dns.Msg)
	msg.SetQuestion("foo.bar.com.", dns.TypeA)
	client := &dns.Client{Net: "udp", Timeout: time.Second}
	var r *dns.Msg
	startServer(t, bin, func() error {
		var err error
		r, _, err = client.Exchange(msg, addr)
		return err
	}, "-conf", corefile)
	// whoami answers with the client's own address and, in a SRV record, its port and
	// transport, all in the additional section.
	if r.Rcode != dns.RcodeSuccess || !r.Authoritative || len(r.Extra) != 2 {
		t.Fatalf("answer %s, want an authoritative one with two additional records", r)
	}
	if a, ok := r.Extra[0].(*dns.A); !ok || a.Hdr.Name != "foo.bar.com." || !a.A.Equal(net.IPv4(127, 0, 0, 1)) {
		t.Errorf("first additional record %s, want foo.bar.com. A 127.0.0.1", r.Extra[0])
	}
	if srv, ok := r.Extra[1].(*dns.SRV); !ok || srv.Hdr.Name != "_udp.foo.bar.com." || srv.Port == 0 {
		t.Errorf("second additional record %s, want _udp.foo.bar.com. SRV with the client's port", r.Extra[1])
	}
}

// conformanceBinariesMissing names the first of hack/conformance.sh's programs
// that is not built yet ("" when both are).
func conformanceBinariesMissing(t *testing.T) string {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(root, "hack/conformance.sh"), "path").Output()
	if err != nil {
		t.Fatalf("hack/conformance.sh path: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if _, err := os.Stat(p); err != nil {
			return filepath.Base(p)
		}
	}
	return ""
}
