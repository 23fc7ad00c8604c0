package federation

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/portico-edge/portico/api/sites"
	"github.com/portico-edge/portico/api/v1alpha1"
)

// DrainLead is how long after a drain is asked for it begins, by default
// (Config.DrainLead): a mounted ConfigMap reaches the agents within the
// kubelet's sync period, a minute by default.
const DrainLead = 90 * time.Second

// drain reads a member Secret's drain annotations, fixing the drain's start in
// portico.io/drain-from when portico.io/drain says only "true" (and dropping it
// when the drain is over).
func (c *Controller) drain(ctx context.Context, s *corev1.Secret) (bool, *metav1.Time) {
	v, ok := s.Annotations[v1alpha1.AnnotationDrain]
	if !ok || v == "false" {
		if _, set := s.Annotations[v1alpha1.AnnotationDrainFrom]; set {
			c.annotate(ctx, s, nil)
		}
		return false, nil
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return true, &metav1.Time{Time: t}
	}
	if v != "true" {
		c.warnOnce(s, s.Namespace+"/"+s.Name+"/drain", "InvalidDrain",
			fmt.Sprintf("annotation %s=%q: want true, false or an RFC 3339 time; the site is not drained", v1alpha1.AnnotationDrain, v))
		return false, nil
	}
	if t, err := time.Parse(time.RFC3339, s.Annotations[v1alpha1.AnnotationDrainFrom]); err == nil {
		return true, &metav1.Time{Time: t}
	}
	from := time.Now().Add(c.cfg.DrainLead).Truncate(time.Second)
	if !c.annotate(ctx, s, &from) {
		return false, nil // not recorded: not told to anyone yet
	}
	c.log.Info("site drain asked for", zap.String("cluster", memberName(s)), zap.Time("from", from))
	return true, &metav1.Time{Time: from}
}

// overflow reads a member Secret's capacity annotations: nil without a capacity;
// a bad value is reported and the site does not overflow.
func (c *Controller) overflow(s *corev1.Secret, edges int) *sites.Overflow {
	capv, ok := s.Annotations[v1alpha1.AnnotationCapacity]
	if !ok {
		return nil
	}
	key := s.Namespace + "/" + s.Name + "/overflow"
	bad := func(what string) *sites.Overflow {
		c.warnOnce(s, key, "InvalidOverflow", what+"; the site does not overflow")
		return nil
	}
	capacity, err := strconv.ParseFloat(capv, 64)
	if err != nil || capacity <= 0 {
		return bad(fmt.Sprintf("annotation %s=%q: want a positive number of new connections a second", v1alpha1.AnnotationCapacity, capv))
	}
	o := &sites.Overflow{To: s.Annotations[v1alpha1.AnnotationOverflowTo], CapacityPerEdge: capacity / float64(max(edges, 1))}
	if o.To == "" || o.To == memberName(s) {
		return bad(fmt.Sprintf("annotation %s=%q: want another member cluster", v1alpha1.AnnotationOverflowTo, o.To))
	}
	if v, ok := s.Annotations[v1alpha1.AnnotationOverflowLimit]; ok {
		if o.Limit, err = strconv.ParseFloat(v, 64); err != nil || o.Limit <= 0 || o.Limit > sites.MaxSpill {
			return bad(fmt.Sprintf("annotation %s=%q: want more than 0, at most %v", v1alpha1.AnnotationOverflowLimit, v, sites.MaxSpill))
		}
	}
	return o
}

// annotate sets (or, with nil, removes) a member Secret's portico.io/drain-from.
func (c *Controller) annotate(ctx context.Context, s *corev1.Secret, from *time.Time) bool {
	val := "null"
	if from != nil {
		val = `"` + from.UTC().Format(time.RFC3339) + `"`
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%s}}}`, v1alpha1.AnnotationDrainFrom, val)
	if _, err := c.host.CoreV1().Secrets(s.Namespace).Patch(ctx, s.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: FieldManager}); err != nil {
		c.log.Warn("annotate member secret", zap.String("secret", s.Namespace+"/"+s.Name), zap.Error(err))
		return false
	}
	return true
}

// siteDraining reports whether a member's Secret says it drains now.
func (c *Controller) siteDraining(cluster string, now time.Time) bool {
	list, err := c.secrets.List(labels.Everything())
	if err != nil {
		return false
	}
	for _, s := range list {
		if memberName(s) != cluster {
			continue
		}
		v := s.Annotations[v1alpha1.AnnotationDrain]
		from, err := time.Parse(time.RFC3339, v)
		if err != nil {
			from, err = time.Parse(time.RFC3339, s.Annotations[v1alpha1.AnnotationDrainFrom])
		}
		return err == nil && !now.Before(from)
	}
	return false
}

// policies applies the FederatedIngresses' site policies (spec.policy.sites,
// overflowLimitPercent, drainGrace) to the sites they place: the first
// FederatedIngress by namespace/name that sets a site's counts, over its member
// Secret's annotations.
func (c *Controller) policies(infos map[string]siteInfo) {
	var fis []*v1alpha1.FederatedIngress
	for _, obj := range c.fisAll() {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		fi := &v1alpha1.FederatedIngress{}
		if runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, fi) != nil || Validate(fi) != nil || fi.DeletionTimestamp != nil {
			continue
		}
		fis = append(fis, fi)
	}
	slices.SortFunc(fis, func(a, b *v1alpha1.FederatedIngress) int {
		return cmp.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	set, graced := map[string]bool{}, map[string]bool{}
	for _, fi := range fis {
		pol := fi.Spec.Policy
		for _, sp := range pol.Sites {
			info, ok := infos[sp.Cluster]
			if !ok || set[sp.Cluster] {
				continue
			}
			set[sp.Cluster] = true
			info.overflow = &sites.Overflow{To: sp.OverflowTo, CapacityPerEdge: float64(sp.Capacity) / float64(max(len(info.edges), 1)),
				Limit: float64(pol.OverflowLimitPercent) / 100}
			infos[sp.Cluster] = info
		}
		if pol.DrainGrace == nil {
			continue
		}
		for _, cl := range fi.Spec.Placement.Clusters {
			if info, ok := infos[cl]; ok && !graced[cl] {
				graced[cl] = true
				info.drainGrace = pol.DrainGrace
				infos[cl] = info
			}
		}
	}
}
