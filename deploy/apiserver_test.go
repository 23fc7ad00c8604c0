package deploy_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/portico-edge/portico/agent/lease"
	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane"
	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/kapi"
	"github.com/portico-edge/portico/test/testenv"
)

// startAPIServer launches a real kube-apiserver configured like a cluster's:
// --allow-privileged=true (kube-apiserver's default is false; kubeadm, kind and the
// managed distributions set it, as kube-proxy and CNI pods need it), and the
// OwnerReferencesPermissionEnforcement admission plugin on (off by default, on in some
// distributions), so the RBAC a blockOwnerDeletion ownerReference needs is checked too.
// It skips like kapi.Shared.Get.
func startAPIServer(t *testing.T) *kapi.Server {
	t.Helper()
	kapi.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := kapi.Launch(ctx, kapi.Options{ExtraArgs: []string{
		"--allow-privileged=true", "--enable-admission-plugins=OwnerReferencesPermissionEnforcement"}})
	if err != nil {
		t.Fatalf("start kube-apiserver: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("stop kube-apiserver: %v", err)
		}
	})
	return srv
}

// applier server-side applies objects through the dynamic client, finding each
// object's resource through discovery.
type applier struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func newApplier(cfg *rest.Config) *applier {
	return &applier{
		dyn:    dynamic.NewForConfigOrDie(cfg),
		mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cfg))),
	}
}

func (a *applier) resource(u *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := u.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", gvk, err)
	}
	if m.Scope.Name() != meta.RESTScopeNameNamespace {
		if u.GetNamespace() != "" {
			return nil, fmt.Errorf("%s is cluster-scoped but names namespace %s", identity(u), u.GetNamespace())
		}
		return a.dyn.Resource(m.Resource), nil
	}
	if u.GetNamespace() == "" {
		u.SetNamespace(namespace) // what kustomize's namespace field does
	}
	return a.dyn.Resource(m.Resource).Namespace(u.GetNamespace()), nil
}

