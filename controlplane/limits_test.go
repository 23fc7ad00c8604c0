package controlplane

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
)

// tenantL4 is an L4 Service of namespace tenant, age age, on the given VIPs
// (portico.io/vip) and TCP ports, in group edge/g1.
func tenantL4(name string, age int, vips []netip.Addr, ports ...int32) *corev1.Service {
	list := ""
	for i, a := range vips {
		if i > 0 {
			list += ","
		}
		list += a.String()
	}
	s := backendSvc("tenant", name)
	s.ObjectMeta = meta("tenant", name, age, v1alpha1.AnnotationVIP, list, v1alpha1.AnnotationGroup, "edge/g1")
	s.Spec.Type = corev1.ServiceTypeLoadBalancer
	s.Spec.LoadBalancerClass = ptr(v1alpha1.LoadBalancerClass)
	for _, p := range ports {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Port: p, Protocol: corev1.ProtocolTCP})
	}
	return s
}

// vipRange is n addresses from first on.
func vipRange(first string, n int) []netip.Addr {
	a := netip.MustParseAddr(first)
	out := make([]netip.Addr, n)
	for i := range out {
		out[i] = a
		a = a.Next()
	}
	return out
}

// problemsOf are the problems about object, without their details.
func problemsOf(problems []model.Problem, object string) []model.Problem {
	var out []model.Problem
	for _, p := range problems {
		if p.Object == object {
			p.Detail = ""
			out = append(out, p)
		}
	}
	return out
}

// An L4 Service port an edge already listens on (unchecked, every edge's
// reload failed on it) is refused with an Event, and the Service's other
// ports and every other Service are served.
func TestBuildRefusesReservedPorts(t *testing.T) {
	gs, gsl := g1Objects()
	reserved := map[model.Port]string{{Protocol: model.TCP, Port: 10247}: "the liveness checks", {Protocol: model.UDP, Port: 3784}: "BFD"}
	probe := tenantL4("probe", 2, addrs("192.0.2.60"), 10247, 443, 7000)
	bfd := tenantL4("bfd", 3, addrs("192.0.2.61"), 3784)
	bfd.Spec.Ports[0].Protocol = corev1.ProtocolUDP
	snap, _, problems := Build(state(gs, gsl, tenantL4("older", 1, addrs("192.0.2.59"), 10247+1), probe, bfd),
		Options{ReservedPorts: reserved})
	if err := snap.Validate(); err != nil {
		t.Fatal(err)
	}
	served := map[string][]model.ServicePort{}
	for _, s := range snap.Services {
		served[s.Name] = s.Ports
	}
	if p := served["tenant/probe"]; len(p) != 1 || p[0].Port != 7000 {
		t.Errorf("tenant/probe serves %v, want only 7000/TCP", p)
	}
	if p := served["tenant/older"]; len(p) != 1 || p[0].Port != 10248 {
		t.Errorf("tenant/older serves %v, want 10248/TCP", p)
	}
	if p, ok := served["tenant/bfd"]; ok {
		t.Errorf("tenant/bfd is served (ports %v), with no port to serve", p)
	}
	want := []model.Problem{
		{Object: "Service tenant/probe", Field: "spec.ports[0].port", Reason: model.ReasonPortReserved},
		{Object: "Service tenant/probe", Field: "spec.ports[1].port", Reason: model.ReasonPortReserved},
	}
	if got := problemsOf(problems, "Service tenant/probe"); !slices.Equal(got, want) {
		t.Errorf("problems of tenant/probe %v, want %v", got, want)
	}
	if got := problemsOf(problems, "Service tenant/bfd"); len(got) != 1 || got[0].Reason != model.ReasonPortReserved {
		t.Errorf("problems of tenant/bfd %v, want one PortReserved", got)
	}
	for _, p := range problems {
		if p.Object == "Service tenant/probe" && p.Field == "spec.ports[1].port" && p.Detail != "TCP/443 is reserved on the edges (the group's HTTP and HTTPS); not served" {
			t.Errorf("detail %q", p.Detail)
		}
	}
}

