package deploy_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane"
)

// The names the manifests and the code agree on.
const (
	namespace = "portico-system"
	agentSA   = "portico-agent"
	agentUser = "system:serviceaccount:" + namespace + ":" + agentSA
	// controllerSA is the controller Deployment's ServiceAccount.
	controllerSA = "portico-controller"
	// leaseName is controlplane.Config.LeaseName's default (not exported).
	leaseName = "portico-controlplane"
)

// agentGroups are the groups the API server gives the agent's (and any)
// ServiceAccount of the namespace.
var agentGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"}

// subject is one of the chart's ServiceAccounts, with the roles bound to it.
type subject struct {
	name  string   // the ServiceAccount's
	roles []string // its ClusterRoles and Roles
}

func (s subject) user() string { return "system:serviceaccount:" + namespace + ":" + s.name }

var (
	agentSubject      = subject{agentSA, []string{"portico-agent", "portico-agent-leases", "portico-agent-daemonsets", "portico-agent-bgp"}}
	controllerSubject = subject{controllerSA, []string{"portico-controller", "portico-controller-leases"}}
)

// notInKustomization are manifests under deploy/ that kustomization.yaml leaves out on
// purpose (the test still applies them). Any other manifest missing from it fails.
var notInKustomization = map[string]string{
	"examples/ingressclaim.yaml":                    "an on-demand group: applied by hand, not installed",
	"federation/federatedingresses.portico.io.yaml": "the host cluster of a federation only: kubectl apply -f deploy/federation/",
	"federation/controller.yaml":                    "the host cluster of a federation only: kubectl apply -f deploy/federation/",
	"federation/member-rbac.yaml":                   "each member cluster of a federation, applied by hand",
	"federation/dns.yaml":                           "each member cluster of a federation using its DNS variant, edited and applied by hand",
}

// kustomization is the part of kustomization.yaml the test reads.
type kustomization struct {
	Namespace string   `json:"namespace"`
	Resources []string `json:"resources"`
}

func readKustomization(t testing.TB) kustomization {
	t.Helper()
	data, err := os.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := sigsyaml.Unmarshal(data, &k); err != nil {
		t.Fatalf("parse kustomization.yaml: %v", err)
	}
	if len(k.Resources) == 0 {
		t.Fatal("kustomization.yaml lists no resources")
	}
	return k
}

// manifestFiles lists every Kubernetes manifest under deploy/ (slash paths relative to
// it): YAML files other than the kustomization itself, the kind config, the Helm
// chart they are generated from and the tests' data (testdata/: promtool's rule tests).
func manifestFiles(t testing.TB) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p == "kind" || p == "helm" || p == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if ext := filepath.Ext(p); (ext == ".yaml" || ext == ".yml") && p != "kustomization.yaml" {
			files = append(files, filepath.ToSlash(p))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(files)
	return files
}

// decodeFile returns the objects of a multi-document YAML file.
func decodeFile(t testing.TB, file string) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeAll(data)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return objs
}

func decodeAll(data []byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		u := &unstructured.Unstructured{}
		err := dec.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("decode: %w", err)
		}
		if len(u.Object) == 0 {
			continue // an empty document
		}
		if u.GetKind() == "" || u.GetAPIVersion() == "" || u.GetName() == "" {
			return nil, fmt.Errorf("an object without apiVersion, kind or name: %v", u.Object)
		}
		objs = append(objs, u)
	}
}

// install is what kubectl apply -k deploy creates: the kustomization's resources in
// order, namespaced objects without a namespace put in the kustomization's.
func install(t testing.TB) []*unstructured.Unstructured {
	t.Helper()
	k := readKustomization(t)
	var objs []*unstructured.Unstructured
	for _, f := range k.Resources {
		objs = append(objs, decodeFile(t, f)...)
	}
	return objs
}

// find returns the one object of a kind and name, converted to T.
func find[T any](t testing.TB, objs []*unstructured.Unstructured, kind, name string) *T {
	t.Helper()
	for _, u := range objs {
		if u.GetKind() == kind && u.GetName() == name {
			out := new(T)
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out); err != nil {
				t.Fatalf("convert %s %s: %v", kind, name, err)
			}
			return out
		}
	}
	t.Fatalf("no %s %s in the manifests", kind, name)
	return nil
}

