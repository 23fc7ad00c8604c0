package deploy_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
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

// TestAgentUndoesItsNode: the agents (IngressClaims' too, which get this pod) can
// undo their node when their DaemonSet is deleted: they are told their own pod
// (--pod, from the downward API), keep their record of the node's original state
// in the host's /run/portico (--state-dir: a new pod finds what the first one
// recorded), and have time to release, stop nginx (at most 30 s) and undo the
// node before SIGKILL.
func TestAgentUndoesItsNode(t *testing.T) {
	ds, err := deploy.AgentDaemonSet()
	if err != nil {
		t.Fatal(err)
	}
	pod := ds.Spec.Template.Spec
	c := pod.Containers[0]
	flags := map[string]string{}
	for _, a := range c.Args {
		if k, v, ok := strings.Cut(strings.TrimPrefix(a, "--"), "="); ok {
			flags[k] = v
		}
	}
	if flags["pod"] != "$(POD_NAMESPACE)/$(POD_NAME)" {
		t.Errorf("--pod=%q, want $(POD_NAMESPACE)/$(POD_NAME)", flags["pod"])
	}
	fields := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			fields[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	if fields["POD_NAMESPACE"] != "metadata.namespace" || fields["POD_NAME"] != "metadata.name" {
		t.Errorf("downward API env %v, want POD_NAMESPACE and POD_NAME of the pod", fields)
	}
	state := flags["state-dir"]
	var volume string
	for _, m := range c.VolumeMounts {
		if m.MountPath == state && !m.ReadOnly {
			volume = m.Name
		}
	}
	i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == volume })
	if state == "" || i < 0 || pod.Volumes[i].HostPath == nil || pod.Volumes[i].HostPath.Path != "/run/portico" ||
		pod.Volumes[i].HostPath.Type == nil || *pod.Volumes[i].HostPath.Type != corev1.HostPathDirectoryOrCreate {
		t.Errorf("--state-dir=%q is not the host's /run/portico (DirectoryOrCreate), writable: mounts %+v, volumes %+v", state, c.VolumeMounts, pod.Volumes)
	}
	// --shutdown-delay (default 5 s) + nginx's graceful stop (at most 30 s) + the
	// metrics server's shutdown (at most 5 s), and room to undo the node.
	if g := pod.TerminationGracePeriodSeconds; g == nil || *g < 45 {
		t.Errorf("terminationGracePeriodSeconds %v, want at least 45", g)
	}
}
