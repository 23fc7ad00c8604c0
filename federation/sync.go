package federation

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/portico-edge/portico/api/v1alpha1"
)

// sync brings the members in line with one FederatedIngress (key is its
// namespace/name) and writes what its sites report into its status: a deleted one
// is finalized, a new one gets the finalizer first.
func (c *Controller) sync(ctx context.Context, key string) error {
	u, fi, err := c.get(key)
	if u == nil || err != nil {
		return err
	}
	if fi.DeletionTimestamp != nil {
		return c.finalize(ctx, u, fi)
	}
	if !slices.Contains(fi.Finalizers, v1alpha1.FederationFinalizer) {
		return c.addFinalizer(ctx, u)
	}
	invalid := Validate(fi)
	status := v1alpha1.FederatedIngressStatus{ObservedGeneration: fi.Generation, Sites: c.sites(ctx, u, fi, key, invalid)}
	sort.Slice(status.Sites, func(i, j int) bool { return status.Sites[i].Cluster < status.Sites[j].Cluster })
	keepAnnounceChanged(status.Sites, fi.Status.Sites)
	behind, notReady := lagging(status.Sites, fi.Generation)
	status.Propagated, status.Ready = int32(len(status.Sites)-len(behind)), int32(len(status.Sites)-len(notReady))
	status.Conditions = conditions(fi, status, behind, notReady, invalid)
	return c.writeStatus(ctx, u, fi, status)
}

// conditions returns fi's conditions with Propagated and Ready set for st, at
// fi's generation: True when every placed site holds (Propagated) or also
// serves (Ready) it; otherwise the message names the sites that do not
// (behind, notReady: lagging's). invalid is why fi does not validate, nil when
// it does. A condition whose
// status does not change keeps its lastTransitionTime.
func conditions(fi *v1alpha1.FederatedIngress, st v1alpha1.FederatedIngressStatus, behind, notReady []string, invalid error) []metav1.Condition {
	conds := slices.Clone(fi.Status.Conditions)
	placed := int32(len(st.Sites))
	set := func(typ string, n int32, missing []string, what string) {
		c := metav1.Condition{Type: typ, Status: metav1.ConditionTrue, Reason: v1alpha1.FederatedReasonAllSites,
			Message: fmt.Sprintf("%d/%d placed sites %s", n, placed, what), ObservedGeneration: fi.Generation}
		switch {
		case placed == 0:
			c.Status, c.Reason, c.Message = metav1.ConditionFalse, v1alpha1.FederatedReasonNoPlacement, "the placement names no cluster"
		case invalid != nil:
			c.Status, c.Reason, c.Message = metav1.ConditionFalse, v1alpha1.FederatedReasonInvalid, invalid.Error()
		case len(missing) > 0:
			c.Status, c.Reason = metav1.ConditionFalse, v1alpha1.FederatedReasonSitesBehind
			c.Message += "; not: " + strings.Join(missing, ", ")
		}
		apimeta.SetStatusCondition(&conds, c)
	}
	set(v1alpha1.FederatedConditionPropagated, st.Propagated, behind, "hold the current generation")
	set(v1alpha1.FederatedConditionReady, st.Ready, notReady, "serve it")
	return conds
}

// get reads the FederatedIngress key names from the cache, as stored and decoded;
// nil when there is nothing to sync: a bad key, an object gone, or one that does
// not decode (reported as a Warning Event on it).
func (c *Controller) get(key string) (*unstructured.Unstructured, *v1alpha1.FederatedIngress, error) {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil, nil, nil
	}
	obj, err := c.fis.ByNamespace(ns).Get(name)
	if apierrors.IsNotFound(err) {
		// Gone without our finalizer (created while no controller ran and deleted
		// before one did): its Ingresses stay on the members. Deleting them on a
		// missing object would let an empty host cache take every site down, which
		// fail-static forbids.
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	u := obj.(*unstructured.Unstructured)
	fi := &v1alpha1.FederatedIngress{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, fi); err != nil {
		c.recorder.Event(u, corev1.EventTypeWarning, "InvalidFederatedIngress", err.Error())
		return nil, nil, nil
	}
	return u, fi, nil
}

// addFinalizer puts the federation's finalizer on u; the update comes back as an
// event, which syncs it again.
func (c *Controller) addFinalizer(ctx context.Context, u *unstructured.Unstructured) error {
	cp := u.DeepCopy()
	cp.SetFinalizers(append(cp.GetFinalizers(), v1alpha1.FederationFinalizer))
	if _, err := c.dyn.Resource(v1alpha1.FederatedIngressResource).Namespace(u.GetNamespace()).Update(ctx, cp, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("add finalizer: %w", err)
	}
	return nil
}

// sites propagates fi to every cluster its placement names and removes it from the
// members it no longer names, returning each placed site's status (in placement
// order). An invalid fi (invalid, Validate's) changes nothing on the members:
// each placed site reports the problem.
func (c *Controller) sites(ctx context.Context, u *unstructured.Unstructured, fi *v1alpha1.FederatedIngress, key string, invalid error) []v1alpha1.SiteStatus {
	var sites []v1alpha1.SiteStatus
	if invalid != nil {
		c.warnOnce(u, key, "InvalidFederatedIngress", invalid.Error())
		for _, cl := range fi.Spec.Placement.Clusters {
			sites = append(sites, v1alpha1.SiteStatus{Cluster: cl, Error: invalid.Error()})
		}
		return sites
	}
	c.warnOnce(u, key, "", "")
	for _, cl := range fi.Spec.Placement.Clusters {
		sites = append(sites, c.propagate(ctx, u, fi, cl))
	}
	c.removeUnplaced(ctx, u, fi, key)
	return sites
}

