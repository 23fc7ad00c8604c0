package deploy_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/kubernetes"
)

// TestAPIServer applies every manifest under deploy/ to a real kube-apiserver, then
// checks the agent pod is admitted, dry-runs the Helm chart, and that the agent's RBAC is exactly what the
// control plane calls: enough for the real controller running as the ServiceAccount,
// and refused for the rest.
func TestAPIServer(t *testing.T) {
	srv := startAPIServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 80*time.Second)
	defer cancel()
	cs := kubernetes.NewForConfigOrDie(srv.Config)

	objs := install(t)
	all := slices.Clone(objs)
	for f := range notInKustomization {
		all = append(all, decodeFile(t, f)...)
	}
	a := newApplier(srv.Config)
	a.applyAll(t, ctx, all)
	// A second apply succeeds too (kubectl apply -k is re-run on upgrades).
	a.applyAll(t, ctx, all)

	t.Run("agent pod admitted", func(t *testing.T) { testAgentPod(t, ctx, cs) })
	t.Run("controller pod admitted under Pod Security restricted", func(t *testing.T) { testControllerPod(t, ctx, cs) })
	t.Run("helm chart, server-side dry run", func(t *testing.T) { testChartDryRun(t, ctx, srv, a) })
	t.Run("rbac is what the code calls", func(t *testing.T) {
		for _, sn := range []struct {
			subject
			needs []need
		}{{agentSubject, agentNeeds}, {controllerSubject, controllerNeeds}} {
			s := sn.subject
			var want []grant
			for _, n := range sn.needs {
				want = append(want, n.grant)
			}
			if diff := cmp.Diff(sortedStrings(want), sortedStrings(rbacGrants(t, objs, s))); diff != "" {
				t.Errorf("rbac.yaml grants %s other permissions than the code's calls (-code +rbac.yaml):\n%s", s.name, diff)
			}
		}
	})
	t.Run("access reviews", func(t *testing.T) {
		testAccessReviews(t, ctx, cs, agentSubject, agentNeeds, append(slices.Clone(mustDeny), agentMustDeny...))
		testAccessReviews(t, ctx, cs, controllerSubject, controllerNeeds, mustDeny)
	})
	t.Run("agent status lease", func(t *testing.T) { testStatusLease(t, ctx, srv.Config) })
	t.Run("agent reads its node's interface", func(t *testing.T) { testNodeIface(t, ctx, srv.Config, cs) })
	// The controller runs twice: with client-go's default informers (a streaming list:
	// one watch with sendInitialEvents) and with WatchListClient off (list, then
	// watch), the fallback for API servers without streaming lists.
	setupTenant(t, ctx, cs)
	t.Run("read-only control plane as the agent", func(t *testing.T) { testReadOnlyAsAgent(t, ctx, srv.Config) })
	t.Run("controller", func(t *testing.T) { testController(t, ctx, srv.Config, cs, "deploy-test-1", true) })
	t.Run("controller, list then watch", func(t *testing.T) {
		// Informers read the gate when they are made (client-go logs that the gates
		// were replaced after use; harmless here, the first controller has stopped).
		prev := clientfeatures.FeatureGates()
		clientfeatures.ReplaceFeatureGates(withoutWatchList{prev})
		defer clientfeatures.ReplaceFeatureGates(prev)
		for _, u := range decodeFile(t, "examples/ingressclaim.yaml") { // reclaimed by the first run
			if err := a.apply(ctx, u); err != nil {
				t.Fatal(err)
			}
		}
		testController(t, ctx, srv.Config, cs, "deploy-test-2", false)
	})
}

