package controlplane

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/portico-edge/portico/controlplane/model"
)

// gatewayAddresses picks a Gateway's addresses (see the package's Gateway API
// comment) and claims them: shared says they are its group's VIPs, which it
// shares with the group's Ingresses. A reason says why it has none: Gateway
// API's UnsupportedAddress (an address of another type, or not an address),
// AddressNotUsable (one another object holds, or that no pool allows) or
// AddressNotAssigned (no pool has a free address for it).
func (b *builder) gatewayAddresses(gw *gatewayv1.Gateway, g *model.Group, pools *Pools) (vips []netip.Addr, shared bool, reason, msg string) {
	var text []string
	for i, sa := range gw.Spec.Addresses {
		if sa.Type != nil && *sa.Type != gatewayv1.IPAddressType {
			return nil, false, string(gatewayv1.GatewayReasonUnsupportedAddress),
				fmt.Sprintf("spec.addresses[%d]: type %s is not served (IPAddress is)", i, *sa.Type)
		}
		if sa.Value != "" { // an IPAddress without a value asks for one (GatewayAddressEmpty)
			text = append(text, sa.Value)
		}
	}
	if len(text) > 0 {
		want, err := parseVIPs(strings.Join(text, ","))
		if err != nil || len(want) == 0 {
			return nil, false, string(gatewayv1.GatewayReasonUnsupportedAddress), fmt.Sprintf("spec.addresses: %v", err)
		}
		ofGroup := 0
		for _, a := range want {
			if slices.Contains(g.VIPs, a) {
				ofGroup++
			}
		}
		switch {
		case ofGroup == len(want) && pools != nil && len(b.pools.List) > 0:
			// A tenant's Gateway on the group's VIPs would share their hosts
			// (the catch-all too) with the operator's: it gets its own.
			return nil, false, string(gatewayv1.GatewayReasonAddressNotUsable),
				"spec.addresses: the group's VIPs are its operator's namespaces' alone; leave spec.addresses out for an address of its own"
		case ofGroup == len(want):
			return g.VIPs, true, "", ""
		case ofGroup > 0:
			return nil, false, string(gatewayv1.GatewayReasonUnsupportedAddress),
				fmt.Sprintf("spec.addresses: either its group's VIPs (%v) or addresses of its own, not both", g.VIPs)
		}
		for _, a := range want {
			if why := b.addressTaken(a, gw, pools, true); why != "" {
				return nil, false, string(gatewayv1.GatewayReasonAddressNotUsable), fmt.Sprintf("spec.addresses: %s %s", a, why)
			}
		}
		slices.SortFunc(want, netip.Addr.Compare)
		b.claim(gw, want)
		return want, false, "", ""
	}
	if len(b.pools.List) == 0 {
		return g.VIPs, true, "", "" // no pool to take one from: the group's, as before pools
	}
	// The addresses its status gives: an earlier build's allocation, kept.
	var kept []netip.Addr
	family := map[bool]int{}
	for _, sa := range gw.Status.Addresses {
		a, err := netip.ParseAddr(sa.Value)
		if err != nil || (sa.Type != nil && *sa.Type != gatewayv1.IPAddressType) {
			continue
		}
		a = a.Unmap()
		if !slices.Contains(g.VIPs, a) && !slices.Contains(kept, a) && family[a.Is4()] < model.MaxVIPsPerFamily &&
			b.addressTaken(a, gw, pools, false) == "" {
			kept = append(kept, a)
			family[a.Is4()]++
		}
	}
	if len(kept) > 0 {
		slices.SortFunc(kept, netip.Addr.Compare)
		b.claim(gw, kept)
		return kept, false, "", ""
	}
	// The lowest free address of each family, from the first pool that allows
	// it and has one (the rule AllocateVIPs applies to Services).
	used := map[netip.Addr]bool{}
	for a := range b.nodeByIP {
		used[a] = true
	}
	for a := range b.vipOwner {
		used[a] = true
	}
	for a := range b.annotatedVIPs() {
		used[a] = true
	}
	vips, allowed, _ := b.pools.allocate(gw, used)
	switch {
	case !allowed:
		return nil, false, string(gatewayv1.GatewayReasonAddressNotAssigned), "no VIP pool that assigns addresses allows this Gateway"
	case len(vips) == 0:
		return nil, false, string(gatewayv1.GatewayReasonAddressNotAssigned), "no free address in the VIP pools that allow this Gateway"
	}
	b.claim(gw, vips)
	return vips, false, "", ""
}

