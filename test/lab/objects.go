package lab

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
)

func ptr[T any](v T) *T { return &v }

// labPool lets the applications' L4 Services take the addresses they name from
// 192.0.2.64/26 (none is allocated: they all name one).
const labPool = `
apiVersion: portico.io/v1alpha1
kind: VIPPool
metadata: {name: lab-apps}
spec:
  addresses: [192.0.2.64/26]
  autoAssign: false
  serviceAllocation: {namespaces: [` + AppNamespace + `]}
`

// createObjects writes the cluster state the lab starts from: the group Service
// and its EndpointSlice (every edge node, ready), and the Lease namespace.
func (l *Lab) createObjects(ctx context.Context) error {
	for _, f := range []string{"namespace.yaml", "examples/group.yaml", "examples/web.yaml"} {
		if err := l.ApplyFile(ctx, f); err != nil {
			return err
		}
	}
	svc, err := l.Kube.CoreV1().Services(GroupNamespace).Get(ctx, GroupName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("example group: %w", err)
	}
	if v := svc.Annotations["portico.io/vip"]; v != VIP.String() {
		return fmt.Errorf("deploy/examples/group.yaml gives the group VIP %q, the lab expects %s: update lab.VIP", v, VIP)
	}
	if _, err := l.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: AppNamespace}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", AppNamespace, err)
	}
	// The applications' L4 Services name their VIPs: only a pool that allows
	// their namespace lets them (the operator's; the agents read it at start).
	if err := l.ApplyFile(ctx, "crds/vippools.portico.io.yaml"); err != nil {
		return err
	}
	if err := l.ApplyYAML(ctx, "the lab's VIPPool", []byte(labPool)); err != nil {
		return err
	}
	// In BGP mode the agents also peer with the BGPPeer objects of their
	// namespace (with BGPOptions.PeerObjects, the router is one).
	for _, f := range []string{"crds/bgppeers.portico.io.yaml", "crds/bfdprofiles.portico.io.yaml"} {
		if err := l.ApplyFile(ctx, f); err != nil {
			return err
		}
	}
	if l.bgp != nil && l.bgp.PeerObjects {
		if err := l.ApplyYAML(ctx, "the router's BGPPeer", []byte(l.bgpObjectsYAML())); err != nil {
			return err
		}
	}
	// No kubelet runs: the lab writes the endpoints of the example's Services.
	if err := l.writeSlice(ctx, GroupNamespace, "web", l.Pods...); err != nil {
		return err
	}
	return l.SetGroupEndpoints(ctx, nil)
}

// SetGroupEndpoints writes the group's EndpointSlice: every edge node, ready,
// except those marked "terminating" (not ready, terminating) or "gone" (left out).
func (l *Lab) SetGroupEndpoints(ctx context.Context, state map[*Node]string) error {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: GroupNamespace, Name: GroupName + "-lab", Labels: map[string]string{discoveryv1.LabelServiceName: GroupName}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(80)), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	for _, e := range l.Edges {
		st := state[e]
		if st == "gone" {
			continue
		}
		ready, term := st != "terminating", st == "terminating"
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{e.Addr.Addr().String()},
			NodeName:   ptr(e.Name),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready), Serving: ptr(true), Terminating: ptr(term)},
		})
	}
	c := l.Kube.DiscoveryV1().EndpointSlices(GroupNamespace)
	old, err := c.Get(ctx, es.Name, metav1.GetOptions{})
	if err == nil {
		es.ResourceVersion = old.ResourceVersion
		_, err = c.Update(ctx, es, metav1.UpdateOptions{})
	} else {
		_, err = c.Create(ctx, es, metav1.CreateOptions{})
	}
	if err != nil {
		return fmt.Errorf("write group endpoints: %w", err)
	}
	return nil
}

// Backend is an app Service whose endpoints are lab pods listening on BackendPort.
func (l *Lab) Backend(ctx context.Context, name string, pods ...*Node) error {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: AppNamespace, Name: name},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
	if _, err := l.Kube.CoreV1().Services(AppNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create service %s: %w", name, err)
	}
	return l.writeSlice(ctx, AppNamespace, name, pods...)
}

// writeSlice creates the EndpointSlice of a Service whose port "http" the given
// pods serve on BackendPort.
func (l *Lab) writeSlice(ctx context.Context, ns, name string, pods ...*Node) error {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name + "-lab", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(BackendPort)), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	for _, p := range pods {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{p.Addr.Addr().String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}})
	}
	if _, err := l.Kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create endpoints of %s/%s: %w", ns, name, err)
	}
	return nil
}

