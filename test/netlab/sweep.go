package netlab

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// ownerDir holds one lock file per live lab, flock'ed by the process that made
// it. The kernel drops the lock when that process ends, however it ends (a
// test binary killed by its timeout, a session that ended): New then finds the
// lab's namespaces and BPF pins ownerless and removes them.
const ownerDir = "/run/portico-netlab"

// own marks prefix as this process's lab: its lock file, held until Close.
func (l *Lab) own() error {
	if err := os.MkdirAll(ownerDir, 0o700); err != nil {
		return err
	}
	path := filepath.Join(ownerDir, l.Prefix)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return err
	}
	l.onClose(func() error {
		defer f.Close()
		return os.Remove(path)
	})
	return nil
}

// sweep removes what labs whose process is gone left behind: every namespace
// and /sys/fs/bpf directory named with their prefix, and their lock file.
func sweep() error {
	ents, err := os.ReadDir(ownerDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		prefix := e.Name()
		path := filepath.Join(ownerDir, prefix)
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			continue
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			f.Close() // its owner runs
			continue
		}
		errs = append(errs, removePrefixed(prefix))
		os.Remove(path)
		f.Close()
	}
	return errors.Join(errs...)
}

// removePrefixed deletes the namespaces and BPF pin directories named with
// prefix (deleting a namespace removes its links).
func removePrefixed(prefix string) error {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return err
	}
	var errs []error
	for _, line := range strings.Split(string(out), "\n") {
		if ns, _, _ := strings.Cut(strings.TrimSpace(line), " "); strings.HasPrefix(ns, prefix) {
			errs = append(errs, IP("netns", "del", ns))
		}
	}
	pins, _ := filepath.Glob(filepath.Join("/sys/fs/bpf", prefix+"*"))
	for _, p := range pins {
		errs = append(errs, os.RemoveAll(p))
	}
	return errors.Join(errs...)
}
