// Package ocitar writes a folder, such as an OCI image layout, as one reproducible tar:
// names sorted, owner root, fixed modes, every time the same.
package ocitar

import (
	"archive/tar"
	"bytes"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Write writes the files and folders under src, and the files of extra (name to
// contents, at the archive's top), as the tar out: names sorted, folders 0755, files
// 0644, every mtime epoch.
func Write(out, src string, extra map[string][]byte, epoch time.Time) error {
	var names []string
	if err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == src {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if d.IsDir() {
			rel += "/"
		}
		names = append(names, filepath.ToSlash(rel))
		return err
	}); err != nil {
		return err
	}
	for n := range extra {
		names = append(names, n)
	}
	sort.Strings(names)
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	for _, n := range names {
		h := &tar.Header{Name: n, ModTime: epoch, Format: tar.FormatPAX}
		if strings.HasSuffix(n, "/") {
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			continue
		}
		h.Typeflag, h.Mode = tar.TypeReg, 0o644
		if err := writeFile(tw, h, filepath.Join(src, filepath.FromSlash(n)), extra); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}

// writeFile writes the file h.Name, from extra or else from path.
func writeFile(tw *tar.Writer, h *tar.Header, path string, extra map[string][]byte) error {
	var r io.Reader
	if b, ok := extra[h.Name]; ok {
		h.Size, r = int64(len(b)), bytes.NewReader(b)
	} else {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		h.Size, r = st.Size(), f
	}
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	_, err := io.Copy(tw, r)
	return err
}
