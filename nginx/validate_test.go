package nginx

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/portico-edge/portico/controlplane/model"
)

func TestValidateHost(t *testing.T) {
	for _, tc := range []struct {
		host string
		ok   bool
	}{
		{"example.com", true},
		{"a", true},
		{"xn--bcher-kva.example", true},
		{"1.2.3.4", true}, // all-digit labels are valid RFC 1123 labels
		{"*.example.com", true},
		{strings.Repeat("a", 63) + ".com", true},
		{strings.Repeat("a", 64) + ".com", false},
		{strings.Repeat("abcdefghi.", 25) + "abc", true}, // 253 characters
		{strings.Repeat("abcdefghi.", 25) + "abcd", false},
		{"", false},
		{"*", false},
		{"*.", false},
		{"a.*.example.com", false},
		{"-a.example.com", false},
		{"a-.example.com", false},
		{"a..example.com", false},
		{"example.com.", false},
		{"Example.com", false},
		{"exa_mple.com", false},
		{"example.com:80", false},
		{"example.com;", false},
		{"ex ample.com", false},
		{"~^.*$", false},
	} {
		if err := validateHost(tc.host); (err == nil) != tc.ok {
			t.Errorf("validateHost(%q) = %v, want ok=%v", tc.host, err, tc.ok)
		}
	}
}

func TestValidatePath(t *testing.T) {
	for _, tc := range []struct {
		path string
		ok   bool
	}{
		{"/", true},
		{"/foo", true},
		{"/foo/", true},
		{"/foo/bar-baz_1.2~x", true},
		{"/a:b@c!d&e*f+g,h=i", true},
		{"", false},
		{"foo", false},
		{"//foo", false},
		{"/foo//bar", false},
		{"/./foo", false},
		{"/foo/..", false},
		{"/foo bar", false},
		{"/foo;", false},
		{"/foo{", false},
		{"/foo}", false},
		{"/foo\"", false},
		{"/foo'", false},
		{"/foo$uri", false},
		{"/foo%20", false},
		{"/foo?x=1", false},
		{"/foo#x", false},
		{"/foo\\", false},
		{"/foo\n", false},
		{"/" + strings.Repeat("a", maxPathLen), false},
	} {
		if err := validatePath(tc.path); (err == nil) != tc.ok {
			t.Errorf("validatePath(%q) = %v, want ok=%v", tc.path, err, tc.ok)
		}
	}
}

func TestRenderWritesOnlyReferencedValidCertificates(t *testing.T) {
	snap := goldenCases(t)["tls-redirect"]
	cfg, err := Render(snap, goldenOptions())
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Certificates) != 1 || !strings.HasPrefix(cfg.Certificates[0].Name, "shop_secure-tls-") {
		var names []string
		for _, c := range cfg.Certificates {
			names = append(names, c.Name)
		}
		t.Fatalf("certificate files %v, want only shop/secure-tls's (the broken one fails, the unreferenced one is not written)", names)
	}
	// Text around the PEM blocks (openssl's "subject=" lines, in any encoding)
	// does not reach nginx: the same blocks are the same file, and the table's
	// value holds only the blocks.
	withText := snap
	withText.Certificates = append([]model.Certificate(nil), snap.Certificates...)
	for i := range withText.Certificates {
		if withText.Certificates[i].Name == "shop/secure-tls" {
			c := &withText.Certificates[i]
			c.CertPEM = append([]byte("subject=CN = Société\n\tBag Attributes\n"), c.CertPEM...)
			c.CertPEM = append(c.CertPEM, []byte("\n# comment outside the PEM blocks\n")...)
		}
	}
	cfg2, err := Render(withText, goldenOptions())
	if err != nil {
		t.Fatal(err)
	}
	v := cfg2.Table["c:"+cfg2.Certificates[0].Name]
	if cfg2.Certificates[0].Name != cfg.Certificates[0].Name || cfg2.Digest != cfg.Digest || strings.ContainsAny(v, "#é\t") {
		t.Errorf("text around the PEM blocks changed the certificate's file or value: %q", v)
	}
	// A new certificate is a new file name, hence a new key in the table.
	changed := snap
	changed.Certificates = append([]model.Certificate(nil), snap.Certificates...)
	for i := range changed.Certificates {
		if changed.Certificates[i].Name == "shop/secure-tls" {
			changed.Certificates[i] = selfSigned(t, "secure.example.com")
			changed.Certificates[i].Name = "shop/secure-tls"
		}
	}
	cfg3, err := Render(changed, goldenOptions())
	if err != nil {
		t.Fatal(err)
	}
	if cfg3.Certificates[0].Name == cfg.Certificates[0].Name || cfg3.Digest == cfg.Digest || cfg3.Table["c:"+cfg3.Certificates[0].Name] == "" {
		t.Error("a new certificate kept its file name, or is not in the table under the new one")
	}
	// A Secret's long name makes no longer a key than the table takes.
	long := snap
	long.Certificates = append([]model.Certificate(nil), snap.Certificates...)
	for i := range long.Certificates {
		if long.Certificates[i].Name == "shop/secure-tls" {
			long.Certificates[i].Name = "shop/" + strings.Repeat("abcdefghij.", 22) + "x"
		}
	}
	for i := range long.Servers {
		if long.Servers[i].TLSCertificate == "shop/secure-tls" {
			long.Servers[i].TLSCertificate = "shop/" + strings.Repeat("abcdefghij.", 22) + "x"
		}
	}
	cfg4, err := Render(long, goldenOptions())
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg4.Certificates) == 0 || len("c:"+cfg4.Certificates[0].Name) > 260 {
		t.Errorf("certificates %v: a key longer than 260 bytes", cfg4.Certificates)
	}
}

