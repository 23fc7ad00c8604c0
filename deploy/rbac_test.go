package deploy_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
)

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
	{grant{"", "gateway.networking.k8s.io", "gatewayclasses/status", "update", ""}, "gatewaystatus.go writeGatewayStatus: UpdateStatus"},
	{grant{"", "gateway.networking.k8s.io", "gateways/status", "update", ""}, "gatewaystatus.go writeGatewayStatus: UpdateStatus"},
	{grant{"", "gateway.networking.k8s.io", "httproutes/status", "update", ""}, "gatewaystatus.go writeGatewayStatus: UpdateStatus"},
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
// (read, for its VRRP peers); in BGP mode the BGPPeers, BFDProfiles and
// Secrets of its namespace, and Events there on the BGPPeers it refuses.
var agentNeeds = append(slices.Clone(informerNeeds), []need{
	{grant{namespace, "coordination.k8s.io", "leases", "create", ""}, "agent/lease Write"},
	{grant{namespace, "coordination.k8s.io", "leases", "get", ""}, "agent/lease Write"},
	{grant{namespace, "coordination.k8s.io", "leases", "update", ""}, "agent/lease Write"},
	{grant{namespace, "coordination.k8s.io", "leases", "list", ""}, "agent/vrrppeers.go followPeers: status Lease informer"},
	{grant{namespace, "coordination.k8s.io", "leases", "watch", ""}, "agent/vrrppeers.go followPeers: status Lease informer"},
	{grant{namespace, "apps", "daemonsets", "list", ""}, "agent/owner.go watchOwner: DaemonSet informer (its own DaemonSet deleted: uninstall)"},
	{grant{namespace, "apps", "daemonsets", "watch", ""}, "agent/owner.go watchOwner: DaemonSet informer (its own DaemonSet deleted: uninstall)"},
	{grant{namespace, "portico.io", "bgppeers", "list", ""}, "agent/bgppeers.go peerObjects.run: BGPPeer informer"},
	{grant{namespace, "portico.io", "bgppeers", "watch", ""}, "agent/bgppeers.go peerObjects.run: BGPPeer informer"},
	{grant{namespace, "portico.io", "bfdprofiles", "list", ""}, "agent/bgppeers.go peerObjects.run: BFDProfile informer"},
	{grant{namespace, "portico.io", "bfdprofiles", "watch", ""}, "agent/bgppeers.go peerObjects.run: BFDProfile informer"},
	{grant{namespace, "", "secrets", "list", ""}, "agent/bgppeers.go peerObjects.run: Secret informer (BGPPeers' passwordSecret)"},
	{grant{namespace, "", "secrets", "watch", ""}, "agent/bgppeers.go peerObjects.run: Secret informer (BGPPeers' passwordSecret)"},
	{grant{namespace, "", "events", "create", ""}, "agent/bgppeers.go peerObjects.run: record.EventBroadcaster (a refused BGPPeer)"},
	{grant{namespace, "", "events", "patch", ""}, "agent/bgppeers.go peerObjects.run: record.EventBroadcaster (repeated Event)"},
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
	{grant{"", "gateway.networking.k8s.io", "gatewayclasses", "list", ""}, "informers.go watchGateways: dynamic informer"},
	{grant{"", "gateway.networking.k8s.io", "gatewayclasses", "watch", ""}, "informers.go watchGateways: dynamic informer"},
	{grant{"", "gateway.networking.k8s.io", "gateways", "list", ""}, "informers.go watchGateways: dynamic informer"},
	{grant{"", "gateway.networking.k8s.io", "gateways", "watch", ""}, "informers.go watchGateways: dynamic informer"},
	{grant{"", "gateway.networking.k8s.io", "httproutes", "list", ""}, "informers.go watchGateways: dynamic informer"},
	{grant{"", "gateway.networking.k8s.io", "httproutes", "watch", ""}, "informers.go watchGateways: dynamic informer"},
	{grant{"", "gateway.networking.k8s.io", "referencegrants", "list", ""}, "informers.go watchGateways: dynamic informer"},
	{grant{"", "gateway.networking.k8s.io", "referencegrants", "watch", ""}, "informers.go watchGateways: dynamic informer"},
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
	{"tenant-a", "portico.io", "bgppeers", "list", ""},
	{namespace, "portico.io", "bgppeers", "update", "x"},
	{namespace, "portico.io", "bfdprofiles", "delete", "x"},
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

// rbacGrants expands the ClusterRoles and Roles of s into grants. A ClusterRole
// that only RoleBindings bind grants in their namespaces alone.
func rbacGrants(t *testing.T, objs []*unstructured.Unstructured, s subject) []grant {
	t.Helper()
	var out []grant
	for _, u := range objs {
		if u.GetKind() != "ClusterRole" && u.GetKind() != "Role" || !slices.Contains(s.roles, u.GetName()) {
			continue
		}
		r := find[rbacv1.Role](t, objs, u.GetKind(), u.GetName()) // same shape as ClusterRole
		nss := []string{""}
		if u.GetKind() == "Role" {
			nss = []string{u.GetNamespace()}
		} else if bound := roleBindingNamespaces(t, objs, u.GetName()); len(bound) > 0 {
			nss = bound
		}
		for _, ns := range nss {
			out = append(out, ruleGrants(t, u, r.Rules, ns)...)
		}
	}
	return out
}

// roleBindingNamespaces are the namespaces of the RoleBindings that bind
// ClusterRole name, none if a ClusterRoleBinding binds it.
func roleBindingNamespaces(t *testing.T, objs []*unstructured.Unstructured, name string) []string {
	t.Helper()
	var nss []string
	for _, u := range objs {
		if u.GetKind() != "ClusterRoleBinding" && u.GetKind() != "RoleBinding" {
			continue
		}
		b := find[rbacv1.RoleBinding](t, objs, u.GetKind(), u.GetName()) // same shape as ClusterRoleBinding
		if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != name {
			continue
		}
		if u.GetKind() == "ClusterRoleBinding" {
			return nil
		}
		nss = append(nss, u.GetNamespace())
	}
	return nss
}

// ruleGrants expands the rules of role u into grants in namespace ns ("":
// cluster-wide).
func ruleGrants(t *testing.T, u *unstructured.Unstructured, rules []rbacv1.PolicyRule, ns string) []grant {
	t.Helper()
	var out []grant
	for _, rule := range rules {
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