// Route sends a Prefix path to a port of a backend Service.
type Route struct {
	Path, Service string
	Port          string // the Service port's name; "" is "http"
}

// path is the Ingress path of r.
func (r Route) path() networkingv1.HTTPIngressPath {
	port := r.Port
	if port == "" {
		port = "http"
	}
	return networkingv1.HTTPIngressPath{Path: r.Path, PathType: ptr(networkingv1.PathTypePrefix),
		Backend: networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: r.Service, Port: networkingv1.ServiceBackendPort{Name: port}}}}
}

// Ingress routes host (all paths, Prefix "/") to a backend Service, bound to the
// lab's group.
func (l *Lab) Ingress(ctx context.Context, name, host, service string) error {
	return l.IngressRoutes(ctx, name, host, "", Route{Path: "/", Service: service})
}

// IngressRoutes creates an Ingress for host with the given routes, bound to the
// lab's group, with TLS from tlsSecret when it is not "".
func (l *Lab) IngressRoutes(ctx context.Context, name, host, tlsSecret string, routes ...Route) error {
	rule := networkingv1.IngressRule{Host: host, IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{}}}
	for _, r := range routes {
		rule.HTTP.Paths = append(rule.HTTP.Paths, r.path())
	}
	ing := &networkingv1.Ingress{
		ObjectMeta: metav1.ObjectMeta{Namespace: AppNamespace, Name: name,
			Annotations: map[string]string{"portico.io/group": GroupNamespace + "/" + GroupName}},
		Spec: networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{rule}},
	}
	if tlsSecret != "" {
		ing.Spec.TLS = []networkingv1.IngressTLS{{Hosts: []string{host}, SecretName: tlsSecret}}
	}
	if _, err := l.Kube.NetworkingV1().Ingresses(AppNamespace).Create(ctx, ing, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create ingress %s: %w", name, err)
	}
	return nil
}

// SetRoute changes Ingress name (of IngressRoutes): its route of r.Path goes to
// r's Service and port, or is added when it has none.
func (l *Lab) SetRoute(ctx context.Context, name string, r Route) error {
	c := l.Kube.NetworkingV1().Ingresses(AppNamespace)
	ing, err := c.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get ingress %s: %w", name, err)
	}
	paths := &ing.Spec.Rules[0].HTTP.Paths
	i := slices.IndexFunc(*paths, func(p networkingv1.HTTPIngressPath) bool { return p.Path == r.Path })
	if i < 0 {
		*paths = append(*paths, r.path())
	} else {
		(*paths)[i] = r.path()
	}
	if _, err := c.Update(ctx, ing, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update ingress %s: %w", name, err)
	}
	return nil
}

// TLSSecret stores a certificate and key as a kubernetes.io/tls Secret.
func (l *Lab) TLSSecret(ctx context.Context, name string, certPEM, keyPEM []byte) error {
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: AppNamespace, Name: name}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}}
	if _, err := l.Kube.CoreV1().Secrets(AppNamespace).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create secret %s: %w", name, err)
	}
	return nil
}

// SetBackendReady marks a site's echo pods ready or not (the site's federated
// Ingress then has a ready backend there, or none).
func (l *Lab) SetBackendReady(ctx context.Context, ready bool) error {
	c := l.Kube.DiscoveryV1().EndpointSlices(AppNamespace)
	es, err := c.Get(ctx, "echo-lab", metav1.GetOptions{})
	if err != nil {
		return err
	}
	for i := range es.Endpoints {
		es.Endpoints[i].Conditions.Ready = ptr(ready)
	}
	_, err = c.Update(ctx, es, metav1.UpdateOptions{})
	return err
}

// FederatedIngress is Ingress with the label `portico federation` gives the
// Ingresses it propagates.
func (l *Lab) FederatedIngress(ctx context.Context, name, host, service string) error {
	if err := l.Ingress(ctx, name, host, service); err != nil {
		return err
	}
	c := l.Kube.NetworkingV1().Ingresses(AppNamespace)
	ing, err := c.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	ing.Labels = map[string]string{v1alpha1.LabelFederatedIngress: name}
	_, err = c.Update(ctx, ing, metav1.UpdateOptions{})
	return err
}
