package controlplane

import (
	"context"
	"errors"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/controlplane/model"
)

// vipsByGroup returns each group's VIPs by name.
func vipsByGroup(snap model.Snapshot) map[string][]netip.Addr {
	out := make(map[string][]netip.Addr, len(snap.Groups))
	for _, g := range snap.Groups {
		out[g.Name] = g.VIPs
	}
	return out
}

// writeServiceStatus sets status.loadBalancer.ingress of every LoadBalancer group
// and every L4 Service to its VIPs (only those: the API server refuses the field on
// other types). An L4 Service that is not served (no group) gets none.
func (c *Controller) writeServiceStatus(ctx context.Context, services []*corev1.Service, snap model.Snapshot) error {
	vips := vipsByGroup(snap)
	for _, v := range snap.Services {
		vips[v.Name] = v.VIPs
	}
	var errs []error
	for _, s := range services {
		if s.Spec.Type != corev1.ServiceTypeLoadBalancer || !IsGroup(s) && !IsL4Service(s) {
			continue
		}
		want := lbIngress(vips[key(s)])
		if equality.Semantic.DeepEqual(s.Status.LoadBalancer.Ingress, want) {
			continue
		}
		cp := s.DeepCopy()
		cp.Status.LoadBalancer.Ingress = want
		_, err := c.cfg.Client.CoreV1().Services(s.Namespace).UpdateStatus(ctx, cp, metav1.UpdateOptions{})
		c.countWrite("service-status", err)
		errs = append(errs, ignoreGone(err))
	}
	return errors.Join(errs...)
}

// writeIngressStatus sets status.loadBalancer.ingress of every Portico Ingress to
// its bound group's VIPs (bindings from Build), nothing while it is unbound.
func (c *Controller) writeIngressStatus(ctx context.Context, ingresses []*networkingv1.Ingress, bindings Bindings, snap model.Snapshot) error {
	vips := vipsByGroup(snap)
	allVIPs := map[string]bool{}
	for _, g := range snap.Groups {
		for _, a := range g.VIPs {
			allVIPs[a.String()] = true
		}
	}
	groups := map[string]model.Group{}
	for _, g := range snap.Groups {
		groups[g.Name] = g
	}
	var errs []error
	seen := map[servedWait]bool{}
	defer func() {
		for w := range c.waits {
			if !seen[w] && !strings.Contains(w.ingress, " ") { // an Ingress's (not a Gateway's)
				delete(c.waits, w) // deleted, changed again, or written
			}
		}
	}()
	for _, ing := range ingresses {
		bd := bindings[key(ing)]
		if !bd.Ours && !onlyOurVIPs(ing.Status.LoadBalancer.Ingress, allVIPs) {
			continue // another controller's Ingress (one Portico served before is cleared)
		}
		want := ingressLB(vips[bd.Group])
		if equality.Semantic.DeepEqual(ing.Status.LoadBalancer.Ingress, want) {
			continue
		}
		// A first address waits until the group's edges serve the Ingress.
		if len(ing.Status.LoadBalancer.Ingress) == 0 && len(want) > 0 {
			seen[servedWait{key(ing), ing.Generation}] = true
			if !c.readyForAddress(ing, groups[bd.Group]) {
				continue
			}
		}
		cp := ing.DeepCopy()
		cp.Status.LoadBalancer.Ingress = want
		_, err := c.cfg.Client.NetworkingV1().Ingresses(ing.Namespace).UpdateStatus(ctx, cp, metav1.UpdateOptions{})
		c.countWrite("ingress-status", err)
		errs = append(errs, ignoreGone(err))
	}
	return errors.Join(errs...)
}

// onlyOurVIPs reports whether an Ingress status lists addresses and all are Portico
// VIPs: what Portico wrote for an Ingress that has since moved to another class.
func onlyOurVIPs(lb []networkingv1.IngressLoadBalancerIngress, vips map[string]bool) bool {
	for _, e := range lb {
		if e.Hostname != "" || !vips[e.IP] {
			return false
		}
	}
	return len(lb) > 0
}

func lbIngress(vips []netip.Addr) []corev1.LoadBalancerIngress {
	var out []corev1.LoadBalancerIngress
	for _, a := range vips {
		// ipMode Proxy (KEP-1860): the traffic must reach the edges. With VIP
		// (the API server's default), kube-proxy and the replacements that
		// read it take packets to the address on every node where they run,
		// in PREROUTING, straight to the Service's endpoints: around the edges'
		// nginx, its PROXY header and the data plane's consistent hashing.
		out = append(out, corev1.LoadBalancerIngress{IP: a.String(), IPMode: ptrTo(corev1.LoadBalancerIPModeProxy)})
	}
	return out
}

func ingressLB(vips []netip.Addr) []networkingv1.IngressLoadBalancerIngress {
	var out []networkingv1.IngressLoadBalancerIngress
	for _, a := range vips {
		out = append(out, networkingv1.IngressLoadBalancerIngress{IP: a.String()})
	}
	return out
}

func ignoreGone(err error) error {
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		// Deleted or changed since the cache saw it: the informer event brings the
		// next sync, which retries with the new object.
		return nil
	}
	return err
}