func identity(u *unstructured.Unstructured) string {
	return fmt.Sprintf("%s %s %s/%s", u.GetAPIVersion(), u.GetKind(), u.GetNamespace(), u.GetName())
}

// TestKustomizationListsEveryManifest fails when a manifest under deploy/ is neither in
// kustomization.yaml nor in notInKustomization, and, when kubectl is installed, checks
// that kubectl kustomize renders exactly the objects of the listed files.
func TestKustomizationListsEveryManifest(t *testing.T) {
	k := readKustomization(t)
	if k.Namespace != namespace {
		t.Errorf("kustomization namespace %q, want %q", k.Namespace, namespace)
	}
	for _, r := range k.Resources {
		if _, err := os.Stat(r); err != nil {
			t.Errorf("kustomization resource %s: %v", r, err)
		}
		if _, ok := notInKustomization[r]; ok {
			t.Errorf("%s is listed in kustomization.yaml and in notInKustomization", r)
		}
	}
	for _, f := range manifestFiles(t) {
		if _, ok := notInKustomization[f]; !ok && !slices.Contains(k.Resources, f) {
			t.Errorf("%s is not in kustomization.yaml's resources (nor in notInKustomization)", f)
		}
	}
	for f := range notInKustomization {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("notInKustomization: %v", err)
		}
	}

	// Every namespaced object already names the kustomization's namespace, so the
	// files applied one by one and kubectl apply -k give the same objects.
	var want []string
	for _, u := range install(t) {
		if ns := u.GetNamespace(); ns != "" && ns != namespace {
			t.Errorf("%s: namespace %q, want %q", identity(u), ns, namespace)
		}
		want = append(want, identity(u))
	}
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Log("kubectl not installed: kubectl kustomize not checked")
		return
	}
	out, err := exec.Command(kubectl, "kustomize", ".").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		t.Fatalf("kubectl kustomize: %v", err)
	}
	rendered, err := decodeAll(out)
	if err != nil {
		t.Fatalf("kubectl kustomize output: %v", err)
	}
	var got []string
	for _, u := range rendered {
		if u.GetKind() == "GatewayClass" {
			// Cluster-scoped, which kustomize cannot know of a CRD's kind: it sets
			// the kustomization's namespace, which the API server drops.
			u.SetNamespace("")
		}
		got = append(got, identity(u))
	}
	// kustomize orders by kind: compare as sets.
	slices.Sort(want)
	slices.Sort(got)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("kubectl kustomize renders other objects than the listed files (-files +kustomize):\n%s", diff)
	}
}

