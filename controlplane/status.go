package controlplane

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

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
		// The API server defaults ipMode to VIP; say so, or every sync would differ.
		out = append(out, corev1.LoadBalancerIngress{IP: a.String(), IPMode: ptrTo(corev1.LoadBalancerIPModeVIP)})
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
