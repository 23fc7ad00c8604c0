package deploy_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/portico-edge/portico/deploy"
)

// TestAgentDaemonSet: the DaemonSet the control plane derives IngressClaim
// DaemonSets from is the one the install applies, and each call returns a copy of
// its own.
func TestAgentDaemonSet(t *testing.T) {
	got, err := deploy.AgentDaemonSet()
	if err != nil {
		t.Fatal(err)
	}
	want := find[appsv1.DaemonSet](t, install(t), "DaemonSet", "portico-agent")
	quantity := cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 })
	if d := cmp.Diff(want, got, quantity); d != "" {
		t.Errorf("deploy.AgentDaemonSet() is not the installed agent DaemonSet (-installed +embedded):\n%s", d)
	}
	got.Spec.Template.Spec.Tolerations[0].Key = "changed"
	got.Spec.Template.Spec.Containers[0].Args[0] = "changed"
	again, err := deploy.AgentDaemonSet()
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, again, quantity); d != "" {
		t.Errorf("a change to one copy reached the next (-installed +second copy):\n%s", d)
	}
}
