package nginx

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteCertificatesPrivateAtomicAndPruned(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	a := CertFile{Name: "ns_a-1.pem", PEM: []byte("A")}
	b := CertFile{Name: "ns_b-1.pem", PEM: []byte("B")}
	if err := WriteCertificates(dir, []CertFile{a, b}); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o700 {
		t.Errorf("directory mode %v, want 0700", st.Mode().Perm())
	}
	for _, f := range []CertFile{a, b} {
		st, err := os.Stat(filepath.Join(dir, f.Name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", f.Name, st.Mode().Perm())
		}
	}
	// Adding leaves b for the running config; writing the new set prunes it.
	c := CertFile{Name: "ns_c-1.pem", PEM: []byte("C")}
	if err := addCertificates(dir, []CertFile{c}); err != nil {
		t.Fatal(err)
	}
	assertFiles(t, dir, a.Name, b.Name, c.Name)
	if err := WriteCertificates(dir, []CertFile{c}); err != nil {
		t.Fatal(err)
	}
	assertFiles(t, dir, c.Name)
	if err := WriteCertificates(dir, []CertFile{{Name: "../escape.pem"}}); err == nil {
		t.Error("a file name with a path was accepted")
	}
}

func assertFiles(t *testing.T, dir string, want ...string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if len(got) != len(want) {
		t.Fatalf("files %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("files %v, want %v", got, want)
		}
	}
}
