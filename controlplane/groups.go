package controlplane

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
)

// IsGroup reports whether a Service is a Portico group: labelled
// portico.io/group=true (of any type; a LoadBalancer group's status shows its VIPs).
func IsGroup(s *corev1.Service) bool {
	return s.Labels[v1alpha1.LabelGroup] == "true"
}

// IsL4Service reports whether a Service is an L4 Service Portico serves: a
// LoadBalancer Service of class portico.io/vip that is not a group.
func IsL4Service(s *corev1.Service) bool {
	return !IsGroup(s) && s.Spec.Type == corev1.ServiceTypeLoadBalancer && s.Spec.LoadBalancerClass != nil &&
		*s.Spec.LoadBalancerClass == v1alpha1.LoadBalancerClass
}

// allowedGroups is st with every group Service outside namespaces (empty: none
// is) turned into a plain Service, a copy without the portico.io/group label, and
// a problem for each: a tenant cannot make a group, attract other teams'
// selector-bound Ingresses and write its address into their status.
func allowedGroups(st State, namespaces []string) (State, []model.Problem) {
	if len(namespaces) == 0 {
		return st, nil
	}
	var problems []model.Problem
	for i, s := range st.Services {
		if !IsGroup(s) || slices.Contains(namespaces, s.Namespace) {
			continue
		}
		if len(problems) == 0 {
			st.Services = slices.Clone(st.Services)
		}
		c := *s
		c.Labels = maps.Clone(s.Labels)
		delete(c.Labels, v1alpha1.LabelGroup)
		st.Services[i] = &c
		problems = append(problems, model.Problem{Object: "Service " + key(s), Field: "metadata.labels[" + v1alpha1.LabelGroup + "]",
			Reason: model.ReasonGroupNotAllowed,
			Detail: fmt.Sprintf("groups are served only in namespaces %s; a plain Service here", strings.Join(namespaces, ", "))})
	}
	return st, problems
}

// sortedGroups returns the group Services oldest first.
func sortedGroups(services []*corev1.Service) []*corev1.Service {
	return sortedServices(services, IsGroup)
}

// sortedVIPHolders returns the Services that hold VIPs, groups and L4
// Services, oldest first.
func sortedVIPHolders(services []*corev1.Service) []*corev1.Service {
	return sortedServices(services, func(s *corev1.Service) bool { return IsGroup(s) || IsL4Service(s) })
}

