package federation

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"

	"github.com/portico-edge/portico/api/v1alpha1"
)

// propagate applies the cluster's Ingress (unless it already holds this generation
// as written) and reads back its state. A member's failure is the site's error in the
// status, not a retry of the whole FederatedIngress: the resync tries it again, and
// an unreachable member is skipped until then.
func (c *Controller) propagate(ctx context.Context, u *unstructured.Unstructured, fi *v1alpha1.FederatedIngress, cluster string) v1alpha1.SiteStatus {
	site := v1alpha1.SiteStatus{Cluster: cluster}
	m := c.member(cluster)
	if m == nil {
		site.Error = fmt.Sprintf("no member cluster %q (a Secret in %s labelled %s, or its first list, is missing)", cluster, c.cfg.Namespace, v1alpha1.LabelMemberCluster)
		return site
	}
	if why, down := m.unreachable(time.Now()); down {
		site.Error = "unreachable: " + why
		return site
	}
	problemKey := fi.Namespace + "/" + fi.Name + " " + cluster
	desired, err := MemberIngress(fi, cluster)
	if err != nil {
		site.Error = err.Error()
		c.warnOnce(u, problemKey, "InvalidOverride", err.Error())
		return site
	}
	cur, err := c.ensureIngress(ctx, u, fi, m, desired, problemKey)
	if err != nil {
		site.Error = err.Error()
		return site
	}
	return c.observe(ctx, u, fi, m, cur, problemKey, site)
}

