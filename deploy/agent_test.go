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

// TestAgentTokenRootOnly: the agents' API token is not automounted (0644, which
// nginx's unprivileged workers in the same container could read) but mounted
// where client-go looks for it, root's alone; IngressClaim agents get the same pod.
func TestAgentTokenRootOnly(t *testing.T) {
	ds, err := deploy.AgentDaemonSet()
	if err != nil {
		t.Fatal(err)
	}
	pod := ds.Spec.Template.Spec
	if a := pod.AutomountServiceAccountToken; a == nil || *a {
		t.Errorf("automountServiceAccountToken %v, want false", a)
	}
	var mode int32 = -1
	sources := map[string]bool{}
	for _, v := range pod.Volumes {
		if v.Name != "kube-api-access" || v.Projected == nil {
			continue
		}
		if v.Projected.DefaultMode != nil {
			mode = *v.Projected.DefaultMode
		}
		for _, s := range v.Projected.Sources {
			switch {
			case s.ServiceAccountToken != nil && s.ServiceAccountToken.Path == "token":
				sources["token"] = true
			case s.ConfigMap != nil && s.ConfigMap.Name == "kube-root-ca.crt":
				sources["ca.crt"] = true
			case s.DownwardAPI != nil:
				sources["namespace"] = true
			}
		}
	}
	if mode != 0o400 || len(sources) != 3 {
		t.Errorf("kube-api-access: mode %#o, sources %v; want 0400 with token, ca.crt and namespace", mode, sources)
	}
	mounted := false
	for _, m := range pod.Containers[0].VolumeMounts {
		mounted = mounted || (m.Name == "kube-api-access" && m.MountPath == "/var/run/secrets/kubernetes.io/serviceaccount" && m.ReadOnly)
	}
	if !mounted {
		t.Errorf("kube-api-access is not mounted read-only where client-go reads the token: %+v", pod.Containers[0].VolumeMounts)
	}
}
