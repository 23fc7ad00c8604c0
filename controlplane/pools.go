package controlplane

import (
	"cmp"
	"fmt"
	"math"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
)

// Pools are where a Service's VIPs may come from (the operator's VIPPools and
// --vip-pool flags, in order of preference), and the namespaces' labels their
// selectors read.
type Pools struct {
	List []Pool
	// NamespaceLabels are the labels of each namespace, for NamespaceSelectors.
	NamespaceLabels map[string]labels.Set
}

// vipPools parses the operator's VIPPools after the flags' pools (by name: the
// same objects give the same pools, in the same order, on every node). A pool
// whose addresses, exclusions or selectors do not parse is reported and not
// used at all: a half-read pool could let more Services in than it says.
func vipPools(flags []Pool, objs []*v1alpha1.VIPPool, namespaces []*corev1.Namespace) (Pools, []model.Problem) {
	out := Pools{List: slices.Clone(flags), NamespaceLabels: make(map[string]labels.Set, len(namespaces))}
	for _, ns := range namespaces {
		out.NamespaceLabels[ns.Name] = ns.Labels
	}
	objs = slices.Clone(objs)
	slices.SortFunc(objs, func(x, y *v1alpha1.VIPPool) int { return cmp.Compare(x.Name, y.Name) })
	var problems []model.Problem
	for _, o := range objs {
		ps, err := poolsOf(o)
		if err != nil {
			problems = append(problems, model.Problem{Object: "VIPPool " + o.Name, Field: "spec", Reason: model.ReasonInvalidPool,
				Detail: err.Error() + "; the pool is not used"})
			continue
		}
		out.List = append(out.List, ps...)
	}
	return out, problems
}

// poolsOf is a VIPPool's Pools, one per prefix.
func poolsOf(o *v1alpha1.VIPPool) ([]Pool, error) {
	base := Pool{Name: o.Name, Manual: o.Spec.AutoAssign != nil && !*o.Spec.AutoAssign, Restricted: o.Spec.ServiceAllocation != nil}
	for _, e := range o.Spec.Exclude {
		x, err := prefixOrAddr(e)
		if err != nil {
			return nil, fmt.Errorf("exclude %q: %w", e, err)
		}
		base.Exclude = append(base.Exclude, x)
	}
	if a := o.Spec.ServiceAllocation; a != nil {
		base.Namespaces = a.Namespaces
		var err error
		if base.NamespaceSelectors, err = selectors(a.NamespaceSelectors); err != nil {
			return nil, fmt.Errorf("serviceAllocation.namespaceSelectors: %w", err)
		}
		if base.ServiceSelectors, err = selectors(a.ServiceSelectors); err != nil {
			return nil, fmt.Errorf("serviceAllocation.serviceSelectors: %w", err)
		}
	}
	if len(o.Spec.Addresses) == 0 {
		return nil, fmt.Errorf("no addresses")
	}
	var out []Pool
	for _, s := range o.Spec.Addresses {
		pre, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("address %q: %w", s, err)
		}
		p := base
		p.CIDR = pre.Masked()
		out = append(out, p)
	}
	return out, nil
}

func prefixOrAddr(s string) (netip.Prefix, error) {
	if x, err := netip.ParsePrefix(s); err == nil {
		return x.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("not an address or a prefix")
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

func selectors(ls []metav1.LabelSelector) ([]labels.Selector, error) {
	out := make([]labels.Selector, 0, len(ls))
	for i := range ls {
		sel, err := metav1.LabelSelectorAsSelector(&ls[i])
		if err != nil {
			return nil, fmt.Errorf("[%d]: %w", i, err)
		}
		out = append(out, sel)
	}
	return out, nil
}

// allows reports whether Service s (or Gateway) may take addresses of p: its
// namespace is listed or selected (when the pool names namespaces), and it is
// selected (when the pool selects Services; a Gateway by its labels too).
func (p Pool) allows(s metav1.Object, nsLabels map[string]labels.Set) bool {
	if !p.Restricted {
		return true
	}
	if len(p.Namespaces) > 0 || len(p.NamespaceSelectors) > 0 {
		in := slices.Contains(p.Namespaces, s.GetNamespace())
		for _, sel := range p.NamespaceSelectors {
			in = in || sel.Matches(nsLabels[s.GetNamespace()])
		}
		if !in {
			return false
		}
	}
	if len(p.ServiceSelectors) == 0 {
		return true
	}
	for _, sel := range p.ServiceSelectors {
		if sel.Matches(labels.Set(s.GetLabels())) {
			return true
		}
	}
	return false
}

// pooled returns the pool that lets s have address a ("" with ok for a
// --vip-pool's), or false when none does.
func (ps Pools) pooled(a netip.Addr, s metav1.Object) (string, bool) {
	for _, p := range ps.List {
		if p.usable(a) && p.allows(s, ps.NamespaceLabels) {
			return p.Name, true
		}
	}
	return "", false
}

// poolUsage counts the addresses of each pool (by name, or "--vip-pool <prefix>"
// for a flag's) and family that the snapshot serves as VIPs (groups', L4
// Services' and Gateways'), and those still
// free; see the metric portico_pool_addresses. size is
// Pool.size, or a memo of it.
func poolUsage(ps Pools, snap model.Snapshot, size func(Pool) float64) map[[2]string][2]float64 {
	var vips []netip.Addr
	for _, g := range snap.Groups {
		vips = append(vips, g.VIPs...)
	}
	for _, s := range snap.Services {
		vips = append(vips, s.VIPs...)
	}
	for _, v := range snap.Views {
		vips = append(vips, v.VIPs...)
	}
	out := map[[2]string][2]float64{} // [pool, family] -> [used, free]
	for _, p := range ps.List {
		name := p.Name
		if name == "" {
			name = "--vip-pool " + p.String()
		}
		k := [2]string{name, family(p.CIDR.Addr())}
		used := 0.0
		for _, a := range vips {
			if p.usable(a) {
				used++
			}
		}
		v := out[k]
		v[0] += used
		v[1] += max(0, size(p)-used)
		out[k] = v
	}
	return out
}

// size is the number of addresses p may hand out: exact up to 4,096 addresses,
// above that the prefix's size less the excluded prefixes' (overlaps counted
// twice) and the reserved ones.
func (p Pool) size() float64 {
	host := p.CIDR.Addr().BitLen() - p.CIDR.Bits()
	if host <= 12 {
		n := 0
		for a := p.CIDR.Addr(); a.IsValid() && p.CIDR.Contains(a); a = a.Next() {
			if p.usable(a) {
				n++
			}
		}
		return float64(n)
	}
	n := math.Ldexp(1, host) - 1 // the IPv6 subnet-router address
	if p.CIDR.Addr().Is4() {
		n-- // network and broadcast
	}
	for _, x := range p.Exclude {
		if p.CIDR.Overlaps(x) {
			n -= math.Ldexp(1, x.Addr().BitLen()-max(x.Bits(), p.CIDR.Bits()))
		}
	}
	return max(n, 0)
}