// A group's L4 Services beyond what its edges hold (unchecked, Apply failed on
// every edge, or VRRP stopped) are refused, newest first, with an
// Event; every older one is still served.
func TestBuildRefusesWhatAGroupCannotHold(t *testing.T) {
	gs, gsl := g1Objects() // one VIP (192.0.2.10), ports 80 and 443, two replicas
	for _, c := range []struct {
		name     string
		services func() []*corev1.Service
		refused  []string // newest first
		why      string
	}{{
		name: "VIP keys",
		services: func() []*corev1.Service {
			ports := make([]int32, 118)
			for i := range ports {
				ports[i] = int32(20000 + i)
			}
			// A key per VIP and port, and two per VIP (its other ports closed):
			// the group 1*(2+2); then 8*(118+2): 964; then 8*(5+2): 1,020;
			// then 8*(1+2): 1,044.
			return []*corev1.Service{tenantL4("big", 1, vipRange("198.51.100.1", 8), ports...),
				tenantL4("fits", 2, vipRange("198.51.100.20", 8), 7000, 7001, 7002, 7003, 7004),
				tenantL4("over", 3, vipRange("198.51.100.40", 8), 7000)}
		},
		refused: []string{"tenant/over"},
		why:     "1044 VIP ports, the data plane holds 1024",
	}, {
		name: "IPv4 VIP addresses",
		services: func() []*corev1.Service {
			var out []*corev1.Service
			for i := range 33 { // 1 + 32*8 = 257 addresses
				out = append(out, tenantL4(fmt.Sprintf("s%02d", i), i+1, vipRange(fmt.Sprintf("198.51.%d.1", i), 8), 7000))
			}
			return out
		},
		refused: []string{"tenant/s32", "tenant/s31"},
		why:     "257 VIP addresses, the data plane holds 256",
	}, {
		name: "IPv6 VIPs in one VRRP advert",
		services: func() []*corev1.Service {
			var out []*corev1.Service
			for i := range 10 { // 80 IPv6 addresses
				out = append(out, tenantL4(fmt.Sprintf("v6-%d", i), i+1, vipRange(fmt.Sprintf("2001:db8:%x::1", i), 8), 7000))
			}
			return out
		},
		refused: []string{"tenant/v6-9"},
		why:     "80 IPv6 VIPs, a VRRP advert carries 77",
	}} {
		t.Run(c.name, func(t *testing.T) {
			svcs := c.services()
			snap, _, problems := Build(state(gs, gsl, svcs), Options{})
			if err := snap.Validate(); err != nil {
				t.Fatal(err)
			}
			var refused []string
			for _, p := range problems {
				if p.Reason == model.ReasonGroupFull {
					refused = append(refused, p.Object[len("Service "):])
				}
			}
			slices.Reverse(refused)
			if !slices.Equal(refused[:min(len(refused), len(c.refused))], c.refused) {
				t.Errorf("refused %v, want the newest first: %v...", refused, c.refused)
			}
			served := map[string]bool{}
			for _, s := range snap.Services {
				served[s.Name] = true
			}
			for _, s := range svcs {
				if served[key(s)] == slices.Contains(refused, key(s)) {
					t.Errorf("%s: served %v, refused %v", key(s), served[key(s)], slices.Contains(refused, key(s)))
				}
			}
			for _, p := range problems {
				if p.Object == "Service "+c.refused[0] && p.Reason == model.ReasonGroupFull {
					if want := "group edge/g1's edges cannot hold it beside the older Services (" + c.why + "); not served"; p.Detail != want {
						t.Errorf("detail %q, want %q", p.Detail, want)
					}
				}
			}
			// Its VIPs stay free: a later Service (or the group) may take them.
			for _, s := range snap.Services {
				for _, a := range s.VIPs {
					for _, r := range c.refused {
						if slices.Contains(tenantVIPs(svcs, r), a) {
							t.Errorf("%s serves %s, a VIP of refused %s", s.Name, a, r)
						}
					}
				}
			}
		})
	}
}

// tenantVIPs are the VIPs tenantL4 gave the Service named name.
func tenantVIPs(svcs []*corev1.Service, name string) []netip.Addr {
	for _, s := range svcs {
		if key(s) == name {
			vips, _ := parseVIPs(s.Annotations[v1alpha1.AnnotationVIP])
			return vips
		}
	}
	return nil
}

// Replicas times VIP addresses is what xdp_lb's backends hold.
func TestBuildRefusesWhatAGroupCannotHoldForItsReplicas(t *testing.T) {
	gs, _ := g1Objects()
	var eps []ep
	for i := range 40 {
		eps = append(eps, ep{addr: fmt.Sprintf("10.1.1.%d", i+1), ready: true})
	}
	sl := []*discoveryv1.EndpointSlice{slice("edge", "g1", "g1-a", "http", 80, eps...)}
	var svcs []*corev1.Service
	for i := range 13 { // 40 replicas * (1 + 13*8) = 4,200 > 4,095; 12 Services: 3,880
		svcs = append(svcs, tenantL4(fmt.Sprintf("s%02d", i), i+1, vipRange(fmt.Sprintf("198.51.%d.1", i), 8), 7000))
	}
	snap, _, problems := Build(state(gs, sl, svcs), Options{})
	if len(snap.Services) != 12 {
		t.Errorf("%d Services served, want 12", len(snap.Services))
	}
	got := problemsOf(problems, "Service tenant/s12")
	if len(got) != 1 || got[0].Reason != model.ReasonGroupFull {
		t.Errorf("problems of the newest Service %v, want GroupFull", got)
	}
}

// A tenant's L4 Service that names a node's address as its VIP (unchecked,
// every edge put it on lo, and the VRRP owner answered ARP for it) gets
// nothing of it; its other VIPs are served. A link-local address is no VIP.
func TestBuildRefusesANodesAddressAsVIP(t *testing.T) {
	gs, gsl := g1Objects()
	node := &corev1.Node{ObjectMeta: meta("", "n9", 0), Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: "10.1.0.9"}}}}
	svcs := []*corev1.Service{tenantL4("thief", 1, addrs("10.1.0.9", "198.51.100.5"), 7000),
		tenantL4("linklocal", 2, addrs("169.254.0.1"), 7000)}
	snap, _, problems := Build(state(gs, gsl, node, svcs), Options{})
	for _, s := range snap.Services {
		if s.Name == "tenant/thief" && !slices.Equal(s.VIPs, addrs("198.51.100.5")) {
			t.Errorf("tenant/thief serves %v, want 198.51.100.5 alone", s.VIPs)
		}
		if s.Name == "tenant/linklocal" && len(s.VIPs) != 0 {
			t.Errorf("tenant/linklocal serves %v, want no VIP", s.VIPs)
		}
	}
	for _, name := range []string{"Service tenant/thief", "Service tenant/linklocal"} {
		if got := problemsOf(problems, name); len(got) != 1 || got[0].Reason != model.ReasonInvalidVIP {
			t.Errorf("problems of %s: %v, want one InvalidVIP", name, got)
		}
	}
}