func (a *applier) apply(ctx context.Context, u *unstructured.Unstructured) error {
	ri, err := a.resource(u)
	if err != nil {
		return err
	}
	if _, err := ri.Apply(ctx, u.GetName(), u, metav1.ApplyOptions{FieldManager: "portico-deploy-test", Force: true}); err != nil {
		return fmt.Errorf("apply %s: %w", identity(u), err)
	}
	return nil
}

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// applyAll applies CRDs first and waits until each is Established, then Namespaces,
// then the rest in file order.
func (a *applier) applyAll(t *testing.T, ctx context.Context, objs []*unstructured.Unstructured) {
	t.Helper()
	rank := func(u *unstructured.Unstructured) int {
		switch u.GetKind() {
		case "CustomResourceDefinition":
			return 0
		case "Namespace":
			return 1
		}
		return 2
	}
	ordered := slices.Clone(objs)
	slices.SortStableFunc(ordered, func(x, y *unstructured.Unstructured) int { return rank(x) - rank(y) })
	crdsDone := false
	for _, u := range ordered {
		if rank(u) > 0 && !crdsDone {
			a.waitEstablished(t, ctx, objs)
			a.mapper.Reset() // discover the new resources
			crdsDone = true
		}
		if err := a.apply(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
}

func (a *applier) waitEstablished(t *testing.T, ctx context.Context, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, u := range objs {
		if u.GetKind() != "CustomResourceDefinition" {
			continue
		}
		testenv.Eventually(t, 20*time.Second, func() string {
			crd, err := a.dyn.Resource(crdResource).Get(ctx, u.GetName(), metav1.GetOptions{})
			if err != nil {
				return err.Error()
			}
			conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
			for _, c := range conds {
				if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
					return ""
				}
			}
			return "CRD " + u.GetName() + " not established"
		})
	}
}

// grant is one (namespace or cluster-wide, group, resource, verb, name) permission.
type grant struct {
	Namespace string // "" for a ClusterRole
	Group     string
	Resource  string // with "/subresource"
	Verb      string
	Name      string // "" for any
}

func (g grant) String() string {
	s := fmt.Sprintf("%s %s.%s", g.Verb, g.Resource, g.Group)
	if g.Name != "" {
		s += " named " + g.Name
	}
	if g.Namespace != "" {
		s += " in " + g.Namespace
	}
	return s
}

// need is one permission the code uses, and the call that uses it.
type need struct {
	grant
	why string
}

// controllerNeeds is what the writing control plane (controlplane/*.go, run by
// portico controller) calls, read from the code (file: call), kept in one table so
// a rule added to or dropped from rbac.yaml without a reason fails here. The
// controller run below proves it is enough; the access reviews prove the rest is
// refused.
var controllerNeeds = append(slices.Clone(informerNeeds), []need{
	{grant{"", "networking.k8s.io", "ingresses", "patch", ""}, "annotations.go patchAnnotation: portico.io/group"},
	{grant{"", "networking.k8s.io", "ingresses/status", "update", ""}, "leader.go write: Ingresses().UpdateStatus"},
	{grant{"", "", "services", "patch", ""}, "annotations.go patchAnnotation: portico.io/vip, portico.io/vrid"},
	{grant{"", "", "services", "create", ""}, "claim.go reconcileClaim: Services().Create"},
	{grant{"", "", "services", "get", ""}, "claim.go reclaim: Services().Get"},
	{grant{"", "", "services", "delete", ""}, "claim.go reclaim: Services().Delete"},
	{grant{"", "", "services/status", "update", ""}, "leader.go write: Services().UpdateStatus"},
	{grant{"", "", "events", "create", ""}, "controller.go Run: record.EventBroadcaster (new Event)"},
	{grant{"", "", "events", "patch", ""}, "controller.go Run: record.EventBroadcaster (repeated Event)"},
	{grant{"", "portico.io", "ingressclaims", "list", ""}, "informers.go watchClaims: dynamic informer"},
	{grant{"", "portico.io", "ingressclaims", "watch", ""}, "informers.go watchClaims: dynamic informer"},
	{grant{"", "portico.io", "ingressclaims", "delete", ""}, "claim.go reclaim: Delete"},
	{grant{"", "portico.io", "ingressclaims/status", "patch", ""}, "claim.go writeClaimStatus: Patch status"},
	{grant{"", "portico.io", "ingressclaims/finalizers", "update", ""}, "claim.go ownerRef: blockOwnerDeletion (OwnerReferencesPermissionEnforcement)"},
	{grant{"", "apps", "daemonsets", "get", ""}, "claim.go reconcileClaim, reclaim: DaemonSets().Get"},
	{grant{"", "apps", "daemonsets", "create", ""}, "claim.go reconcileClaim: DaemonSets().Create"},
	{grant{"", "apps", "daemonsets", "delete", ""}, "claim.go reclaim: DaemonSets().Delete"},
	{grant{namespace, "coordination.k8s.io", "leases", "create", ""}, "leader.go elect: LeaseLock.Create"},
	{grant{namespace, "coordination.k8s.io", "leases", "get", ""}, "leader.go elect: LeaseLock.Get"},
	{grant{namespace, "coordination.k8s.io", "leases", "update", ""}, "leader.go elect: LeaseLock.Update"},
	{grant{namespace, "coordination.k8s.io", "leases", "list", ""}, "served.go watchAgents: status Lease informer"},
	{grant{namespace, "coordination.k8s.io", "leases", "watch", ""}, "served.go watchAgents: status Lease informer"},
}...)

// agentNeeds is what an edge's agent calls: its read-only control plane's
// informers (controlplane.Config.ReadOnly: no claims, no Events, no Lease
// election, no served-status informer), its own status Lease, and the others'
// (read, for its VRRP peers).
var agentNeeds = append(slices.Clone(informerNeeds), []need{
	{grant{namespace, "coordination.k8s.io", "leases", "create", ""}, "agent/lease Write"},
	{grant{namespace, "coordination.k8s.io", "leases", "get", ""}, "agent/lease Write"},
	{grant{namespace, "coordination.k8s.io", "leases", "update", ""}, "agent/lease Write"},
	{grant{namespace, "coordination.k8s.io", "leases", "list", ""}, "agent/vrrppeers.go followPeers: status Lease informer"},
	{grant{namespace, "coordination.k8s.io", "leases", "watch", ""}, "agent/vrrppeers.go followPeers: status Lease informer"},
}...)

// informerNeeds are the control plane's informers, the agents' and the
// controller's alike (informers.go watchCluster, watchPools).
var informerNeeds = []need{
	{grant{"", "networking.k8s.io", "ingressclasses", "list", ""}, "informers.go watchCluster: IngressClass informer"},
	{grant{"", "networking.k8s.io", "ingressclasses", "watch", ""}, "informers.go watchCluster: IngressClass informer"},
	{grant{"", "networking.k8s.io", "ingresses", "list", ""}, "informers.go watchCluster: Ingress informer"},
	{grant{"", "networking.k8s.io", "ingresses", "watch", ""}, "informers.go watchCluster: Ingress informer"},
	{grant{"", "", "services", "list", ""}, "informers.go watchCluster: Service informer"},
	{grant{"", "", "services", "watch", ""}, "informers.go watchCluster: Service informer"},
	{grant{"", "discovery.k8s.io", "endpointslices", "list", ""}, "informers.go watchCluster: EndpointSlice informer"},
	{grant{"", "discovery.k8s.io", "endpointslices", "watch", ""}, "informers.go watchCluster: EndpointSlice informer"},
	{grant{"", "", "nodes", "list", ""}, "informers.go watchCluster: Node informer"},
	{grant{"", "", "nodes", "watch", ""}, "informers.go watchCluster: Node informer"},
	{grant{"", "", "secrets", "list", ""}, "informers.go watchCluster: TLS Secret informer"},
	{grant{"", "", "secrets", "watch", ""}, "informers.go watchCluster: TLS Secret informer"},
	{grant{"", "", "pods", "list", ""}, "informers.go watchCluster: microservice Pod informer"},
	{grant{"", "", "pods", "watch", ""}, "informers.go watchCluster: microservice Pod informer"},
	{grant{"", "portico.io", "vippools", "list", ""}, "informers.go watchPools: dynamic informer"},
	{grant{"", "portico.io", "vippools", "watch", ""}, "informers.go watchPools: dynamic informer"},
	{grant{"", "", "namespaces", "list", ""}, "informers.go watchPools: Namespace informer"},
	{grant{"", "", "namespaces", "watch", ""}, "informers.go watchPools: Namespace informer"},
}

// agentMustDeny are what the controller may do and an agent may not: every
// cluster-wide write (so one compromised edge is not the whole cluster), and
// every read the agent never makes.
var agentMustDeny = []grant{
	{"tenant-a", "apps", "daemonsets", "create", ""},
	{"tenant-a", "apps", "daemonsets", "delete", ""},
	{"tenant-a", "apps", "daemonsets", "get", "x"},
	{"tenant-a", "", "services", "delete", "x"},
	{"tenant-a", "", "services", "create", ""},
	{"tenant-a", "", "services", "patch", "x"},
	{"tenant-a", "", "services", "get", "x"},
	{"tenant-a", "", "services/status", "update", "x"},
	{"tenant-a", "networking.k8s.io", "ingresses", "patch", "x"},
	{"tenant-a", "networking.k8s.io", "ingresses/status", "update", "x"},
	{"tenant-a", "", "events", "create", ""},
	{"tenant-a", "portico.io", "ingressclaims", "list", ""},
	{"tenant-a", "portico.io", "ingressclaims", "delete", "x"},
	{"tenant-a", "portico.io", "ingressclaims/status", "patch", "x"},
	{"tenant-a", "coordination.k8s.io", "leases", "list", ""},
	{namespace, "coordination.k8s.io", "leases", "delete", "x"},
}

// mustDeny are things neither the agent nor the controller may do (sample checks
// of what the code never calls, several of them close to what it does call).
var mustDeny = []grant{
	{"", "", "nodes", "delete", ""},
	{"", "", "nodes", "update", ""},
	{"", "", "nodes", "patch", ""},
	{"", "", "nodes", "get", "node-1"},
	{"tenant-a", "", "secrets", "get", "db-password"},
	{"tenant-a", "", "secrets", "create", ""},
	{"tenant-a", "", "secrets", "update", ""},
	{"tenant-a", "", "secrets", "delete", ""},
	{"tenant-a", "", "configmaps", "get", ""},
	{"tenant-a", "", "configmaps", "list", ""},
	{"tenant-a", "", "pods", "create", ""},
	{"tenant-a", "", "pods", "delete", ""},
	{"tenant-a", "", "pods", "get", "p"},
	{"tenant-a", "", "pods/exec", "create", ""},
	{"tenant-a", "", "serviceaccounts/token", "create", ""},
	{"tenant-a", "", "services", "update", ""},
	{"tenant-a", "", "endpoints", "list", ""},
	{"tenant-a", "discovery.k8s.io", "endpointslices", "create", ""},
	{"tenant-a", "discovery.k8s.io", "endpointslices", "update", ""},
	{"tenant-a", "networking.k8s.io", "ingresses", "create", ""},
	{"tenant-a", "networking.k8s.io", "ingresses", "update", ""},
	{"tenant-a", "networking.k8s.io", "ingresses", "delete", ""},
	{"tenant-a", "networking.k8s.io", "ingresses", "get", "web"},
	{"", "networking.k8s.io", "ingressclasses", "create", ""},
	{"", "portico.io", "vippools", "create", ""},
	{"", "portico.io", "vippools", "update", ""},
	{"", "portico.io", "vippools", "delete", ""},
	{"", "", "namespaces", "update", ""},
	{"", "", "namespaces", "delete", ""},
	{"", "networking.k8s.io", "ingressclasses", "delete", ""},
	{"tenant-a", "apps", "daemonsets", "update", ""},
	{"tenant-a", "apps", "daemonsets", "patch", ""},
	{"tenant-a", "apps", "daemonsets", "list", ""},
	{"tenant-a", "apps", "deployments", "create", ""},
	{"tenant-a", "portico.io", "ingressclaims", "create", ""},
	{"tenant-a", "portico.io", "ingressclaims", "update", ""},
	{"tenant-a", "portico.io", "ingressclaims", "patch", ""},
	{"tenant-a", "", "events", "delete", ""},
	{"kube-system", "coordination.k8s.io", "leases", "create", ""},
	{"kube-system", "coordination.k8s.io", "leases", "update", "kube-controller-manager"},
	{namespace, "coordination.k8s.io", "leases", "delete", leaseName},
	{"", "rbac.authorization.k8s.io", "clusterroles", "escalate", ""},
	{"", "rbac.authorization.k8s.io", "clusterrolebindings", "create", ""},
	{"tenant-a", "rbac.authorization.k8s.io", "rolebindings", "create", ""},
	{"", "", "users", "impersonate", ""},
	{"tenant-a", "", "serviceaccounts", "impersonate", ""},
	{"", "apiextensions.k8s.io", "customresourcedefinitions", "create", ""},
	{"", "", "namespaces", "delete", ""},
}

// clusterScoped are the resources of the tables above that have no namespace.
var clusterScoped = map[string]bool{"nodes": true, "ingressclasses": true, "namespaces": true, "users": true,
	"clusterroles": true, "clusterrolebindings": true, "customresourcedefinitions": true}

// rbacGrants expands the ClusterRoles and Roles of s into grants.
func rbacGrants(t *testing.T, objs []*unstructured.Unstructured, s subject) []grant {
	t.Helper()
	var out []grant
	for _, u := range objs {
		if u.GetKind() != "ClusterRole" && u.GetKind() != "Role" || !slices.Contains(s.roles, u.GetName()) {
			continue
		}
		r := find[rbacv1.Role](t, objs, u.GetKind(), u.GetName()) // same shape as ClusterRole
		ns := ""
		if u.GetKind() == "Role" {
			ns = u.GetNamespace()
		}
		for _, rule := range r.Rules {
			names := rule.ResourceNames
			if len(names) == 0 {
				names = []string{""}
			}
			if len(rule.NonResourceURLs) > 0 {
				t.Errorf("%s %s grants non-resource URLs %v", u.GetKind(), u.GetName(), rule.NonResourceURLs)
			}
			for _, g := range rule.APIGroups {
				for _, res := range rule.Resources {
					for _, v := range rule.Verbs {
						for _, n := range names {
							if g == "*" || res == "*" || v == "*" {
								t.Errorf("%s %s has a wildcard: %+v", u.GetKind(), u.GetName(), rule)
							}
							out = append(out, grant{ns, g, res, v, n})
						}
					}
				}
			}
		}
	}
	return out
}

func sortedStrings[T fmt.Stringer](xs []T) []string {
	out := make([]string, 0, len(xs))
	for _, x := range xs {
		out = append(out, x.String())
	}
	slices.Sort(out)
	return out
}

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

// testAccessReviews asks the API server's authorizer, for the ServiceAccount of s,
// about every grant the code needs (allowed) and every one of deny (refused), as
// `kubectl auth can-i` does (SubjectAccessReview).
func testAccessReviews(t *testing.T, ctx context.Context, cs kubernetes.Interface, s subject, needs []need, deny []grant) {
	review := func(g grant) bool {
		ns := g.Namespace
		if ns == "" && !clusterScoped[g.Resource] {
			ns = "tenant-a" // a cluster-wide grant must hold in any namespace
		}
		res, sub, _ := strings.Cut(g.Resource, "/")
		sar, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: s.user(), Groups: agentGroups,
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: ns, Group: g.Group, Resource: res, Subresource: sub, Verb: g.Verb, Name: g.Name},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("review %s: %v", g, err)
		}
		return sar.Status.Allowed
	}
	for _, n := range needs {
		g := n.grant
		if g.Name == "" && (g.Verb == "get" || g.Verb == "update" || g.Verb == "delete" || g.Verb == "patch") {
			g.Name = "x" // these verbs always name an object
		}
		if !review(g) {
			t.Errorf("%s may not %s (%s)", s.name, g, n.why)
		}
	}
	for _, g := range deny {
		if review(g) {
			t.Errorf("%s may %s; its code never does", s.name, g)
		}
	}
}

