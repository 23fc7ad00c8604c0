package controlplane

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/testenv"
)

const converge = 20 * time.Second

// waitSnapshot waits until the sink's latest snapshot equals want.
func waitSnapshot(t *testing.T, r *running, want func() model.Snapshot) {
	t.Helper()
	testenv.Eventually(t, converge, func() string {
		got, _ := r.sink.latest()
		if d := cmp.Diff(want(), got, cmpAddrs); d != "" {
			return "snapshot (-want +got):\n" + d
		}
		return ""
	})
}

func annotations(t *testing.T, e *env, kind, name string) map[string]string {
	t.Helper()
	var m metav1.Object
	var err error
	switch kind {
	case "Service":
		m, err = e.cs.CoreV1().Services(e.ns).Get(e.ctx, name, metav1.GetOptions{})
	case "Ingress":
		m, err = e.cs.NetworkingV1().Ingresses(e.ns).Get(e.ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return map[string]string{"error": err.Error()}
	}
	return m.GetAnnotations()
}

func hasEvent(e *env, name, reason string) bool {
	evs, err := e.cs.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		return false
	}
	for _, ev := range evs.Items {
		if ev.InvolvedObject.Name == name && ev.Reason == reason {
			return true
		}
	}
	return false
}