// testAgentPod dry-runs a Pod made from the DaemonSet's template (no controller makes
// one here), so admission sees what a node would get.
func testAgentPod(t *testing.T, ctx context.Context, cs kubernetes.Interface) {
	ds, err := cs.AppsV1().DaemonSets(namespace).Get(ctx, "portico-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	podIn := func(ns string, spec corev1.PodSpec) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "portico-agent-dry-run", Namespace: ns, Labels: ds.Spec.Template.Labels},
			Spec:       spec,
		}
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	pod, err := cs.CoreV1().Pods(namespace).Create(ctx, podIn(namespace, ds.Spec.Template.Spec), dry)
	if err != nil {
		t.Fatalf("agent pod refused in %s: %v", namespace, err)
	}
	if pod.Spec.Priority == nil || *pod.Spec.Priority < 2_000_000_000 {
		t.Errorf("agent pod priority %v: system-node-critical not resolved", pod.Spec.Priority)
	}

	// Under Pod Security "baseline" the same pod is refused: the namespace's
	// "privileged" label is what admits it.
	strict := podSecurityNamespace(t, ctx, cs, "baseline", agentSA)
	_, err = cs.CoreV1().Pods(strict.Name).Create(ctx, podIn(strict.Name, ds.Spec.Template.Spec), dry)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "PodSecurity") {
		t.Errorf("agent pod under Pod Security baseline: got %v, want a PodSecurity refusal", err)
	}

	// The other way to set the DSR sysctls, pod-level sysctls, is refused with
	// hostNetwork.
	spec := *ds.Spec.Template.Spec.DeepCopy()
	spec.SecurityContext = &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "net.ipv4.conf.all.arp_ignore", Value: "1"}}}
	_, err = cs.CoreV1().Pods(namespace).Create(ctx, podIn(namespace, spec), dry)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "hostNetwork") {
		t.Errorf("agent pod with a pod-level net sysctl: got %v, want invalid with hostNetwork", err)
	}

	// The reason agent.yaml gives for privileged: without it the API server refuses
	// the Bidirectional bpffs mount, even with the capabilities the agent uses.
	spec = *ds.Spec.Template.Spec.DeepCopy()
	spec.Containers[0].SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{
		Add: []corev1.Capability{"BPF", "NET_ADMIN", "NET_RAW", "SYS_ADMIN", "SYS_RESOURCE"}}}
	_, err = cs.CoreV1().Pods(namespace).Create(ctx, podIn(namespace, spec), dry)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "Bidirectional") {
		t.Errorf("unprivileged agent pod with a Bidirectional mount: got %v, want invalid", err)
	}
}

// podSecurityNamespace makes a namespace that enforces Pod Security level, with
// the ServiceAccount sa.
func podSecurityNamespace(t *testing.T, ctx context.Context, cs kubernetes.Interface, level, sa string) *corev1.Namespace {
	t.Helper()
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		GenerateName: level + "-", Labels: map[string]string{"pod-security.kubernetes.io/enforce": level}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(ns.Name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return ns
}

// testControllerPod dry-runs a Pod made from the controller Deployment's template
// in a namespace that enforces Pod Security "restricted": the controller, which
// makes the cluster-wide writes, needs no privilege at all.
func testControllerPod(t *testing.T, ctx context.Context, cs kubernetes.Interface) {
	d, err := cs.AppsV1().Deployments(namespace).Get(ctx, "portico-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	strict := podSecurityNamespace(t, ctx, cs, "restricted", controllerSA)
	spec := *d.Spec.Template.Spec.DeepCopy()
	spec.PriorityClassName = "" // system-node-critical is for kube-system and the agents' namespace
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "portico-controller-dry-run", Namespace: strict.Name, Labels: d.Spec.Template.Labels}, Spec: spec}
	if _, err := cs.CoreV1().Pods(strict.Name).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("controller pod under Pod Security restricted: %v", err)
	}
	if labels := d.Spec.Template.Labels; labels["app.kubernetes.io/name"] == "portico-agent" {
		t.Errorf("controller pod labels %v: the group Service would select it as a replica", labels)
	}
}

// withoutWatchList turns client-go's WatchListClient feature off.
type withoutWatchList struct{ clientfeatures.Gates }

func (g withoutWatchList) Enabled(f clientfeatures.Feature) bool {
	return f != clientfeatures.WatchListClient && g.Gates.Enabled(f)
}

// setupTenant makes an L4 Service (LoadBalancer, class portico.io/vip) in another
// namespace, served by the edge group: its VIP annotation and status.loadBalancer
// are written cluster-wide.
func setupTenant(t *testing.T, ctx context.Context, cs kubernetes.Interface) {
	t.Helper()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tenant-a"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	lbClass := "portico.io/vip"
	if _, err := cs.CoreV1().Services("tenant-a").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "lb", Annotations: map[string]string{"portico.io/group": namespace + "/edge"}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: &lbClass,
			Ports: []corev1.ServicePort{{Name: "pg", Port: 5432, TargetPort: intstr.FromInt32(5432)}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