// requestLog records every request the API server refused with 403, and how the
// IngressClass informer started (a list, or a watch with sendInitialEvents).
type requestLog struct {
	mu                  sync.Mutex
	reqs                []string
	classLists, streams int
	writes              int      // requests other than GET (the selfsubjectreview aside)
	writeList           []string // the first few
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (l *requestLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(r)
		l.mu.Lock()
		defer l.mu.Unlock()
		if err == nil && resp.StatusCode == http.StatusForbidden {
			l.reqs = append(l.reqs, r.Method+" "+r.URL.RequestURI())
		}
		if r.Method != http.MethodGet && !strings.Contains(r.URL.Path, "selfsubjectreviews") {
			l.writes++
			if len(l.writeList) < 5 {
				l.writeList = append(l.writeList, r.Method+" "+r.URL.RequestURI())
			}
		}
		q := r.URL.Query()
		switch {
		case r.Method != http.MethodGet:
		case q.Get("watch") == "true" && q.Get("sendInitialEvents") == "true":
			l.streams++
		case q.Get("watch") == "" && strings.HasSuffix(r.URL.Path, "/ingressclasses"):
			l.classLists++
		}
		return resp, err
	})
}

func (l *requestLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.reqs)
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

// asAgent is admin's connection impersonating the agent's ServiceAccount, its requests
// logged.
func asAgent(admin *rest.Config, reqs *requestLog) *rest.Config {
	return as(admin, agentSubject, reqs)
}