// TestManifestsAgree checks the cross-references between the manifests and the names
// the code uses: a renamed label, port or group breaks here, not in a cluster.
func TestManifestsAgree(t *testing.T) {
	objs := install(t)
	ds := find[appsv1.DaemonSet](t, objs, "DaemonSet", "portico-agent")
	pod := ds.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("agent pod has %d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	flags := map[string]string{}
	for _, a := range c.Args[1:] {
		k, v, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		flags[k] = v
	}
	if c.Args[0] != "agent" {
		t.Errorf("agent args start with %q, want the agent subcommand", c.Args[0])
	}

	// The group the DaemonSet serves exists, is a group, selects the agent pods, and
	// is the group the IngressClass names.
	gns, gname, ok := strings.Cut(flags["group"], "/")
	if !ok {
		t.Fatalf("--group=%q is not namespace/name", flags["group"])
	}
	svc := find[corev1.Service](t, objs, "Service", gname)
	if svc.Namespace != gns || !controlplane.IsGroup(svc) {
		t.Errorf("--group=%s: Service %s/%s is not a Portico group (labels %v)", flags["group"], svc.Namespace, svc.Name, svc.Labels)
	}
	for k, v := range svc.Spec.Selector {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("group Service selects %s=%s; the agent pods have %q", k, v, ds.Spec.Template.Labels[k])
		}
	}
	class := find[networkingv1.IngressClass](t, objs, "IngressClass", "portico")
	if class.Spec.Controller != v1alpha1.ControllerName {
		t.Errorf("IngressClass controller %q, want %q", class.Spec.Controller, v1alpha1.ControllerName)
	}
	if p := class.Spec.Parameters; p == nil || p.Kind != "Service" || p.Name != gname || p.Namespace == nil || *p.Namespace != gns {
		t.Errorf("IngressClass parameters %+v do not name the group %s", class.Spec.Parameters, flags["group"])
	}

	// Probes and the metrics address use the same port.
	if !strings.HasPrefix(flags["metrics-addr"], ":") {
		t.Errorf("--metrics-addr=%q: want :PORT (all addresses, so the kubelet's probes reach it)", flags["metrics-addr"])
	}
	var metricsPort int32
	for _, p := range c.Ports {
		if p.Name == "metrics" {
			metricsPort = p.ContainerPort
		}
	}
	if fmt.Sprint(":", metricsPort) != flags["metrics-addr"] {
		t.Errorf("port metrics is %d, --metrics-addr=%s", metricsPort, flags["metrics-addr"])
	}
	for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		want := map[string]string{"liveness": "/healthz", "readiness": "/readyz"}[name]
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != want || p.HTTPGet.Port.String() != "metrics" {
			t.Errorf("%s probe %+v, want GET %s on port metrics", name, p, want)
		}
	}
	for _, p := range strings.Split(flags["vip-pool"], ";") { // as cmd/portico parseAgentFlags
		if _, err := controlplane.ParsePool(strings.TrimSpace(p)); err != nil {
			t.Errorf("--vip-pool: %v", err)
		}
	}

	// The pod runs as the bound ServiceAccount, on edge nodes, with bpffs.
	if pod.ServiceAccountName != agentSA {
		t.Errorf("serviceAccountName %q, want %q", pod.ServiceAccountName, agentSA)
	}
	if pod.NodeSelector["portico.io/edge"] != "true" {
		t.Errorf("nodeSelector %v, want portico.io/edge=true", pod.NodeSelector)
	}
	if !pod.HostNetwork || pod.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("hostNetwork %v, dnsPolicy %s", pod.HostNetwork, pod.DNSPolicy)
	}
	bpffs := false
	for _, m := range c.VolumeMounts {
		if m.MountPath == "/sys/fs/bpf" && m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationBidirectional {
			bpffs = true
		}
	}
	if !bpffs {
		t.Error("/sys/fs/bpf is not mounted with Bidirectional propagation")
	}
	envs := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			envs[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	if diff := cmp.Diff(map[string]string{"NODE_NAME": "spec.nodeName", "POD_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name",
		"HOST_IP": "status.hostIP"}, envs); diff != "" {
		t.Errorf("downward API env (-want +got):\n%s", diff)
	}

	// Each role is bound to its ServiceAccount alone, and nothing else is bound.
	bound := map[string]string{}
	for _, s := range []subject{agentSubject, controllerSubject} {
		for _, r := range s.roles {
			bound[r] = s.name
		}
	}
	for _, kind := range []string{"ClusterRoleBinding", "RoleBinding"} {
		for _, u := range objs {
			if u.GetKind() != kind {
				continue
			}
			b := find[rbacv1.RoleBinding](t, objs, kind, u.GetName()) // same shape as ClusterRoleBinding
			if bound[b.RoleRef.Name] == "" {
				t.Errorf("%s %s binds %s, which is no subject's role", kind, b.Name, b.RoleRef.Name)
			}
			want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: bound[b.RoleRef.Name], Namespace: namespace}}
			if diff := cmp.Diff(want, b.Subjects); diff != "" {
				t.Errorf("%s %s subjects (-want +got):\n%s", kind, b.Name, diff)
			}
		}
	}
	// The CRD is the resource the code watches.
	crdName := v1alpha1.IngressClaimResource.Resource + "." + v1alpha1.IngressClaimResource.Group
	if !slices.ContainsFunc(objs, func(u *unstructured.Unstructured) bool {
		return u.GetKind() == "CustomResourceDefinition" && u.GetName() == crdName
	}) {
		t.Errorf("no CustomResourceDefinition %s (v1alpha1.IngressClaimResource) in the kustomization", crdName)
	}
}