func sortedServices(services []*corev1.Service, keep func(*corev1.Service) bool) []*corev1.Service {
	var out []*corev1.Service
	for _, s := range services {
		if keep(s) {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(x, y *corev1.Service) int { return older(x, y) })
	return out
}

// vipAnnotation returns the VIPs a Service names and the field that names
// them: its portico.io/vip annotation, else the alias annotation, else, for a
// LoadBalancer Service, spec.loadBalancerIP (deprecated by Kubernetes, still
// what many manifests set). Any of them is honoured only where an address
// from it may be used (poolsFor, the nodes' addresses).
func vipAnnotation(s *corev1.Service) (value, field string, ok bool) {
	if v, ok := s.Annotations[v1alpha1.AnnotationVIP]; ok {
		return v, "metadata.annotations[" + v1alpha1.AnnotationVIP + "]", true
	}
	if v, ok := s.Annotations[v1alpha1.AnnotationVIPAlias]; ok {
		return v, "metadata.annotations[" + v1alpha1.AnnotationVIPAlias + "]", true
	}
	if s.Spec.Type == corev1.ServiceTypeLoadBalancer && s.Spec.LoadBalancerIP != "" {
		return s.Spec.LoadBalancerIP, "spec.loadBalancerIP", true
	}
	return "", "", false
}

// parseVIPs parses a comma-separated VIP list: at most model.MaxVIPsPerFamily
// addresses per family, none twice.
func parseVIPs(v string) ([]netip.Addr, error) {
	var out []netip.Addr
	for f := range strings.SplitSeq(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("%q is not an IP address", f)
		}
		if a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() || a.IsLoopback() || a.IsLinkLocalUnicast() ||
			a.Unmap() == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
			return nil, fmt.Errorf("%s is not a usable unicast address", a)
		}
		a = a.Unmap()
		same := 0
		for _, o := range out {
			if o == a {
				return nil, fmt.Errorf("%s twice", a)
			}
			if o.Is4() == a.Is4() {
				same++
			}
		}
		if same == model.MaxVIPsPerFamily {
			return nil, fmt.Errorf("more than %d %s addresses", model.MaxVIPsPerFamily, family(a))
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no address in %q", v)
	}
	slices.SortFunc(out, func(x, y netip.Addr) int { return x.Compare(y) })
	return out, nil
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// groupVIPs is the valid VIPs a Service names (vipAnnotation) and the field
// that names them, reporting anything wrong with them.
func (b *builder) groupVIPs(s *corev1.Service) ([]netip.Addr, string) {
	v, field, ok := vipAnnotation(s)
	if !ok {
		return nil, ""
	}
	aliasField := "metadata.annotations[" + v1alpha1.AnnotationVIPAlias + "]"
	if alias, aok := s.Annotations[v1alpha1.AnnotationVIPAlias]; aok && field != aliasField && alias != v {
		b.problem("Service", s, aliasField, model.ReasonInvalidVIP,
			"differs from %s (%q); %s is used", v1alpha1.AnnotationVIP, v, v1alpha1.AnnotationVIP)
	}
	if lb := s.Spec.LoadBalancerIP; lb != "" && field != "spec.loadBalancerIP" && s.Spec.Type == corev1.ServiceTypeLoadBalancer {
		if lbv, err := parseVIPs(lb); err != nil || !slices.Contains(mustParseVIPs(v), lbv[0]) {
			b.problem("Service", s, "spec.loadBalancerIP", model.ReasonInvalidVIP,
				"%q is not among the VIPs of %s (%q); %s is used", lb, field, v, field)
		}
	}
	vips, err := parseVIPs(v)
	if err != nil {
		b.problem("Service", s, field, model.ReasonInvalidVIP, "%v", err)
		return nil, field
	}
	// A node's address is never a VIP: every edge would put it on lo and answer
	// ARP for it, taking the node's (or the API server's) traffic.
	return slices.DeleteFunc(vips, func(a netip.Addr) bool {
		node, is := b.nodeByIP[a]
		if is {
			b.problem("Service", s, field, model.ReasonInvalidVIP,
				"%s is the address of node %s; not applied", a, node)
		}
		return is
	}), field
}

// mustParseVIPs is parseVIPs' addresses, none when it fails.
func mustParseVIPs(v string) []netip.Addr {
	vips, _ := parseVIPs(v)
	return vips
}

// parseVRID parses a VRRP virtual router id.
func parseVRID(v string) (uint8, error) {
	n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 8)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("%q is not a VRRP id in 1..255", v)
	}
	return uint8(n), nil
}

// parseUnmatchedHost parses the value of v1alpha1.AnnotationUnmatchedHost.
func parseUnmatchedHost(v string) (model.UnmatchedHost, error) {
	switch strings.TrimSpace(v) {
	case "close":
		return model.UnmatchedHostClose, nil
	case "not-found":
		return model.UnmatchedHostNotFound, nil
	}
	return model.UnmatchedHostClose, fmt.Errorf("%q is not close or not-found; unmatched hosts are closed", v)
}

// portProtocol is the protocol of a Service's port i (TCP when unset); SCTP is
// reported, and not served.
func (b *builder) portProtocol(s *corev1.Service, i int) (model.Protocol, bool) {
	p := s.Spec.Ports[i].Protocol
	switch p {
	case "", corev1.ProtocolTCP:
		return model.TCP, true
	case corev1.ProtocolUDP:
		return model.UDP, true
	}
	b.problem("Service", s, fmt.Sprintf("spec.ports[%d].protocol", i), model.ReasonUnsupportedProtocol, "protocol %s is not served", p)
	return "", false
}