// as is admin's connection impersonating s's ServiceAccount, its requests logged.
func as(admin *rest.Config, s subject, reqs *requestLog) *rest.Config {
	cfg := rest.CopyConfig(admin)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: s.user(), Groups: agentGroups}
	cfg.WrapTransport = reqs.wrap
	return cfg
}

// testStatusLease runs the agent's status-Lease writer (lease.Write:
// create, then renew) as the agent's ServiceAccount, and reads the result as an
// operator would (portico status); the agent itself never lists Leases.
func testStatusLease(t *testing.T, ctx context.Context, admin *rest.Config) {
	var reqs requestLog
	cs := kubernetes.NewForConfigOrDie(asAgent(admin, &reqs))
	for _, state := range []string{`{"node":"node-1"}`, `{"node":"node-1","healthy":true}`} {
		if err := lease.Write(ctx, cs, namespace, "node-1", []byte(state), 10*time.Second); err != nil {
			t.Fatalf("write the status Lease: %v", err)
		}
	}
	leases, err := lease.List(ctx, kubernetes.NewForConfigOrDie(admin), namespace)
	if err != nil {
		t.Fatalf("list status Leases: %v", err)
	}
	if len(leases) != 1 || leases[0].Node != "node-1" || leases[0].Stale || string(leases[0].State) != `{"node":"node-1","healthy":true}` {
		t.Errorf("status Leases = %+v, want node-1's renewed state", leases)
	}
	if bad := reqs.list(); len(bad) > 0 {
		t.Errorf("the API server refused the agent: %v", bad)
	}
}