// A render with a certificate cache parses only certificates that changed, gives
// the same result as one without, and keeps only what the last render used.
func TestRenderCachesCertificateChecks(t *testing.T) {
	var parses int
	orig := x509KeyPair
	x509KeyPair = func(cert, key []byte) (tls.Certificate, error) {
		parses++
		return orig(cert, key)
	}
	defer func() { x509KeyPair = orig }()
	opt := goldenOptions()
	same := func(what string, got, want *Config) {
		t.Helper()
		if !bytes.Equal(got.Text, want.Text) {
			t.Errorf("%s: text differs from an uncached render", what)
		}
		if diff := cmp.Diff(want.Certificates, got.Certificates); diff != "" {
			t.Errorf("%s: certificates (-uncached +cached):\n%s", what, diff)
		}
		if diff := cmp.Diff(want.Problems, got.Problems); diff != "" {
			t.Errorf("%s: problems (-uncached +cached):\n%s", what, diff)
		}
	}

	snap := goldenCases(t)["tls-redirect"]
	want, err := Render(snap, opt)
	if err != nil {
		t.Fatal(err)
	}
	n := parses
	if n == 0 || len(want.Certificates) == 0 {
		t.Fatalf("the case parses %d certificates and uses %d: nothing to cache", n, len(want.Certificates))
	}
	var cache certCache
	for i, wantParses := range []int{n, 0, 0} {
		parses = 0
		got, err := render(snap, opt, nil, &cache)
		if err != nil {
			t.Fatal(err)
		}
		if parses != wantParses {
			t.Errorf("render %d parsed %d certificates, want %d", i, parses, wantParses)
		}
		same(fmt.Sprintf("render %d", i), got, want)
	}

	// A changed Secret is parsed again, and only it.
	changed := snap
	changed.Certificates = slices.Clone(snap.Certificates)
	for i, c := range changed.Certificates {
		if c.Name == "shop/secure-tls" {
			changed.Certificates[i] = selfSigned(t, "secure.example.com")
			changed.Certificates[i].Name = c.Name
		}
	}
	want2, err := Render(changed, opt)
	if err != nil {
		t.Fatal(err)
	}
	parses = 0
	got, err := render(changed, opt, nil, &cache)
	if err != nil {
		t.Fatal(err)
	}
	if parses != 1 {
		t.Errorf("render after one certificate changed parsed %d, want 1", parses)
	}
	same("changed certificate", got, want2)
	if got.Certificates[0].Name == want.Certificates[0].Name {
		t.Error("a changed certificate kept its file name")
	}

	// Certificates no render uses any more are dropped.
	if len(cache.entries) != n {
		t.Errorf("cache holds %d entries, want %d", len(cache.entries), n)
	}
	noTLS := changed
	noTLS.Servers = nil
	if _, err := render(noTLS, opt, nil, &cache); err != nil {
		t.Fatal(err)
	}
	if len(cache.entries) != 0 {
		t.Errorf("cache holds %d entries after a render without certificates, want 0", len(cache.entries))
	}
}

// A render with a cache reuses the locations of hosts whose paths did not change
// and whose upstreams resolve as before, and gives what a render without one
// gives: the same table, the same problems.
func TestRenderCachesLocations(t *testing.T) {
	snap := model.Snapshot{
		Servers: []model.Server{
			{Host: "a.test", Locations: []model.Location{{Path: "/", Type: model.PathPrefix, Upstream: "t-a-80"}}},
			{Host: "b.test", Locations: []model.Location{{Path: "/x", Type: model.PathExact, Upstream: "t-a-80"}, {Path: "/x", Type: model.PathExact, Upstream: "t-c-80", Source: "t/dup"}}},
			{Host: "c.test", Locations: []model.Location{{Path: "/", Type: model.PathPrefix, Upstream: "t-c-80"}}},
		},
		Upstreams: []model.Upstream{{Name: "t-a-80", Endpoints: []netip.AddrPort{ap("10.0.0.1:80")}}, {Name: "t-c-80", Endpoints: []netip.AddrPort{ap("10.0.0.3:80")}}},
	}
	var cache certCache
	same := func(step string, s model.Snapshot) {
		t.Helper()
		got, err := render(s, goldenOptions(), nil, &cache)
		if err != nil {
			t.Fatal(err)
		}
		want, err := Render(s, goldenOptions())
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want.Table, got.Table); diff != "" {
			t.Errorf("%s: table with the cache (-without +with):\n%s", step, diff)
		}
		if diff := cmp.Diff(want.Problems, got.Problems); diff != "" {
			t.Errorf("%s: problems with the cache (-without +with):\n%s", step, diff)
		}
	}
	same("first", snap)
	a, b := cache.locations["|a.test"], cache.locations["|b.test"]
	same("again", snap)
	if cache.locations["|a.test"] != a || cache.locations["|b.test"] != b {
		t.Error("an unchanged snapshot computed locations again")
	}
	// One host's paths change: only its locations are computed again.
	snap.Servers[0].Locations = append(slices.Clone(snap.Servers[0].Locations), model.Location{Path: "/new", Type: model.PathPrefix, Upstream: "t-c-80"})
	same("a.test gains a path", snap)
	if cache.locations["|a.test"] == a || cache.locations["|b.test"] != b {
		t.Error("the changed host's locations were reused, or another host's computed again")
	}
	// An upstream goes: every host that names it answers 503 and says why.
	snap.Upstreams = snap.Upstreams[:1]
	same("t-c-80 gone", snap)
	if cache.locations["|b.test"] == b {
		t.Error("b.test's locations were reused although an upstream it names is gone")
	}
	if len(cache.locations) != 3 {
		t.Errorf("the cache holds %d hosts, want 3", len(cache.locations))
	}
}
