package bgp

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
)

// Preference is how a prefix is announced.
type Preference int

const (
	// Withdrawn: not announced.
	Withdrawn Preference = iota
	// Normal: announced as is.
	Normal
	// Depreferenced: announced so routers prefer the other edges first, for a
	// drain: the AS path carries the node's own ASN three more times and the
	// path has the GRACEFUL_SHUTDOWN community (RFC 8326) and, towards iBGP
	// peers, LOCAL_PREF 0.
	Depreferenced
)

// Preferences lists every Preference, for metrics.
var Preferences = []Preference{Withdrawn, Normal, Depreferenced}

func (p Preference) String() string {
	switch p {
	case Withdrawn:
		return "withdrawn"
	case Normal:
		return "normal"
	case Depreferenced:
		return "depreferenced"
	}
	return fmt.Sprintf("preference(%d)", int(p))
}

// MarshalText writes the name.
func (p Preference) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText reads a name.
func (p *Preference) UnmarshalText(b []byte) error {
	for _, q := range Preferences {
		if q.String() == string(b) {
			*p = q
			return nil
		}
	}
	return fmt.Errorf("unknown preference %q", b)
}

// Announcement is a prefix and how it is announced.
type Announcement struct {
	Prefix     netip.Prefix `json:"prefix"`
	Preference Preference   `json:"preference"`
}

const (
	prependCount     = 3          // own ASN added to a depreferenced path
	gracefulShutdown = 0xffff0000 // 65535:0, RFC 8326
)

// change is what one Announce call does to the announced set: paths to add
// (or replace: a new path for a prefix replaces the old one) and prefixes to
// withdraw.
type change struct {
	add      []Announcement
	withdraw []netip.Prefix
}

// diff computes the change from the announced set to the desired one: every
// desired prefix at pref (nothing if pref is Withdrawn), nothing else.
func diff(announced map[netip.Prefix]Preference, desired []netip.Prefix, pref Preference) change {
	var c change
	want := map[netip.Prefix]bool{}
	if pref != Withdrawn {
		for _, p := range desired {
			want[p] = true
		}
	}
	for p := range want {
		if announced[p] != pref {
			c.add = append(c.add, Announcement{Prefix: p, Preference: pref})
		}
	}
	for p := range announced {
		if !want[p] {
			c.withdraw = append(c.withdraw, p)
		}
	}
	slices.SortFunc(c.add, func(a, b Announcement) int { return a.Prefix.Addr().Compare(b.Prefix.Addr()) })
	slices.SortFunc(c.withdraw, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return c
}

// checkPrefixes accepts only host routes (IPv4 /32, IPv6 /128), IPv6 ones only
// when a next hop for them is configured.
func checkPrefixes(prefixes []netip.Prefix, nextHop6 netip.Addr) error {
	for _, p := range prefixes {
		a := p.Addr()
		switch {
		case !p.IsValid() || a.Is4In6() || a.Zone() != "":
			return fmt.Errorf("prefix %v is not a plain IPv4 or IPv6 prefix", p)
		case p.Bits() != a.BitLen():
			return fmt.Errorf("prefix %v is not a host route (/32 or /128)", p)
		case a.Is6() && !nextHop6.IsValid():
			return fmt.Errorf("prefix %v: IPv6 prefixes need Config.NextHop6", p)
		}
	}
	return nil
}

// pathAttrs holds what every path shares, from the configuration.
type pathAttrs struct {
	asn         uint32
	ibgp        bool // some peer is iBGP: no prepending (it would be an AS loop there)
	communities []uint32
	localPref   uint32 // 0: GoBGP's default towards iBGP peers
	nextHop6    netip.Addr
}

func newPathAttrs(c *Config) pathAttrs {
	a := pathAttrs{asn: c.ASN, nextHop6: c.NextHop6}
	for _, p := range c.Peers {
		if p.ASN == c.ASN {
			a.ibgp = true
		}
		if p.LocalPref != 0 {
			a.localPref = p.LocalPref
		}
		for _, s := range p.Communities {
			v, _ := parseCommunity(s) // validated
			if !slices.Contains(a.communities, v) {
				a.communities = append(a.communities, v)
			}
		}
	}
	slices.Sort(a.communities)
	return a
}

// path builds the GoBGP path announcing a, or withdrawing a.Prefix when
// withdraw is set.
func (pa pathAttrs) path(a Announcement, withdraw bool) (*apiutil.Path, error) {
	nlri, err := bgp.NewIPAddrPrefix(a.Prefix)
	if err != nil {
		return nil, fmt.Errorf("prefix %v: %w", a.Prefix, err)
	}
	attrs := []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(bgp.BGP_ORIGIN_ATTR_TYPE_IGP)}
	family := bgp.RF_IPv4_UC
	if a.Prefix.Addr().Is4() {
		// 0.0.0.0: GoBGP puts the session's local address in its place.
		nh, err := bgp.NewPathAttributeNextHop(netip.IPv4Unspecified())
		if err != nil {
			return nil, err
		}
		attrs = append(attrs, nh)
	} else {
		family = bgp.RF_IPv6_UC
		mp, err := bgp.NewPathAttributeMpReachNLRI(family, []bgp.PathNLRI{{NLRI: nlri}}, pa.nextHop6)
		if err != nil {
			return nil, fmt.Errorf("prefix %v: %w", a.Prefix, err)
		}
		attrs = append(attrs, mp)
	}
	communities := slices.Clone(pa.communities)
	localPref := pa.localPref
	if a.Preference == Depreferenced {
		communities = append(communities, gracefulShutdown)
		localPref = 0
		if !pa.ibgp {
			asns := make([]uint32, prependCount)
			for i := range asns {
				asns[i] = pa.asn
			}
			attrs = append(attrs, bgp.NewPathAttributeAsPath([]bgp.AsPathParamInterface{
				bgp.NewAs4PathParam(bgp.BGP_ASPATH_ATTR_TYPE_SEQ, asns),
			}))
		}
		attrs = append(attrs, bgp.NewPathAttributeLocalPref(0))
	}
	if localPref != 0 {
		attrs = append(attrs, bgp.NewPathAttributeLocalPref(localPref))
	}
	if len(communities) > 0 {
		attrs = append(attrs, bgp.NewPathAttributeCommunities(communities))
	}
	return &apiutil.Path{Family: family, Nlri: nlri, Attrs: attrs, Withdrawal: withdraw}, nil
}
