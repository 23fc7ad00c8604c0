package nginx

import (
	"strings"
	"testing"

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
	// A changed certificate is a new file name, hence a new config text and a reload.
	changed := snap
	changed.Certificates = append([]model.Certificate(nil), snap.Certificates...)
	for i := range changed.Certificates {
		if changed.Certificates[i].Name == "shop/secure-tls" {
			changed.Certificates[i].CertPEM = append([]byte("\n"), changed.Certificates[i].CertPEM...)
			changed.Certificates[i].CertPEM = append(changed.Certificates[i].CertPEM, []byte("\n# comment outside the PEM blocks\n")...)
		}
	}
	cfg2, err := Render(changed, goldenOptions())
	if err != nil {
		t.Fatal(err)
	}
	if cfg2.Certificates[0].Name == cfg.Certificates[0].Name || cfg2.Checksum == cfg.Checksum {
		t.Error("a changed certificate kept its file name and config checksum")
	}
}