// testController runs the real control plane with the controller
// ServiceAccount's identity (impersonation) over the applied manifests, drives
// every write path, and fails on any request the API server refuses.
func testController(t *testing.T, ctx context.Context, admin *rest.Config, cs kubernetes.Interface, identity string, streaming bool) {
	var reqs requestLog
	cfg := as(admin, controllerSubject, &reqs)
	whoami, err := kubernetes.NewForConfigOrDie(cfg).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if u := whoami.Status.UserInfo.Username; u != controllerSubject.user() {
		t.Fatalf("impersonation: the API server sees %q", u)
	}

	pool, err := controlplane.ParsePool("198.18.0.0/29")
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := controlplane.New(controlplane.Config{
		Client: kubernetes.NewForConfigOrDie(cfg), Dynamic: dynamic.NewForConfigOrDie(cfg),
		Logger: zaptest.NewLogger(t).Named("controlplane"), Registerer: prometheus.NewRegistry(),
		Pools: []controlplane.Pool{pool}, Identity: identity, ReleaseOnCancel: true,
		LeaseDuration: 4 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancelRun := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- ctl.Run(runCtx) }()
	var runErr error
	var once sync.Once
	stop := func() error {
		once.Do(func() {
			cancelRun()
			runErr = <-done
		})
		return runErr
	}
	defer stop()

	dyn := dynamic.NewForConfigOrDie(admin)
	claims := dyn.Resource(v1alpha1.IngressClaimResource).Namespace(namespace)
	annotation := func(obj metav1.Object, k string) string { return obj.GetAnnotations()[k] }
	testenv.Eventually(t, 30*time.Second, func() string {
		if bad := reqs.list(); len(bad) > 0 {
			t.Fatalf("the API server refused the controller: %v", bad)
		}
		lease, err := cs.CoordinationV1().Leases(namespace).Get(ctx, leaseName, metav1.GetOptions{})
		if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != identity {
			return fmt.Sprintf("lease not held (%v)", err)
		}
		web, err := cs.NetworkingV1().Ingresses(namespace).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if lb := web.Status.LoadBalancer.Ingress; len(lb) != 1 || lb[0].IP != "192.0.2.80" {
			return fmt.Sprintf("Ingress web status %+v, want the edge VIP", lb)
		}
		edge, err := cs.CoreV1().Services(namespace).Get(ctx, "edge", metav1.GetOptions{})
		if err != nil || annotation(edge, "portico.io/vrid") == "" {
			return fmt.Sprintf("group edge has no VRID (%v)", err)
		}
		lb, err := cs.CoreV1().Services("tenant-a").Get(ctx, "lb", metav1.GetOptions{})
		if err != nil || annotation(lb, "portico.io/vip") == "" || len(lb.Status.LoadBalancer.Ingress) == 0 ||
			lb.Status.LoadBalancer.Ingress[0].IP != annotation(lb, "portico.io/vip") {
			return fmt.Sprintf("L4 Service has no VIP in annotation and status (%v)", err)
		}
		claim, err := claims.Get(ctx, "shop", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if phase, _, _ := unstructured.NestedString(claim.Object, "status", "phase"); phase != v1alpha1.ClaimBound {
			return "claim shop phase " + phase
		}
		if _, err := cs.AppsV1().DaemonSets(namespace).Get(ctx, "shop", metav1.GetOptions{}); err != nil {
			return "claim DaemonSet: " + err.Error()
		}
		if _, err := cs.CoreV1().Services(namespace).Get(ctx, "shop", metav1.GetOptions{}); err != nil {
			return "claim Service: " + err.Error()
		}
		shop, err := cs.NetworkingV1().Ingresses(namespace).Get(ctx, "shop", metav1.GetOptions{})
		if err != nil || annotation(shop, "portico.io/group") != namespace+"/shop" {
			return fmt.Sprintf("Ingress shop not bound to the claim's group (%v)", err)
		}
		for _, ns := range []string{namespace, "tenant-a"} {
			evs, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return err.Error()
			}
			if !slices.ContainsFunc(evs.Items, func(e corev1.Event) bool { return e.Source.Component == "portico-controlplane" }) {
				return "no Event from the control plane in " + ns
			}
		}
		return ""
	})

	// Reclaim: with the claim's Ingress gone, reclaimPolicy Delete removes the
	// DaemonSet, the Service and the claim.
	if err := cs.NetworkingV1().Ingresses(namespace).Delete(ctx, "shop", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() string {
		if bad := reqs.list(); len(bad) > 0 {
			t.Fatalf("the API server refused the controller: %v", bad)
		}
		if _, err := claims.Get(ctx, "shop", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("claim still there (%v)", err)
		}
		if _, err := cs.AppsV1().DaemonSets(namespace).Get(ctx, "shop", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("claim DaemonSet still there (%v)", err)
		}
		if _, err := cs.CoreV1().Services(namespace).Get(ctx, "shop", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("claim Service still there (%v)", err)
		}
		return ""
	})

	// Shutdown releases the Lease (an update).
	if err := stop(); err != nil {
		t.Errorf("controller: %v", err)
	}
	lease, err := cs.CoordinationV1().Leases(namespace).Get(ctx, leaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := lease.Spec.HolderIdentity; h != nil && *h == identity {
		t.Errorf("Lease still held by %s after shutdown", *h)
	}
	if bad := reqs.list(); len(bad) > 0 {
		t.Errorf("the API server refused the controller: %v", bad)
	}
	reqs.mu.Lock()
	defer reqs.mu.Unlock()
	if streaming && reqs.streams == 0 || !streaming && reqs.classLists == 0 {
		t.Errorf("informers started with %d streaming watches and %d IngressClass lists; want the %s path",
			reqs.streams, reqs.classLists, map[bool]string{true: "streaming", false: "list"}[streaming])
	}
}

// snapshotSink keeps the last snapshot it was given.
type snapshotSink struct {
	mu   sync.Mutex
	last *model.Snapshot
}

func (s *snapshotSink) Name() string { return "test" }

func (s *snapshotSink) Apply(_ context.Context, snap model.Snapshot) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = &snap
	return nil
}

// testReadOnlyAsAgent runs the control plane as an edge's agent does
// (ReadOnly), as the agent's ServiceAccount: it builds the edge group's snapshot
// from the applied manifests with nothing refused, and writes nothing.
func testReadOnlyAsAgent(t *testing.T, ctx context.Context, admin *rest.Config) {
	var reqs requestLog
	cfg := asAgent(admin, &reqs)
	sink := &snapshotSink{}
	ctl, err := controlplane.New(controlplane.Config{
		Client: kubernetes.NewForConfigOrDie(cfg), Dynamic: dynamic.NewForConfigOrDie(cfg),
		Logger: zaptest.NewLogger(t).Named("agent"), Registerer: prometheus.NewRegistry(),
		Identity: "node-1", ReadOnly: true, Sinks: []controlplane.Sink{sink},
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- ctl.Run(runCtx) }()
	testenv.Eventually(t, 30*time.Second, func() string {
		if bad := reqs.list(); len(bad) > 0 {
			t.Fatalf("the API server refused the agent: %v", bad)
		}
		sink.mu.Lock()
		defer sink.mu.Unlock()
		if sink.last == nil {
			return "no snapshot yet"
		}
		for _, g := range sink.last.Groups {
			if g.Name == namespace+"/edge" {
				return ""
			}
		}
		return fmt.Sprintf("no group %s/edge in the snapshot (%d groups)", namespace, len(sink.last.Groups))
	})
	cancel()
	if err := <-done; err != nil {
		t.Errorf("read-only control plane: %v", err)
	}
	if bad := reqs.list(); len(bad) > 0 {
		t.Errorf("the API server refused the agent: %v", bad)
	}
	reqs.mu.Lock()
	defer reqs.mu.Unlock()
	if reqs.writes > 0 {
		t.Errorf("the read-only control plane made %d writes: %v", reqs.writes, reqs.writeList)
	}
}
