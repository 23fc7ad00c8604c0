package shutdown

import (
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

type factory struct{ release chan struct{} }

func (f factory) Shutdown() { <-f.release }

func TestInformers(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	log := zap.New(core)
	quick := factory{release: make(chan struct{})}
	close(quick.release)
	if !Informers(log, quick, nil, quick) {
		t.Error("Informers of stopped informers reported some still running")
	}
	if logs.Len() != 0 {
		t.Errorf("warned for stopped informers: %v", logs.All())
	}
	stuck := factory{release: make(chan struct{})}
	defer close(stuck.release)
	if Informers(log, quick, stuck) {
		t.Error("Informers reported an informer that never stopped as stopped")
	}
	if logs.FilterMessageSnippet("not waited for").Len() != 1 {
		t.Errorf("want one warning for the informer not waited for, got %v", logs.All())
	}
}