// addressTaken says why a Gateway may not have address a ("" when it may): a
// node's, another object's, or in no pool that allows it (pools nil: any
// address, the operator's namespaces). annotated counts the addresses L4
// Services and groups name in their annotations, applied or not.
func (b *builder) addressTaken(a netip.Addr, gw *gatewayv1.Gateway, pools *Pools, annotated bool) string {
	if n, ok := b.nodeByIP[a]; ok {
		return "is node " + n + "'s address"
	}
	if o, ok := b.vipOwner[a]; ok {
		return "already belongs to " + o
	}
	if annotated {
		if o, ok := b.annotatedVIPs()[a]; ok {
			return "is named by Service " + o + "'s VIP annotation"
		}
	}
	if pools != nil {
		if _, ok := pools.pooled(a, gw); !ok {
			return "is in no VIP pool that allows this Gateway"
		}
	}
	return ""
}

// annotatedVIPs are the addresses groups and L4 Services name (vipAnnotation),
// by Service.
func (b *builder) annotatedVIPs() map[netip.Addr]string {
	if b.annotated == nil {
		b.annotated = map[netip.Addr]string{}
		for _, s := range sortedVIPHolders(b.st.Services) {
			if v, _, ok := vipAnnotation(s); ok {
				vips, _ := parseVIPs(v)
				for _, a := range vips {
					if _, seen := b.annotated[a]; !seen {
						b.annotated[a] = key(s)
					}
				}
			}
		}
	}
	return b.annotated
}

// claim records a Gateway's addresses as its own.
func (b *builder) claim(gw *gatewayv1.Gateway, vips []netip.Addr) {
	for _, a := range vips {
		b.vipOwner[a] = kindGateway + " " + key(gw)
	}
}

// gatewayView makes a Gateway with addresses of its own a View, on the ports
// of its accepted listeners (none: no View), pending its admission.
func (b *builder) gatewayView(a *gwAcc) {
	v := model.View{Name: a.view, Group: a.group, VIPs: a.vips}
	for _, l := range a.listeners {
		p := model.Port{Protocol: model.TCP, Port: uint16(l.l.Port)}
		if l.accepted && !slices.Contains(v.Ports, p) {
			v.Ports = append(v.Ports, p)
			if l.l.Protocol == gatewayv1.HTTPSProtocolType {
				v.TLSPorts = append(v.TLSPorts, p.Port)
			}
		}
	}
	if len(v.Ports) == 0 {
		return
	}
	slices.SortFunc(v.Ports, func(x, y model.Port) int { return int(x.Port) - int(y.Port) })
	slices.Sort(v.TLSPorts)
	b.pendingViews = append(b.pendingViews, pendingView{a, v}) // oldest first: gateways' order
}

// pendingView is a View not yet admitted to its group's data plane.
type pendingView struct {
	a *gwAcc
	v model.View
}

// admitViews admits the pending Views whose Gateways are older than before
// (every one when before is nil) to their groups' data plane, oldest first,
// as l4Services admits L4 Services: the older object keeps its place, and one
// that does not fit beside the older ones is not served (Programmed false,
// NoResources; its hosts left out), so a new Gateway never pushes out an
// older L4 Service, nor the other way round.
func (b *builder) admitViews(before metav1.Object) {
	for len(b.pendingViews) > 0 {
		pv := b.pendingViews[0]
		if before != nil && older(pv.a.gw, before) > 0 {
			return
		}
		b.pendingViews = b.pendingViews[1:]
		if full := b.load(pv.a.group).add(pv.v.VIPs, len(pv.v.Ports)); full != "" {
			why := fmt.Sprintf("group %s's edges cannot hold it beside the older Gateways and L4 Services (%s)", pv.a.group, full)
			b.problem(kindGateway, pv.a.gw, "spec", model.ReasonGroupFull, "%s; not served", why)
			st := b.gw.Gateways[key(pv.a.gw)]
			for i, c := range st.Conditions {
				if c.Type == string(gatewayv1.GatewayConditionProgrammed) {
					st.Conditions[i] = condition(c.Type, false, string(gatewayv1.GatewayReasonNoResources), why, pv.a.gw.Generation)
				}
			}
			b.gw.Gateways[key(pv.a.gw)] = st
			for k := range b.servers {
				if k.view == pv.v.Name && k.group == pv.v.Group {
					delete(b.servers, k)
				}
			}
			continue
		}
		b.views = append(b.views, pv.v)
	}
}

// GatewayAddresses are the addresses the Gateways of a build hold: none of
// them is allocated to a Service.
func GatewayAddresses(gs GatewayStatuses) []netip.Addr {
	var out []netip.Addr
	for _, st := range gs.Gateways {
		for _, sa := range st.Addresses {
			if a, err := netip.ParseAddr(sa.Value); err == nil {
				out = append(out, a.Unmap())
			}
		}
	}
	return out
}
