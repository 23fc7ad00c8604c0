package controlplane

import (
	"cmp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
)

// hostOwner is the namespace a host belongs to, which of its objects claimed it
// first, and the namespaces it lets route paths of it too.
type hostOwner struct {
	namespace, by string
	delegates     map[string]bool // "*": every namespace
}

// hostOwners gives every host (not the catch-all "") that the bound Ingresses
// and pod routes name to the namespace whose object claimed it first (the
// oldest, then by namespace and name, as every conflict is decided), as
// Contour and Gateway API do: another namespace's rules for it are refused
// unless an object of the owner's naming the host lists that namespace in
// portico.io/host-delegates. A tenant cannot add a path to another team's host.
func (b *builder) hostOwners(ings []*networkingv1.Ingress, pods []*corev1.Pod) map[string]*hostOwner {
	type claim struct {
		obj   metav1.Object
		kind  string
		hosts []string
	}
	var claims []claim
	for _, ing := range ings {
		c := claim{obj: ing, kind: "Ingress"}
		for _, r := range ing.Spec.Rules {
			c.hosts = append(c.hosts, strings.ToLower(r.Host))
		}
		claims = append(claims, c)
	}
	for _, pod := range pods {
		claims = append(claims, claim{obj: pod, kind: "Pod", hosts: splitList(strings.ToLower(pod.Annotations[v1alpha1.AnnotationTrafficHosts]))})
	}
	slices.SortStableFunc(claims, func(x, y claim) int { return cmp.Or(older(x.obj, y.obj), cmp.Compare(x.kind, y.kind)) })
	owners := map[string]*hostOwner{}
	for _, c := range claims {
		for _, h := range c.hosts {
			if h == "" {
				continue
			}
			o := owners[h]
			if o == nil {
				o = &hostOwner{namespace: c.obj.GetNamespace(), by: c.kind + " " + key(c.obj), delegates: map[string]bool{}}
				owners[h] = o
			}
			if o.namespace == c.obj.GetNamespace() {
				for _, ns := range splitList(c.obj.GetAnnotations()[v1alpha1.AnnotationHostDelegates]) {
					o.delegates[ns] = true
				}
			}
		}
	}
	return owners
}

// mayRoute reports whether namespace ns may route paths of host, and if not,
// who owns it.
func (b *builder) mayRoute(host, ns string) (bool, *hostOwner) {
	o := b.owners[host]
	if host == "" || o == nil || o.namespace == ns || o.delegates[ns] || o.delegates["*"] {
		return true, o
	}
	return false, o
}
