package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/portico-edge/portico/api/v1alpha1"
)

// annotate sets one annotation on a Service or Ingress ("namespace/name") and, only
// when the patch applied (not on an object deleted since the cache saw it), records
// reason as a Normal Event on the object and logs the decision. It reports whether the
// patch applied.
func (c *Controller) annotate(ctx context.Context, kind, object, ann, value, reason, message string) (bool, error) {
	ns, name, _ := strings.Cut(object, "/")
	applied, err := c.patchAnnotation(ctx, kind, ns, name, ann, value)
	if applied {
		c.recorder.Event(objRef(kind, ns, name), corev1.EventTypeNormal, reason, message)
		c.log.Info(message, zap.String("reason", reason), zap.String("object", kind+" "+object),
			zap.String("annotation", ann), zap.String("value", value))
	}
	return applied, err
}

// patchAnnotation sets one annotation with a merge patch (the cached object is not
// touched). It reports whether the patch applied: an object deleted meanwhile is
// neither an error nor a change.
func (c *Controller) patchAnnotation(ctx context.Context, kind, ns, name, k, v string) (bool, error) {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{k: v}}})
	if err != nil {
		return false, fmt.Errorf("encode patch: %w", err)
	}
	switch kind {
	case "Service":
		_, err = c.cfg.Client.CoreV1().Services(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	case "Ingress":
		_, err = c.cfg.Client.NetworkingV1().Ingresses(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	default:
		return false, fmt.Errorf("patch %s: unsupported kind", kind)
	}
	c.countWrite("annotate-"+strings.ToLower(kind), err)
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("annotate %s %s/%s %s: %w", kind, ns, name, k, err)
	}
	c.mu.Lock()
	c.written[writtenKey{kind, ns + "/" + name, k}] = written{v, time.Now()}
	c.mu.Unlock()
	return true, nil
}

type writtenKey struct{ kind, object, annotation string }

type written struct {
	value string
	at    time.Time
}

// writtenTTL bounds how long a write the cache has not shown yet is assumed to hold.
const writtenTTL = 30 * time.Second

// withWritten overlays the annotations this leader wrote and the cache does not show
// yet onto copies of the affected objects (the cached ones are never changed).
func (c *Controller) withWritten(st State) State {
	c.mu.Lock()
	defer c.mu.Unlock()
	// Expire first: the write to an object deleted since is never visited below,
	// and would otherwise keep every later sync walking all objects.
	for k, w := range c.written {
		if time.Since(w.at) > writtenTTL {
			delete(c.written, k) // the cache never showed it
		}
	}
	if len(c.written) == 0 {
		return st
	}
	overlay := func(kind string, o metav1.Object) map[string]string {
		var add map[string]string
		object := key(o)
		for _, ann := range []string{v1alpha1.AnnotationVIP, v1alpha1.AnnotationVRID, v1alpha1.AnnotationGroup} {
			k := writtenKey{kind, object, ann}
			w, ok := c.written[k]
			if !ok {
				continue
			}
			// Every write sets an annotation the object did not have, so once the
			// cache shows one at all it has caught up with the write (or a later
			// change, which the overlay must not hide).
			if _, has := o.GetAnnotations()[ann]; has {
				delete(c.written, k) // the cache caught up
				continue
			}
			if add == nil {
				add = map[string]string{}
			}
			add[ann] = w.value
		}
		return add
	}
	out := st
	out.Services = overlayWritten("Service", st.Services, overlay)
	out.Ingresses = overlayWritten("Ingress", st.Ingresses, overlay)
	return out
}

// overlayWritten returns objs with each object that overlay gives annotations for
// replaced by a copy that has them (objs and its objects are left as they are).
func overlayWritten[T interface {
	metav1.Object
	DeepCopy() T
}](kind string, objs []T, overlay func(string, metav1.Object) map[string]string) []T {
	out := objs
	for i, o := range objs {
		add := overlay(kind, o)
		if add == nil {
			continue
		}
		if &out[0] == &objs[0] {
			out = slices.Clone(objs) // the first object to overlay
		}
		cp := o.DeepCopy()
		anns := cp.GetAnnotations()
		if anns == nil {
			anns = map[string]string{}
		}
		maps.Copy(anns, add)
		cp.SetAnnotations(anns)
		out[i] = cp
	}
	return out
}
