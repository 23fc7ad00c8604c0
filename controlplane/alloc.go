package controlplane

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
)

// Pool is a range VIPs are taken from: one prefix of a VIPPool, or a
// --vip-pool flag (Name "", any Service, auto-assigned).
type Pool struct {
	Name    string // the VIPPool's
	CIDR    netip.Prefix
	Exclude []netip.Prefix
	// Manual pools are not allocated from: a Service takes their addresses
	// only by naming them (autoAssign: false).
	Manual bool
	// Restricted pools serve only the Services their ServiceAllocation allows
	// (allows).
	Restricted         bool
	Namespaces         []string
	NamespaceSelectors []labels.Selector
	ServiceSelectors   []labels.Selector
}

// ParsePool parses "CIDR" or "CIDR!excluded,excluded..." (each excluded entry a prefix
// or an address).
func ParsePool(s string) (Pool, error) {
	var p Pool
	cidr, rest, _ := strings.Cut(s, "!")
	pre, err := netip.ParsePrefix(cidr)
	if err != nil {
		return p, fmt.Errorf("parse pool %q: %w", s, err)
	}
	p.CIDR = pre.Masked()
	for _, e := range splitList(rest) {
		x, err := netip.ParsePrefix(e)
		if err != nil {
			a, aerr := netip.ParseAddr(e)
			if aerr != nil {
				return p, fmt.Errorf("parse pool %q exclusion %q: %w", s, e, err)
			}
			x = netip.PrefixFrom(a, a.BitLen())
		}
		p.Exclude = append(p.Exclude, x.Masked())
	}
	return p, nil
}

// String is the pool as ParsePool reads it: "CIDR" or "CIDR!excluded,...".
func (p Pool) String() string {
	if len(p.Exclude) == 0 {
		return p.CIDR.String()
	}
	ex := make([]string, len(p.Exclude))
	for i, x := range p.Exclude {
		ex[i] = x.String()
	}
	return p.CIDR.String() + "!" + strings.Join(ex, ",")
}

// usable reports whether an address of the pool may be handed out: not excluded, and
// not an IPv4 network or broadcast address, nor an IPv6 subnet-router anycast address
// (but for a single address: a /32 or /128).
func (p Pool) usable(a netip.Addr) bool {
	if !p.CIDR.Contains(a) {
		return false
	}
	for _, x := range p.Exclude {
		if x.Contains(a) {
			return false
		}
	}
	if a == p.CIDR.Addr() && (a.Is6() && p.CIDR.Bits() < 128 || a.Is4() && p.CIDR.Bits() < 31) {
		return false // an IPv6 /128 or IPv4 /32 is its one address
	}
	if a.Is4() && p.CIDR.Bits() < 31 && !p.CIDR.Contains(a.Next()) {
		return false
	}
	return true
}

