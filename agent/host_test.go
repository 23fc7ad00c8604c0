package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"
)

// TestLockNode: one agent at a time on a node. A second waits until the first
// has stopped (and undone the node), and portico uninstall refuses while an
// agent holds the lock.
func TestLockNode(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	log := zaptest.NewLogger(t)
	first, err := lockNode(context.Background(), dir, log)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tryLockNode(dir); !errors.Is(err, unix.EWOULDBLOCK) {
		t.Fatalf("second lock while the first is held: %v, want EWOULDBLOCK", err)
	}
	if err := UndoNode(filepath.Join(t.TempDir(), "pins"), dir); err == nil || !strings.Contains(err.Error(), "an agent is running") {
		t.Errorf("portico uninstall while an agent runs: %v, want a refusal", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := lockNode(ctx, dir, log); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting for a held lock: %v, want the context's end", err)
	}

	got := make(chan *os.File, 1)
	go func() {
		f, err := lockNode(context.Background(), dir, log)
		if err != nil {
			t.Error(err)
		}
		got <- f
	}()
	time.Sleep(300 * time.Millisecond) // the second agent waits on the file the first holds
	select {
	case <-got:
		t.Fatal("the second agent got the lock while the first held it")
	default:
	}
	// The first undoes the node (the lock file goes with the records), then exits.
	if err := UndoHost(dir); err != nil {
		t.Fatal(err)
	}
	first.Close()
	var second *os.File
	select {
	case second = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the second agent did not get the lock after the first stopped")
	}
	defer second.Close()
	if _, err := tryLockNode(dir); !errors.Is(err, unix.EWOULDBLOCK) {
		t.Errorf("a third lock while the second holds one: %v, want EWOULDBLOCK", err)
	}
	second.Close()
	if err := UndoNode(filepath.Join(t.TempDir(), "pins"), dir); err != nil {
		t.Errorf("portico uninstall with no agent: %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state directory after portico uninstall: %v, want removed", err)
	}
}

// TestLockNodeRemovedFile: the agent before undoes the node, removing the lock
// file, and stops between the next agent's opening of that file and its lock:
// the next one must lock the file that is there now, or a third would get in
// beside it.
func TestLockNodeRemovedFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	first, err := tryLockNode(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	once := false
	lockOpened = func() {
		if !once {
			once = true
			if err := UndoHost(dir); err != nil {
				t.Error(err)
			}
			first.Close()
		}
	}
	defer func() { lockOpened = func() {} }()
	second, err := tryLockNode(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if !once {
		t.Fatal("the first agent did not stop in between")
	}
	if _, err := tryLockNode(dir); !errors.Is(err, unix.EWOULDBLOCK) {
		t.Errorf("a third lock while the second holds one: %v, want EWOULDBLOCK", err)
	}
}