// ensureIngress applies desired to the member unless its Ingress already holds it,
// and returns the member's Ingress as it then stands. A failed apply is reported as a
// Warning Event under problemKey until one succeeds.
func (c *Controller) ensureIngress(ctx context.Context, u *unstructured.Unstructured, fi *v1alpha1.FederatedIngress, m *member, desired *networkingv1.Ingress, problemKey string) (*networkingv1.Ingress, error) {
	cur, err := m.lister.Ingresses(fi.Namespace).Get(fi.Name)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, err
	}
	if cur != nil && holds(cur, desired) {
		return cur, nil
	}
	obj, err := applyObject(desired)
	if err == nil {
		err = c.ensureNamespace(ctx, m, fi.Namespace)
	}
	var applied *unstructured.Unstructured
	if err == nil {
		applied, err = m.dyn.Resource(ingressResource).Namespace(fi.Namespace).Apply(ctx, fi.Name, obj,
			metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	}
	m.noteCall(err, time.Now(), c.cfg.Resync)
	if err != nil {
		c.metrics.propagations.WithLabelValues("apply", "error").Inc()
		c.warnOnce(u, problemKey, "NotPropagated", m.name+": "+err.Error())
		return nil, fmt.Errorf("apply: %w", err)
	}
	c.metrics.propagations.WithLabelValues("apply", "ok").Inc()
	c.warnOnce(u, problemKey, "", "")
	c.log.Info("propagated", zap.String("federatedingress", fi.Namespace+"/"+fi.Name), zap.String("cluster", m.name),
		zap.Int64("generation", fi.Generation))
	cur = &networkingv1.Ingress{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(applied.Object, cur); err != nil {
		return nil, fmt.Errorf("decode applied ingress: %w", err)
	}
	return cur, nil
}

// observe fills in site what the member reports of its Ingress cur: the generation it
// holds, its addresses, its backends, and what the site's edges serve and announce.
// An Ingress served off the anycast VIP is reported under problemKey.
func (c *Controller) observe(ctx context.Context, u *unstructured.Unstructured, fi *v1alpha1.FederatedIngress, m *member, cur *networkingv1.Ingress, problemKey string, site v1alpha1.SiteStatus) v1alpha1.SiteStatus {
	site.PropagatedGeneration, _ = strconv.ParseInt(cur.Annotations[v1alpha1.AnnotationFederationGeneration], 10, 64)
	site.Addresses = lbAddresses(cur)
	ready, all, err := backends(ctx, m.client, cur)
	m.noteCall(err, time.Now(), c.cfg.Resync)
	if err != nil {
		site.Error = fmt.Sprintf("read endpoints: %v", err)
		return site
	}
	site.ReadyBackends, site.Backends = ready, all
	ev, err := edges(m.leases, fi.Namespace+"/"+fi.Name, cur.Generation)
	if err != nil {
		site.Error = fmt.Sprintf("read the agents' reports: %v", err)
		return site
	}
	if vip := fi.Spec.Policy.AnycastVIP; vip != "" && len(site.Addresses) > 0 && !slices.Contains(site.Addresses, vip) {
		site.Error = fmt.Sprintf("serves the Ingress on %v, not on the anycast VIP %s (portico.io/vip on the site's group Service)", site.Addresses, vip)
		c.warnOnce(u, problemKey+" vip", "AnycastVIPMismatch", site.Error)
	} else {
		c.warnOnce(u, problemKey+" vip", "", "")
	}
	site.Edges, site.EdgesServing, site.Announce = ev.edges, ev.serving, ev.announce
	site.Overflow = int32(math.Round(100 * ev.spill))
	if site.Announce == v1alpha1.SiteDepreferenced && c.siteDraining(site.Cluster, time.Now()) {
		site.Announce = v1alpha1.SiteDraining
	}
	return site
}

// lbAddresses lists an Ingress's status.loadBalancer addresses: each entry's IP,
// else its hostname.
func lbAddresses(ing *networkingv1.Ingress) []string {
	var out []string
	for _, lb := range ing.Status.LoadBalancer.Ingress {
		if lb.IP != "" {
			out = append(out, lb.IP)
		} else if lb.Hostname != "" {
			out = append(out, lb.Hostname)
		}
	}
	return out
}

// holds reports whether the member's Ingress already carries everything desired
// says (labels, annotations, spec): other managers' additions do not count.
func holds(cur, want *networkingv1.Ingress) bool {
	for k, v := range want.Labels {
		if cur.Labels[k] != v {
			return false
		}
	}
	for k, v := range want.Annotations {
		if cur.Annotations[k] != v {
			return false
		}
	}
	return equality.Semantic.DeepEqual(cur.Spec, want.Spec)
}

func (c *Controller) ensureNamespace(ctx context.Context, m *member, ns string) error {
	_, err := m.client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err == nil || !apierrors.IsNotFound(err) {
		return err
	}
	_, err = m.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// backends counts the ready and all endpoints behind the Services an Ingress names,
// each endpoint once (by its target or first address) however many slices and ports
// list it.
func backends(ctx context.Context, client kubernetes.Interface, ing *networkingv1.Ingress) (ready, all int32, err error) {
	services := map[string]bool{}
	add := func(b *networkingv1.IngressBackend) {
		if b != nil && b.Service != nil {
			services[b.Service.Name] = true
		}
	}
	add(ing.Spec.DefaultBackend)
	for _, r := range ing.Spec.Rules {
		if r.HTTP == nil {
			continue
		}
		for i := range r.HTTP.Paths {
			add(&r.HTTP.Paths[i].Backend)
		}
	}
	names := make([]string, 0, len(services))
	for s := range services {
		names = append(names, s)
	}
	sort.Strings(names)
	seen := map[string]bool{}
	for _, svc := range names {
		list, err := client.DiscoveryV1().EndpointSlices(ing.Namespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc})
		if err != nil {
			return 0, 0, err
		}
		for _, sl := range list.Items {
			for _, ep := range sl.Endpoints {
				id := svc + "/"
				switch {
				case ep.TargetRef != nil:
					id += string(ep.TargetRef.UID) + ep.TargetRef.Name
				case len(ep.Addresses) > 0:
					id += ep.Addresses[0]
				default:
					continue
				}
				if seen[id] {
					continue
				}
				seen[id] = true
				all++
				if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
					ready++
				}
			}
		}
	}
	return ready, all, nil
}