// next returns the pool's lowest usable address that is not used.
func (p Pool) next(used map[netip.Addr]bool) (netip.Addr, bool) {
	// Bounded: the pool is walked once, at most to its end, and each excluded
	// prefix is skipped at once.
	for a := p.CIDR.Addr(); a.IsValid() && p.CIDR.Contains(a); a = a.Next() {
		if p.usable(a) && !used[a] {
			return a, true
		}
		// Skip whole excluded prefixes at once (large IPv6 exclusions).
		for _, x := range p.Exclude {
			if x.Contains(a) {
				last := lastAddr(x)
				if last.Compare(a) > 0 {
					a = last
				}
			}
		}
	}
	return netip.Addr{}, false
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - uint(i%8))
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// AllocateVIPs picks VIPs for the groups and L4 Services that have none (no VIP
// annotation at all), oldest first, one per address family that has a pool
// allowing the Service (not Manual), the lowest free address of the first such
// pool first. Addresses in every such Service's annotation count as used, and so
// do the nodes' addresses and taken (the Gateways' addresses). It returns the
// new VIPs by Service and a problem for each Service a family's pools could not
// serve, or no pool allows.
func AllocateVIPs(services []*corev1.Service, nodes []*corev1.Node, pools Pools, taken ...netip.Addr) (map[string][]netip.Addr, []model.Problem) {
	groups := sortedVIPHolders(services)
	used := map[netip.Addr]bool{}
	for _, a := range taken {
		used[a] = true
	}
	for _, n := range nodes {
		for _, a := range n.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				used[ip.Unmap()] = true
			}
		}
	}
	for _, s := range groups {
		if v, _, ok := vipAnnotation(s); ok {
			vips, _ := parseVIPs(v)
			for _, a := range vips {
				used[a] = true
			}
		}
	}
	out := map[string][]netip.Addr{}
	var problems []model.Problem
	for _, s := range groups {
		if _, _, ok := vipAnnotation(s); ok {
			continue
		}
		got, allowed, short := pools.allocate(s, used)
		if !allowed && len(pools.List) > 0 {
			problems = append(problems, model.Problem{
				Object: "Service " + key(s), Field: "metadata.annotations[" + v1alpha1.AnnotationVIP + "]",
				Reason: model.ReasonVIPNotInPool, Detail: "no VIP pool that assigns addresses allows this Service",
			})
			continue
		}
		for _, fam := range short {
			problems = append(problems, model.Problem{
				Object: "Service " + key(s), Field: "metadata.annotations[" + v1alpha1.AnnotationVIP + "]",
				Reason: model.ReasonVIPPoolExhausted, Detail: fmt.Sprintf("no free %s address in the VIP pools that allow it", fam),
			})
		}
		if len(got) > 0 {
			out[key(s)] = got
		}
	}
	return out, problems
}

// allocate takes, for object o (an L4 Service, a group or a Gateway), the
// lowest free address of each family that a pool allowing it assigns (not
// Manual), from the first such pool of the family that has one, and marks
// them used; sorted. allowed says some pool allows o; short lists the
// families ("IPv4", "IPv6") whose pools had none free.
func (ps Pools) allocate(o metav1.Object, used map[netip.Addr]bool) (got []netip.Addr, allowed bool, short []string) {
	var mine []Pool
	var families []bool // is4, in first-pool order
	for _, p := range ps.List {
		if p.Manual || !p.allows(o, ps.NamespaceLabels) {
			continue
		}
		mine = append(mine, p)
		if is4 := p.CIDR.Addr().Is4(); !slices.Contains(families, is4) {
			families = append(families, is4)
		}
	}
	for _, is4 := range families {
		found := false
		for _, p := range mine {
			if p.CIDR.Addr().Is4() != is4 {
				continue
			}
			if a, ok := p.next(used); ok {
				used[a] = true
				got = append(got, a)
				found = true
				break
			}
		}
		if !found {
			fam := "IPv6"
			if is4 {
				fam = "IPv4"
			}
			short = append(short, fam)
		}
	}
	slices.SortFunc(got, netip.Addr.Compare)
	return got, len(mine) > 0, short
}

// AllocateVRIDs picks the lowest free VRRP id for each group without one, oldest
// group first. Ids in valid annotations count as used.
func AllocateVRIDs(services []*corev1.Service) (map[string]uint8, []model.Problem) {
	groups := sortedGroups(services)
	used := map[uint8]bool{}
	for _, s := range groups {
		if v, ok := s.Annotations[v1alpha1.AnnotationVRID]; ok {
			if id, err := parseVRID(v); err == nil {
				used[id] = true
			}
		}
	}
	out := map[string]uint8{}
	var problems []model.Problem
	for _, s := range groups {
		if _, ok := s.Annotations[v1alpha1.AnnotationVRID]; ok {
			continue
		}
		id := 0
		for i := 1; i <= 255; i++ {
			if !used[uint8(i)] {
				id = i
				break
			}
		}
		if id == 0 {
			problems = append(problems, model.Problem{Object: "Service " + key(s), Field: "metadata.annotations[" + v1alpha1.AnnotationVRID + "]",
				Reason: model.ReasonVRIDExhausted, Detail: "all 255 VRRP ids are taken"})
			continue
		}
		used[uint8(id)] = true
		out[key(s)] = uint8(id)
	}
	return out, problems
}