func (b *builder) groups() {
	b.groupList = sortedGroups(b.st.Services)
	b.vipOwner = map[netip.Addr]string{}
	vipOwner := b.vipOwner
	vridOwner := map[uint8]string{}
	for _, s := range b.groupList {
		g := &model.Group{Name: key(s)}
		vips, field := b.groupVIPs(s)
		for _, a := range vips {
			if o, taken := vipOwner[a]; taken {
				b.problem("Service", s, field, model.ReasonVIPConflict,
					"VIP %s already belongs to group %s; not applied", a, o)
				continue
			}
			vipOwner[a] = g.Name
			g.VIPs = append(g.VIPs, a)
		}
		if v, ok := s.Annotations[v1alpha1.AnnotationVRID]; ok {
			id, err := parseVRID(v)
			switch {
			case err != nil:
				b.problem("Service", s, "metadata.annotations["+v1alpha1.AnnotationVRID+"]", model.ReasonInvalidAnnotation, "%v", err)
			case vridOwner[id] != "":
				b.problem("Service", s, "metadata.annotations["+v1alpha1.AnnotationVRID+"]", model.ReasonVRIDConflict,
					"VRID %d already belongs to group %s; not applied", id, vridOwner[id])
			default:
				vridOwner[id] = g.Name
				g.VRID = id
			}
		}
		if v, ok := s.Annotations[v1alpha1.AnnotationUnmatchedHost]; ok {
			u, err := parseUnmatchedHost(v)
			if err != nil {
				b.problem("Service", s, "metadata.annotations["+v1alpha1.AnnotationUnmatchedHost+"]", model.ReasonInvalidAnnotation, "%v", err)
			}
			g.UnmatchedHost = u
		}
		for i, p := range s.Spec.Ports {
			proto, ok := b.portProtocol(s, i)
			if !ok {
				continue
			}
			mp := model.Port{Protocol: proto, Port: uint16(p.Port)}
			if !slices.Contains(g.Ports, mp) {
				g.Ports = append(g.Ports, mp)
			}
			if proto == model.TCP && p.Name == "http" {
				g.HTTPPort = mp.Port
			}
			if proto == model.TCP && p.Name == "https" {
				g.HTTPSPort = mp.Port
			}
		}
		slices.SortFunc(g.Ports, func(x, y model.Port) int {
			return cmp.Or(cmp.Compare(x.Protocol, y.Protocol), cmp.Compare(x.Port, y.Port))
		})
		g.Replicas = b.replicas(s)
		b.groupsOut[g.Name] = g
	}
}

// replicas lists a group's agents from its EndpointSlices: ready endpoints are Ready,
// terminating ones that still serve (or do not say) are Draining, the rest are left out.
// A ready agent on a node taken out of service is Draining too (leavingService): its
// pod is a DaemonSet's, which kubectl drain leaves running, so its endpoint never
// turns terminating.
func (b *builder) replicas(s *corev1.Service) []model.Replica {
	byAddr := map[netip.Addr]model.Replica{}
	for _, es := range b.slices[key(s)] {
		if es.AddressType == discoveryv1.AddressTypeFQDN {
			continue
		}
		for _, ep := range es.Endpoints {
			var st model.ReplicaState
			switch {
			case ep.Conditions.Terminating != nil && *ep.Conditions.Terminating:
				if ep.Conditions.Serving != nil && !*ep.Conditions.Serving {
					continue
				}
				st = model.Draining
			case ep.Conditions.Ready == nil || *ep.Conditions.Ready:
				st = model.Ready
			default:
				continue
			}
			for _, a := range ep.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil {
					continue
				}
				ip = ip.Unmap()
				node := ""
				if ep.NodeName != nil {
					node = *ep.NodeName
				} else {
					node = b.nodeByIP[ip]
				}
				r := model.Replica{Node: node, Addr: ip, Weight: 1, State: st}
				if st == model.Ready && leavingService(b.nodes[node]) {
					r.State = model.Draining
				}
				if old, ok := byAddr[ip]; ok && old.State == model.Ready {
					continue // listed twice (slices overlap during updates): Ready wins
				}
				byAddr[ip] = r
			}
		}
	}
	out := make([]model.Replica, 0, len(byAddr))
	for _, r := range byAddr {
		out = append(out, r)
	}
	slices.SortFunc(out, func(x, y model.Replica) int { return x.Addr.Compare(y.Addr) })
	if len(out) == 0 {
		return nil
	}
	return out
}

// leavingService reports whether an operator is taking node n out of service: it is
// cordoned (kubectl cordon, the first step of kubectl drain) or labelled
// node.kubernetes.io/exclude-from-external-load-balancers. Its replica keeps the flows
// it has and gets no new ones, so the node can be stopped once they are done. A
// draining VIP owner keeps the VIP: a new owner would not know which connections
// the old one pinned to the draining replica (they would be re-picked and reset);
// its agent's SIGTERM, when the node is stopped, hands the VIP over.
func leavingService(n *corev1.Node) bool {
	if n == nil {
		return false
	}
	_, excluded := n.Labels[corev1.LabelNodeExcludeBalancers]
	return n.Spec.Unschedulable || excluded
}
