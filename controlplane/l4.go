package controlplane

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
)

// l4Acc is an L4 Service being built: its ports' upstreams are identities until
// snapshot names them.
type l4Acc struct {
	svc       model.Service
	upstreams []string // by port index
}

// l4Services translates the L4 Services (IsL4Service), oldest first, so that a
// VIP two of them ask for goes to the older one. Each is served by the group its
// portico.io/group annotation names ("name" in its namespace, or
// "namespace/name"), else by defaultGroup. A Service that names no existing
// group, or has no valid VIP yet, is reported or waits for the leader's
// allocation; a port that is reserved (Options.ReservedPorts, the group's HTTP
// and HTTPS ports) is refused, and so is a Service its group's edges cannot
// hold beside the older ones (groupLoad); the rest are served. A VIP of a
// Service that poolsFor gives pools (outside the operator's namespaces) must
// be in one that allows the Service.
func (b *builder) l4Services(defaultGroup string, reserved map[model.Port]string, poolsFor func(*corev1.Service) *Pools) {
	for _, s := range sortedServices(b.st.Services, IsL4Service) {
		b.admitViews(s) // the Gateways older than s take their place first
		svc := model.Service{Name: key(s), ClientIPAffinity: s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP}
		group := defaultGroup
		field := "metadata.annotations[" + v1alpha1.AnnotationGroup + "]"
		if g, ok := s.Annotations[v1alpha1.AnnotationGroup]; ok {
			group = groupRef(g, s.Namespace)
		}
		switch {
		case group == "":
			b.problem("Service", s, field, model.ReasonGroupNotFound, "no %s annotation and no default group; not served", v1alpha1.AnnotationGroup)
			continue
		case b.groupsOut[group] == nil:
			b.problem("Service", s, field, model.ReasonGroupNotFound, "group %s does not exist; not served", group)
			continue
		}
		svc.Group = group
		pools := poolsFor(s)
		vips, field := b.groupVIPs(s)
		for _, a := range vips {
			if pools != nil {
				if _, ok := pools.pooled(a, s); !ok {
					b.problem("Service", s, field, model.ReasonVIPNotInPool,
						"VIP %s is in no VIP pool that allows this Service; not applied", a)
					continue
				}
			}
			if o, taken := b.vipOwner[a]; taken {
				b.problem("Service", s, field, model.ReasonVIPConflict,
					"VIP %s already belongs to %s; not applied", a, o)
				continue
			}
			svc.VIPs = append(svc.VIPs, a)
		}
		if v, ok := s.Annotations[v1alpha1.AnnotationProxyProtocol]; ok {
			on, err := strconv.ParseBool(strings.TrimSpace(v))
			if err != nil {
				b.problem("Service", s, "metadata.annotations["+v1alpha1.AnnotationProxyProtocol+"]", model.ReasonInvalidAnnotation,
					"%q is not true or false; no PROXY protocol", v)
			}
			svc.ProxyProtocol = on
		}
		if v, ok := s.Annotations[v1alpha1.AnnotationUDPIdleTimeout]; ok {
			d, err := time.ParseDuration(strings.TrimSpace(v))
			if err != nil || d < time.Second || d > time.Hour {
				b.problem("Service", s, "metadata.annotations["+v1alpha1.AnnotationUDPIdleTimeout+"]", model.ReasonInvalidAnnotation,
					"%q is not a duration from 1s to 1h; %ds is used", v, model.DefaultUDPIdleTimeout)
			} else {
				svc.UDPIdleTimeout = uint32(d / time.Second)
			}
		}
		acc := l4Acc{svc: svc}
		type port struct {
			p  model.ServicePort
			id string
		}
		g := b.groupsOut[group]
		var ports []port
		for i := range s.Spec.Ports {
			sp := &s.Spec.Ports[i]
			proto, ok := b.portProtocol(s, i)
			if !ok {
				continue
			}
			if by := reservedBy(reserved, g, model.Port{Protocol: proto, Port: uint16(sp.Port)}); by != "" {
				b.problem("Service", s, fmt.Sprintf("spec.ports[%d].port", i), model.ReasonPortReserved,
					"%s/%d is reserved on the edges (%s); not served", proto, sp.Port, by)
				continue
			}
			num := strconv.Itoa(int(sp.Port))
			id := b.upstreamOf(s.Namespace+"-"+s.Name+"-"+num+"-"+strings.ToLower(string(proto)),
				"l4|"+svc.Name+"|"+string(proto)+"|"+num, b.serviceEndpoints(svc.Name, sp), true)
			ports = append(ports, port{model.ServicePort{Protocol: proto, Port: uint16(sp.Port)}, id})
		}
		slices.SortFunc(ports, func(x, y port) int {
			return cmp.Or(cmp.Compare(x.p.Protocol, y.p.Protocol), cmp.Compare(x.p.Port, y.p.Port))
		})
		if len(ports) == 0 {
			continue // nothing to serve (each port's refusal is reported): its VIPs stay free
		}
		if full := b.load(group).add(svc.VIPs, len(ports)); full != "" {
			b.problem("Service", s, "spec", model.ReasonGroupFull,
				"group %s's edges cannot hold it beside the older Services (%s); not served", group, full)
			continue
		}
		for _, a := range svc.VIPs {
			b.vipOwner[a] = svc.Name
		}
		for _, p := range ports {
			acc.svc.Ports = append(acc.svc.Ports, p.p)
			acc.upstreams = append(acc.upstreams, p.id)
		}
		b.l4 = append(b.l4, acc)
	}
	slices.SortFunc(b.l4, func(x, y l4Acc) int { return cmp.Compare(x.svc.Name, y.svc.Name) })
}

