package nginx

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// WriteCertificates makes dir hold exactly files: it writes them as addCertificates
// does and removes every other file (those of earlier configurations).
func WriteCertificates(dir string, files []CertFile) error {
	if err := addCertificates(dir, files); err != nil {
		return err
	}
	want := map[string]bool{}
	for _, f := range files {
		want[f.Name] = true
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("list certificate directory: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if !want[e.Name()] {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove stale certificate: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}

// addCertificates creates dir with mode 0700 and writes each file with mode 0600
// through a temporary file and a rename, so nginx never reads half a key. Files
// whose content is already right are left alone, and other files stay: the running
// configuration may still need them.
func addCertificates(dir string, files []CertFile) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create certificate directory: %w", err)
	}
	// MkdirAll leaves an existing directory's mode alone.
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("restrict certificate directory: %w", err)
	}
	for _, f := range files {
		if f.Name == "" || strings.ContainsAny(f.Name, "/\\") || strings.HasPrefix(f.Name, ".") {
			return fmt.Errorf("write certificate: bad file name %q", f.Name)
		}
		if err := writeFileIfChanged(filepath.Join(dir, f.Name), f.PEM, 0o600); err != nil {
			return fmt.Errorf("write certificate %s: %w", f.Name, err)
		}
	}
	return nil
}

// writeFileIfChanged writes data to path as writeFileAtomic does, unless path holds
// data already.
func writeFileIfChanged(path string, data []byte, mode os.FileMode) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	return writeFileAtomic(path, data, mode)
}

// writeFileAtomic writes data to a temporary file beside path, syncs it and renames
// it over path.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("create temporary file: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // a no-op after a successful rename
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return fmt.Errorf("set mode: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename into place: %w", err)
	}
	return nil
}

// resolve returns p, or p inside prefix when p is relative (as nginx resolves it).
func resolve(prefix, p string) string {
	if filepath.IsAbs(p) || p == "stderr" {
		return p
	}
	return filepath.Join(prefix, p)
}

// prepareDirs creates the directories a configuration rendered with opt needs before
// nginx can start or test it; prefix is nginx's -p directory.
//
// Workers run as an unprivileged user (Options.User or nginx's default) and keep
// large request and response bodies under TempDir, so the prefix and TempDir are
// 0711: workers may pass through but not list them. nginx creates the
// subdirectories itself, owned by the worker user. CertDir stays 0700: only the
// master, which runs as root, reads keys. So does the control socket's directory:
// nginx makes the socket writable by everyone, and whoever can connect can reroute
// traffic.
func prepareDirs(prefix string, opt Options) error {
	ctlDir := filepath.Dir(resolve(prefix, opt.ControlSocket))
	for _, shared := range []string{prefix, resolve(prefix, opt.TempDir)} {
		if filepath.Clean(shared) == ctlDir {
			return fmt.Errorf("create nginx directories: control socket %s needs a private directory of its own", opt.ControlSocket)
		}
	}
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{
		{prefix, 0o711},
		{resolve(prefix, opt.TempDir), 0o711},
		{resolve(prefix, opt.CertDir), 0o700},
		{ctlDir, 0o700},
	} {
		if err := os.MkdirAll(d.path, d.mode); err != nil {
			return fmt.Errorf("create nginx directory: %w", err)
		}
		if err := os.Chmod(d.path, d.mode); err != nil {
			return fmt.Errorf("set nginx directory mode: %w", err)
		}
	}
	return nil
}

// unsearchable returns the first directory above path that others (nginx's
// workers, an unprivileged user) may not pass through, or "".
func unsearchable(path string) string {
	for d := filepath.Dir(filepath.Clean(path)); ; d = filepath.Dir(d) {
		if st, err := os.Stat(d); err == nil && st.Mode().Perm()&0o001 == 0 {
			return d
		}
		if d == filepath.Dir(d) {
			return ""
		}
	}
}