// removeUnplaced removes fi's Ingress from every member its placement does not
// name. A cluster that left the placement but does not answer keeps the Ingress
// until a resync reaches it (a Warning Event says so meanwhile).
func (c *Controller) removeUnplaced(ctx context.Context, u *unstructured.Unstructured, fi *v1alpha1.FederatedIngress, key string) {
	placed := map[string]bool{}
	for _, cl := range fi.Spec.Placement.Clusters {
		placed[cl] = true
	}
	for _, cl := range c.memberNames() {
		if !placed[cl] {
			err := c.remove(ctx, cl, fi.Namespace, fi.Name)
			msg := ""
			if err != nil {
				msg = err.Error()
			}
			c.warnOnce(u, key+" "+cl+" remove", "NotRemoved", msg)
		}
	}
}

// keepAnnounceChanged carries each site's AnnounceChanged over from the status
// written before (old), and sets it to now where the site's announcement changed.
func keepAnnounceChanged(sites, old []v1alpha1.SiteStatus) {
	for i, s := range sites {
		for _, o := range old {
			if o.Cluster != s.Cluster {
				continue
			}
			sites[i].AnnounceChanged = o.AnnounceChanged
			if o.Announce != s.Announce && s.Announce != "" {
				sites[i].AnnounceChanged = &metav1.Time{Time: time.Now().Truncate(time.Second)}
			}
		}
	}
}

// lagging names the sites that do not hold generation gen's Ingress (behind),
// and those that do not also have a ready backend and an edge that serves it
// (notReady, behind included).
func lagging(sites []v1alpha1.SiteStatus, gen int64) (behind, notReady []string) {
	for _, s := range sites {
		switch {
		case s.Error != "" || s.PropagatedGeneration != gen:
			behind = append(behind, s.Cluster)
			notReady = append(notReady, s.Cluster)
		case s.ReadyBackends == 0 || s.EdgesServing == 0:
			notReady = append(notReady, s.Cluster)
		}
	}
	return behind, notReady
}

// remove deletes what was propagated for ns/name from one cluster (placement no
// longer names it, or the FederatedIngress is being deleted).
func (c *Controller) remove(ctx context.Context, cluster, ns, name string) error {
	m := c.member(cluster)
	if m == nil {
		return nil
	}
	names, err := m.propagated(ns, name)
	if err != nil {
		return err
	}
	if why, down := m.unreachable(time.Now()); down && len(names) > 0 {
		return fmt.Errorf("%s: unreachable: %s", cluster, why)
	}
	for _, n := range names {
		err := m.client.NetworkingV1().Ingresses(ns).Delete(ctx, n, metav1.DeleteOptions{})
		m.noteCall(err, time.Now(), c.cfg.Resync)
		if err != nil && !apierrors.IsNotFound(err) {
			c.metrics.propagations.WithLabelValues("delete", "error").Inc()
			return fmt.Errorf("%s: delete ingress %s/%s: %w", cluster, ns, n, err)
		}
		c.metrics.propagations.WithLabelValues("delete", "ok").Inc()
		c.log.Info("removed", zap.String("federatedingress", ns+"/"+name), zap.String("cluster", cluster))
	}
	return nil
}

// finalize removes the Ingresses from every member, then the finalizer. A member that
// cannot be reached keeps the finalizer on (retried); one whose Secret is gone cannot
// be cleaned and is not waited for.
func (c *Controller) finalize(ctx context.Context, u *unstructured.Unstructured, fi *v1alpha1.FederatedIngress) error {
	if !slices.Contains(fi.Finalizers, v1alpha1.FederationFinalizer) {
		return nil
	}
	var errs error
	for _, cl := range c.memberNames() {
		if err := c.remove(ctx, cl, fi.Namespace, fi.Name); err != nil {
			errs = errors.Join(errs, err)
		}
	}
	if errs != nil {
		return errs
	}
	cp := u.DeepCopy()
	cp.SetFinalizers(slices.DeleteFunc(cp.GetFinalizers(), func(f string) bool { return f == v1alpha1.FederationFinalizer }))
	if _, err := c.dyn.Resource(v1alpha1.FederatedIngressResource).Namespace(fi.Namespace).Update(ctx, cp, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove finalizer: %w", err)
	}
	return nil
}

// writeStatus writes st as fi's status unless it already is.
func (c *Controller) writeStatus(ctx context.Context, u *unstructured.Unstructured, fi *v1alpha1.FederatedIngress, st v1alpha1.FederatedIngressStatus) error {
	if equality.Semantic.DeepEqual(fi.Status, st) {
		return nil
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&st)
	if err != nil {
		return fmt.Errorf("encode status: %w", err)
	}
	cp := u.DeepCopy()
	cp.Object["status"] = m
	if _, err := c.dyn.Resource(v1alpha1.FederatedIngressResource).Namespace(fi.Namespace).UpdateStatus(ctx, cp, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update status: %w", err)
	}
	return nil
}
