package controlplane

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

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
// allocation; the rest are served.
func (b *builder) l4Services(defaultGroup string) {
	for _, s := range sortedServices(b.st.Services, IsL4Service) {
		svc := model.Service{Name: key(s), ClientIPAffinity: s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP}
		group := defaultGroup
		field := "metadata.annotations[" + AnnotationGroup + "]"
		if g, ok := s.Annotations[AnnotationGroup]; ok {
			group = groupRef(g, s.Namespace)
		}
		switch {
		case group == "":
			b.problem("Service", s, field, model.ReasonGroupNotFound, "no %s annotation and no default group; not served", AnnotationGroup)
			continue
		case b.groupsOut[group] == nil:
			b.problem("Service", s, field, model.ReasonGroupNotFound, "group %s does not exist; not served", group)
			continue
		}
		svc.Group = group
		for _, a := range b.groupVIPs(s) {
			if o, taken := b.vipOwner[a]; taken {
				b.problem("Service", s, "metadata.annotations["+AnnotationVIP+"]", model.ReasonVIPConflict,
					"VIP %s already belongs to %s; not applied", a, o)
				continue
			}
			b.vipOwner[a] = svc.Name
			svc.VIPs = append(svc.VIPs, a)
		}
		if v, ok := s.Annotations[AnnotationProxyProtocol]; ok {
			on, err := strconv.ParseBool(strings.TrimSpace(v))
			if err != nil {
				b.problem("Service", s, "metadata.annotations["+AnnotationProxyProtocol+"]", model.ReasonInvalidAnnotation,
					"%q is not true or false; no PROXY protocol", v)
			}
			svc.ProxyProtocol = on
		}
		if v, ok := s.Annotations[AnnotationUDPIdleTimeout]; ok {
			d, err := time.ParseDuration(strings.TrimSpace(v))
			if err != nil || d < time.Second || d > time.Hour {
				b.problem("Service", s, "metadata.annotations["+AnnotationUDPIdleTimeout+"]", model.ReasonInvalidAnnotation,
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
		var ports []port
		for i := range s.Spec.Ports {
			sp := &s.Spec.Ports[i]
			proto, ok := b.portProtocol(s, i)
			if !ok {
				continue
			}
			num := strconv.Itoa(int(sp.Port))
			id := b.upstream(s.Namespace+"-"+s.Name+"-"+num+"-"+strings.ToLower(string(proto)),
				"l4|"+svc.Name+"|"+string(proto)+"|"+num, b.serviceEndpoints(svc.Name, sp))
			ports = append(ports, port{model.ServicePort{Protocol: proto, Port: uint16(sp.Port)}, id})
		}
		slices.SortFunc(ports, func(x, y port) int {
			return cmp.Or(cmp.Compare(x.p.Protocol, y.p.Protocol), cmp.Compare(x.p.Port, y.p.Port))
		})
		for _, p := range ports {
			acc.svc.Ports = append(acc.svc.Ports, p.p)
			acc.upstreams = append(acc.upstreams, p.id)
		}
		b.l4 = append(b.l4, acc)
	}
	slices.SortFunc(b.l4, func(x, y l4Acc) int { return cmp.Compare(x.svc.Name, y.svc.Name) })
}
