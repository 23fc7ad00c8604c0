package controlplane

import (
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
)

// Object constructors shared by the Build table tests, the integration tests and the
// benchmarks. Each returns a fresh object; the age argument orders creation.

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func meta(ns, name string, age int, kv ...string) metav1.ObjectMeta {
	m := metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(epoch.Add(time.Duration(age) * time.Second))}
	for i := 0; i+1 < len(kv); i += 2 {
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[kv[i]] = kv[i+1]
	}
	return m
}

// groupSvc is a group Service with ports 80 and 443 and the given annotations.
func groupSvc(ns, name string, age int, kv ...string) *corev1.Service {
	s := &corev1.Service{ObjectMeta: meta(ns, name, age, kv...)}
	s.Labels = map[string]string{v1alpha1.LabelGroup: "true"}
	s.Spec.Type = corev1.ServiceTypeClusterIP
	s.Spec.Ports = []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}, {Name: "https", Port: 443, Protocol: corev1.ProtocolTCP}}
	return s
}

// backendSvc is a plain (not group) Service with the given ports (see sport).
func backendSvc(ns, name string, ports ...corev1.ServicePort) *corev1.Service {
	s := &corev1.Service{ObjectMeta: meta(ns, name, 0)}
	s.Spec.Ports = ports
	return s
}

func sport(name string, port int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Port: port, Protocol: corev1.ProtocolTCP}
}

type ep struct {
	addr        string
	node        string
	ready       bool
	terminating bool
}

// slice is an EndpointSlice of a Service with one port (named like the Service port).
func slice(ns, svc, name string, portName string, port int32, eps ...ep) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{ObjectMeta: meta(ns, name, 0)}
	es.Labels = map[string]string{discoveryv1.LabelServiceName: svc}
	es.AddressType = discoveryv1.AddressTypeIPv4
	if len(eps) > 0 && netip.MustParseAddr(eps[0].addr).Is6() {
		es.AddressType = discoveryv1.AddressTypeIPv6
	}
	es.Ports = []discoveryv1.EndpointPort{{Name: ptr(portName), Port: ptr(port), Protocol: ptr(corev1.ProtocolTCP)}}
	for _, e := range eps {
		d := discoveryv1.Endpoint{Addresses: []string{e.addr}, Conditions: discoveryv1.EndpointConditions{
			Ready: ptr(e.ready), Serving: ptr(e.ready || e.terminating), Terminating: ptr(e.terminating)}}
		if e.node != "" {
			d.NodeName = ptr(e.node)
		}
		es.Endpoints = append(es.Endpoints, d)
	}
	return es
}

type path struct {
	path string
	typ  networkingv1.PathType // "" leaves pathType unset
	svc  string
	port any // int32 number or string name
}

func backend(svc string, port any) networkingv1.IngressBackend {
	b := networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: svc}}
	switch p := port.(type) {
	case int:
		b.Service.Port.Number = int32(p)
	case string:
		b.Service.Port.Name = p
	}
	return b
}

// ingress has one rule for host with the given paths, bound by annotation kv.
func ingress(ns, name string, age int, host string, paths []path, kv ...string) *networkingv1.Ingress {
	ing := &networkingv1.Ingress{ObjectMeta: meta(ns, name, age, kv...)}
	if len(paths) > 0 {
		rule := networkingv1.IngressRule{Host: host, IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{}}}
		for _, p := range paths {
			hp := networkingv1.HTTPIngressPath{Path: p.path, Backend: backend(p.svc, p.port)}
			if p.typ != "" {
				hp.PathType = ptr(p.typ)
			}
			rule.HTTP.Paths = append(rule.HTTP.Paths, hp)
		}
		ing.Spec.Rules = []networkingv1.IngressRule{rule}
	}
	return ing
}

func tlsSecret(ns, name string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: meta(ns, name, 0), Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: []byte("CERT " + name), corev1.TLSPrivateKeyKey: []byte("KEY " + name)}}
}

func microservice(ns, name string, age int, ip, hosts, paths string, kv ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: meta(ns, name, age, append([]string{v1alpha1.AnnotationTrafficHosts, hosts, v1alpha1.AnnotationPublicPaths, paths}, kv...)...)}
	p.Labels = map[string]string{v1alpha1.LabelMicroservice: "true"}
	p.Status.PodIP = ip
	p.Status.Phase = corev1.PodRunning
	return p
}
