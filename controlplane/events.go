package controlplane

import (
	"strings"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
)

// report sends each new problem as a Warning Event on its object, once while it
// lasts (leader only, so the agents do not repeat each other). Every problem goes
// through it: Build's, allocation's and the claims'.
func (c *Controller) report(problems []model.Problem) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := map[string]bool{}
	for _, p := range problems {
		k := p.String()
		now[k] = true
		if c.reported[k] {
			continue
		}
		if ref := problemRef(p); ref != nil {
			c.recorder.Event(ref, corev1.EventTypeWarning, string(p.Reason), strings.TrimSpace(p.Field+": "+p.Detail))
		}
		c.log.Warn("problem", zap.String("object", p.Object), zap.String("field", p.Field), zap.String("reason", string(p.Reason)), zap.String("detail", p.Detail))
	}
	c.reported = now
}

// problemRef turns a Problem's "Kind namespace/name" into an object reference.
func problemRef(p model.Problem) *corev1.ObjectReference {
	kind, obj, ok := strings.Cut(p.Object, " ")
	if !ok {
		return nil
	}
	ns, name, ok := strings.Cut(obj, "/")
	if !ok {
		ns, name = "", obj
	}
	return objRef(kind, ns, name)
}

// objRef references an object for an Event; nil for kinds Portico does not report on.
func objRef(kind, ns, name string) *corev1.ObjectReference {
	api := map[string]string{"Ingress": "networking.k8s.io/v1", "IngressClass": "networking.k8s.io/v1",
		"Service": "v1", "Pod": "v1", "Secret": "v1", "Node": "v1",
		"IngressClaim": v1alpha1.IngressClaimResource.GroupVersion().String(), "VIPPool": v1alpha1.GroupVersion.String(),
		"GatewayClass": gatewayv1.SchemeGroupVersion.String(), "Gateway": gatewayv1.SchemeGroupVersion.String(),
		"HTTPRoute": gatewayv1.SchemeGroupVersion.String()}[kind]
	if api == "" {
		return nil
	}
	return &corev1.ObjectReference{APIVersion: api, Kind: kind, Namespace: ns, Name: name}
}