// TestKindCluster checks the shape of kind/cluster.yaml (kind itself cannot run here:
// no Docker engine): one control plane, three workers the agent DaemonSet selects.
func TestKindCluster(t *testing.T) {
	data, err := os.ReadFile("kind/cluster.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Kind       string `json:"kind"`
		APIVersion string `json:"apiVersion"`
		Name       string `json:"name"`
		Nodes      []struct {
			Role   string            `json:"role"`
			Labels map[string]string `json:"labels"`
		} `json:"nodes"`
	}
	if err := sigsyaml.UnmarshalStrict(data, &cfg); err != nil {
		t.Fatalf("parse kind/cluster.yaml: %v", err)
	}
	if cfg.Kind != "Cluster" || cfg.APIVersion != "kind.x-k8s.io/v1alpha4" {
		t.Errorf("kind %q apiVersion %q, want a kind.x-k8s.io/v1alpha4 Cluster", cfg.Kind, cfg.APIVersion)
	}
	ds := find[appsv1.DaemonSet](t, install(t), "DaemonSet", "portico-agent")
	roles := map[string]int{}
	for i, n := range cfg.Nodes {
		roles[n.Role]++
		if n.Role != "worker" {
			continue
		}
		for k, v := range ds.Spec.Template.Spec.NodeSelector {
			if n.Labels[k] != v {
				t.Errorf("worker %d lacks the agent's node selector label %s=%s", i, k, v)
			}
		}
	}
	if diff := cmp.Diff(map[string]int{"control-plane": 1, "worker": 3}, roles); diff != "" {
		t.Errorf("node roles (-want +got):\n%s", diff)
	}
}

// goTool is the go command of the running toolchain.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(goruntime.GOROOT(), "bin", "go")
}

// chartAgentDefaults are the flags the chart passes with the agent's own defaults
// (values.yaml vrrp, liveness and xdpMode): TestAgentFlags keeps the two equal.
var chartAgentDefaults = []string{"vrrp-priority", "vrrp-degraded-priority", "vrrp-version", "vrrp-interval",
	"liveness-port", "liveness-interval", "liveness-dead-after", "liveness-rise", "liveness-reload-grace", "xdp-mode"}

// TestAgentFlags builds the portico binary and checks that every flag the DaemonSet
// passes to `portico agent` is one the agent defines (its -h output), and that the
// chart's defaults for chartAgentDefaults are the agent's.
func TestAgentFlags(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "portico")
	if out, err := exec.Command(goTool(), "build", "-o", bin, "../cmd/portico").CombinedOutput(); err != nil {
		t.Fatalf("build cmd/portico: %v\n%s", err, out)
	}
	// -h prints the flags and exits non-zero: "  -name type" lines, each followed by
	// its usage, which ends in "(default value)" when the default is not the zero value.
	usage, _ := exec.Command(bin, "agent", "-h").CombinedOutput()
	defined := map[string]bool{}
	defaults := map[string]string{}
	var last string
	for _, line := range strings.Split(string(usage), "\n") {
		if name, ok := strings.CutPrefix(line, "  -"); ok {
			last = strings.Fields(name)[0]
			defined[last] = true
		} else if i := strings.LastIndex(line, "(default "); i >= 0 && last != "" {
			defaults[last] = strings.Trim(strings.TrimSuffix(line[i+len("(default "):], ")"), `"`)
		}
	}
	if len(defined) == 0 {
		t.Fatalf("no flags in `portico agent -h`:\n%s", usage)
	}
	ds := find[appsv1.DaemonSet](t, install(t), "DaemonSet", "portico-agent")
	passed := map[string]string{}
	for _, a := range ds.Spec.Template.Spec.Containers[0].Args[1:] {
		name, value, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		passed[name] = value
		if !defined[name] {
			t.Errorf("agent.yaml passes %s; `portico agent` has no flag -%s", a, name)
		}
	}
	for _, name := range chartAgentDefaults {
		if passed[name] != defaults[name] {
			t.Errorf("agent.yaml passes --%s=%s; the agent's default is %q: keep values.yaml's default equal to it",
				name, passed[name], defaults[name])
		}
	}
}
