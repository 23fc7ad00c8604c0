package ocitar

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestWrite checks the names come sorted, folders marked, extra files included, and
// that the same contents give the same bytes whatever the files' own times.
func TestWrite(t *testing.T) {
	epoch := time.Unix(1700000000, 0).UTC()
	build := func(mtime time.Time) []byte {
		src := t.TempDir()
		if err := os.MkdirAll(filepath.Join(src, "blobs/sha256"), 0o700); err != nil {
			t.Fatal(err)
		}
		for n, s := range map[string]string{"index.json": "{}", "blobs/sha256/ab": "blob", "oci-layout": "x"} {
			p := filepath.Join(src, n)
			if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(p, mtime, mtime); err != nil {
				t.Fatal(err)
			}
		}
		out := filepath.Join(t.TempDir(), "a.tar")
		if err := Write(out, src, map[string][]byte{"manifest.json": []byte("[]")}, epoch); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a := build(time.Now())
	if b := build(time.Now().Add(-time.Hour)); !bytes.Equal(a, b) {
		t.Error("two writes of the same contents differ")
	}
	var names []string
	tr := tar.NewReader(bytes.NewReader(a))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(epoch) || h.Uid != 0 {
			t.Errorf("%s: mtime %s uid %d", h.Name, h.ModTime, h.Uid)
		}
		names = append(names, h.Name)
	}
	want := []string{"blobs/", "blobs/sha256/", "blobs/sha256/ab", "index.json", "manifest.json", "oci-layout"}
	if !slices.Equal(names, want) {
		t.Errorf("names %v, want %v", names, want)
	}
}
