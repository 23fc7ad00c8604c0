package controlplane

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
)

// writeGatewayStatus writes the statuses a build computed (gs) for Portico's
// GatewayClasses, Gateways and HTTPRoutes, as the leader: conditions keep their
// transition time while their status stays, a route keeps the parents other
// controllers wrote, and a Gateway is Programmed only once every ready edge of
// its group serves its generation (everyEdgeServes, as an Ingress's address).
func (c *Controller) writeGatewayStatus(ctx context.Context, st State, gs GatewayStatuses, snap model.Snapshot) error {
	if c.gwClasses == nil {
		return nil
	}
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	groups := map[string]model.Group{}
	for _, g := range snap.Groups {
		groups[g.Name] = g
	}
	var errs []error
	for _, gc := range st.GatewayClasses {
		want, ok := gs.Classes[gc.Name]
		if !ok {
			continue
		}
		conds := mergeConditions(gc.Status.Conditions, want, now)
		var features []gatewayv1.SupportedFeature
		if conds[0].Status == metav1.ConditionTrue {
			for _, f := range GatewayFeatures {
				features = append(features, gatewayv1.SupportedFeature{Name: gatewayv1.FeatureName(f)})
			}
		}
		if equality.Semantic.DeepEqual(conds, gc.Status.Conditions) && equality.Semantic.DeepEqual(features, gc.Status.SupportedFeatures) {
			continue
		}
		cp := gc.DeepCopy()
		cp.Status.Conditions, cp.Status.SupportedFeatures = conds, features
		errs = append(errs, c.updateStatus(ctx, gatewayClassesResource, "GatewayClass", cp, "gatewayclass-status"))
	}
	seen := map[servedWait]bool{}
	for _, gw := range st.Gateways {
		want, ok := gs.Gateways[key(gw)]
		if !ok {
			continue
		}
		want = *want.DeepCopy()
		k := kindGateway + " " + key(gw)
		if g, ok := groups[gs.Groups[key(gw)]]; ok {
			for i := range want.Conditions {
				pc := &want.Conditions[i]
				if pc.Type != string(gatewayv1.GatewayConditionProgrammed) || pc.Status != metav1.ConditionTrue {
					continue
				}
				seen[servedWait{k, gw.Generation}] = true
				if !c.everyEdgeServes(k, gw.Generation, g, objRef(kindGateway, gw.Namespace, gw.Name)) {
					pc.Status, pc.Reason, pc.Message = metav1.ConditionFalse, string(gatewayv1.GatewayReasonPending),
						"waiting for every edge of group "+g.Name+" to serve this generation"
				}
			}
		}
		next := gatewayv1.GatewayStatus{Addresses: want.Addresses, Conditions: mergeConditions(gw.Status.Conditions, want.Conditions, now)}
		for _, l := range want.Listeners {
			var old []metav1.Condition
			for _, ol := range gw.Status.Listeners {
				if ol.Name == l.Name {
					old = ol.Conditions
				}
			}
			l.Conditions = mergeConditions(old, l.Conditions, now)
			next.Listeners = append(next.Listeners, l)
		}
		if equality.Semantic.DeepEqual(next.Addresses, gw.Status.Addresses) && equality.Semantic.DeepEqual(next.Conditions, gw.Status.Conditions) &&
			equality.Semantic.DeepEqual(next.Listeners, gw.Status.Listeners) {
			continue
		}
		cp := gw.DeepCopy()
		cp.Status.Addresses, cp.Status.Conditions, cp.Status.Listeners = next.Addresses, next.Conditions, next.Listeners
		errs = append(errs, c.updateStatus(ctx, gatewaysResource, kindGateway, cp, "gateway-status"))
	}
	for w := range c.waits {
		if strings.HasPrefix(w.ingress, kindGateway+" ") && !seen[w] {
			delete(c.waits, w)
		}
	}
	for _, r := range st.HTTPRoutes {
		want := gs.Routes[key(r)]
		var parents []gatewayv1.RouteParentStatus
		for _, p := range r.Status.Parents {
			if p.ControllerName != v1alpha1.GatewayControllerName {
				parents = append(parents, p) // another controller's
			}
		}
		for _, p := range want {
			var old []metav1.Condition
			for _, op := range r.Status.Parents {
				if op.ControllerName == p.ControllerName && equality.Semantic.DeepEqual(op.ParentRef, p.ParentRef) {
					old = op.Conditions
				}
			}
			p.Conditions = mergeConditions(old, p.Conditions, now)
			parents = append(parents, p)
		}
		if equality.Semantic.DeepEqual(parents, r.Status.Parents) || len(parents) == 0 && len(r.Status.Parents) == 0 {
			continue
		}
		cp := r.DeepCopy()
		cp.Status.Parents = parents
		errs = append(errs, c.updateStatus(ctx, httpRoutesResource, kindHTTPRoute, cp, "httproute-status"))
	}
	return errors.Join(errs...)
}

// mergeConditions is want, each condition keeping old's transition time while
// its status is old's (else now).
func mergeConditions(old, want []metav1.Condition, now metav1.Time) []metav1.Condition {
	out := make([]metav1.Condition, 0, len(want))
	for _, w := range want {
		w.LastTransitionTime = now
		for _, o := range old {
			if o.Type == w.Type && o.Status == w.Status {
				w.LastTransitionTime = o.LastTransitionTime
			}
		}
		out = append(out, w)
	}
	return out
}

// updateStatus writes obj's status through the dynamic client.
func (c *Controller) updateStatus(ctx context.Context, r schema.GroupVersionResource, kind string, obj metav1.Object, what string) error {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return fmt.Errorf("%s %s: %w", kind, key(obj), err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion(gatewayv1.SchemeGroupVersion.String())
	u.SetKind(kind)
	var ri dynamic.ResourceInterface = c.cfg.Dynamic.Resource(r)
	if ns := obj.GetNamespace(); ns != "" {
		ri = c.cfg.Dynamic.Resource(r).Namespace(ns)
	}
	_, err = ri.UpdateStatus(ctx, u, metav1.UpdateOptions{})
	c.countWrite(what, err)
	return ignoreGone(err)
}