// reservedBy says what uses port on group g's edges ("" if nothing does):
// reserved, or g's HTTP and HTTPS listeners, which listen on every address.
func reservedBy(reserved map[model.Port]string, g *model.Group, p model.Port) string {
	if by := reserved[p]; by != "" {
		return by
	}
	if p.Protocol == model.TCP && p.Port != 0 && (p.Port == g.HTTPPort || p.Port == g.HTTPSPort) {
		return "the group's HTTP and HTTPS"
	}
	return ""
}

// groupLoad is what a group's edges hold so far: its own VIPs and those of the
// L4 Services given to it, against what xdp_lb's maps and one VRRP advert per
// address family take (model.MaxGroupVIPs and the rest). A group over them
// would fail every edge's Apply at once, or stop VRRP.
type groupLoad struct {
	addrs, keys, replicas int
	family                [2]int // VIP addresses: IPv4, IPv6
}

// load is what group's edges hold so far (its own VIPs first).
func (b *builder) load(group string) *groupLoad {
	if b.loads == nil {
		b.loads = map[string]*groupLoad{}
	}
	l := b.loads[group]
	if l == nil {
		l = newGroupLoad(b.groupsOut[group])
		b.loads[group] = l
	}
	return l
}

// newGroupLoad is the load of g's own VIPs and ports.
func newGroupLoad(g *model.Group) *groupLoad {
	l := &groupLoad{replicas: len(g.Replicas)}
	l.add(g.VIPs, len(g.Ports))
	return l
}

// add adds VIPs with a number of ports and returns "", or, when they do not
// fit, which limit they would pass (and leaves the load as it was). Each VIP
// takes a key per port and two more, as the data plane steers them: its other
// TCP and UDP ports closed, or, with no port named, every port of both.
func (l *groupLoad) add(vips []netip.Addr, ports int) string {
	n := *l
	n.addrs += len(vips)
	n.keys += len(vips) * (ports + 2)
	for _, a := range vips {
		if a.Is4() {
			n.family[0]++
		} else {
			n.family[1]++
		}
	}
	switch {
	case n.addrs > model.MaxGroupVIPs:
		return fmt.Sprintf("%d VIP addresses, the data plane holds %d", n.addrs, model.MaxGroupVIPs)
	case n.keys > model.MaxGroupVIPKeys:
		return fmt.Sprintf("%d VIP ports, the data plane holds %d", n.keys, model.MaxGroupVIPKeys)
	case n.addrs*n.replicas > model.MaxGroupBackends:
		return fmt.Sprintf("%d VIP addresses for %d replicas, the data plane holds %d pairs", n.addrs, n.replicas, model.MaxGroupBackends)
	case n.family[0] > model.MaxVRRPAddrs4:
		return fmt.Sprintf("%d IPv4 VIPs, a VRRP advert carries %d", n.family[0], model.MaxVRRPAddrs4)
	case n.family[1] > model.MaxVRRPAddrs6:
		return fmt.Sprintf("%d IPv6 VIPs, a VRRP advert carries %d", n.family[1], model.MaxVRRPAddrs6)
	}
	*l = n
	return ""
}
