package bgp

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Config is one speaker: the node's identity in BGP and the routers it announces
// the VIPs to.
type Config struct {
	// ASN is the node's autonomous system number.
	ASN uint32
	// RouterID is the BGP identifier, an IPv4 address (usually the node's).
	RouterID netip.Addr
	// ListenPort is the TCP port to accept sessions on; -1 (the default, also
	// chosen by 0) does not listen: an edge dials its peers.
	ListenPort int32
	// Peers are the upstream routers.
	Peers []Peer
	// GracefulRestart advertises the graceful restart capability (RFC 4724) and,
	// when the speaker stops, leaves the sessions without a NOTIFICATION, so a
	// capable peer keeps the routes for RestartTime: an agent restart then does
	// not withdraw the VIPs.
	GracefulRestart bool
	// RestartTime is how long peers keep the routes (default 120s, at most
	// 4095s, whole seconds).
	RestartTime time.Duration
	// NextHop6 is the next hop of IPv6 paths (sessions are usually IPv4, so it
	// cannot be derived from them); without it, Announce rejects IPv6 prefixes.
	NextHop6 netip.Addr
}

// Peer is one upstream router.
type Peer struct {
	Addr netip.Addr
	ASN  uint32
	// Port is the peer's TCP port; 0 means 179.
	Port uint16
	// Password enables TCP MD5 signatures (RFC 2385).
	Password string
	// HoldTime (default 9s, 3s to 65535s) and KeepaliveInterval (default a
	// third of HoldTime) are whole seconds; ConnectRetry (default 1s) is the
	// pause between connection attempts.
	HoldTime, KeepaliveInterval, ConnectRetry time.Duration
	// BFD, if set, runs a BFD session with the peer; its loss resets the BGP
	// session at once.
	BFD *BFD
	// Communities ("65000:100") are added to every announced path.
	Communities []string
	// LocalPref is the LOCAL_PREF of announced paths, for iBGP peers only.
	LocalPref uint32
	// Passive waits for the peer to connect instead of dialling it.
	Passive bool
	// EBGPMultiHop sends the session's packets with TTL 255 (else 1 to an eBGP
	// peer): the peer may be several hops away. Not with BFD (single hop).
	EBGPMultiHop bool
}

// BFD is a peer's BFD session (RFC 5880, single hop RFC 5881).
type BFD struct {
	// MinTx is the desired minimum transmit interval and MinRx the required
	// minimum receive interval (default 300ms each, at least 10ms).
	MinTx, MinRx time.Duration
	// Multiplier is the detection multiplier (default 3).
	Multiplier uint8
}

const (
	defaultHoldTime     = 9 * time.Second
	defaultConnectRetry = time.Second
	defaultRestartTime  = 120 * time.Second
	defaultBFDInterval  = 300 * time.Millisecond
	defaultBFDMult      = 3
	minBFDInterval      = 10 * time.Millisecond
	asTrans             = 23456 // RFC 6793: never a real AS
)

// SetDefaults fills in every unset field that has a default.
func (c *Config) SetDefaults() {
	if c.ListenPort == 0 {
		c.ListenPort = -1
	}
	if c.GracefulRestart && c.RestartTime == 0 {
		c.RestartTime = defaultRestartTime
	}
	c.RouterID = c.RouterID.Unmap()
	for i := range c.Peers {
		c.Peers[i].setDefaults()
	}
}

// setDefaults fills in the peer's unset fields that have a default.
func (p *Peer) setDefaults() {
	p.Addr = p.Addr.Unmap()
	if len(p.Communities) == 0 {
		p.Communities = nil // one way to say none
	}
	if p.HoldTime == 0 {
		p.HoldTime = defaultHoldTime
	}
	if p.KeepaliveInterval == 0 {
		p.KeepaliveInterval = (p.HoldTime / 3).Truncate(time.Second)
	}
	if p.ConnectRetry == 0 {
		p.ConnectRetry = defaultConnectRetry
	}
	if p.BFD != nil {
		b := *p.BFD // do not write through the caller's pointer
		if b.MinTx == 0 {
			b.MinTx = defaultBFDInterval
		}
		if b.MinRx == 0 {
			b.MinRx = defaultBFDInterval
		}
		if b.Multiplier == 0 {
			b.Multiplier = defaultBFDMult
		}
		p.BFD = &b
	}
}

// Validate checks the config after SetDefaults; it reports every problem.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.ASN == 0 || c.ASN == asTrans {
		bad("asn %d is not a usable AS number", c.ASN)
	}
	if !c.RouterID.IsValid() || !c.RouterID.Unmap().Is4() || c.RouterID.IsUnspecified() {
		bad("router id %v is not an IPv4 address", c.RouterID)
	}
	if c.ListenPort != -1 && (c.ListenPort < 1 || c.ListenPort > 65535) {
		bad("listen port %d is not -1 (do not listen) or 1 to 65535", c.ListenPort)
	}
	if c.GracefulRestart {
		if c.RestartTime < time.Second || c.RestartTime > 4095*time.Second || c.RestartTime%time.Second != 0 {
			bad("restart time %v is not 1 to 4095 whole seconds", c.RestartTime)
		}
	}
	if c.NextHop6.IsValid() && (!c.NextHop6.Is6() || c.NextHop6.Is4In6() || c.NextHop6.IsUnspecified()) {
		bad("next hop for IPv6 %v is not an IPv6 address", c.NextHop6)
	}
	seen := map[netip.Addr]bool{}
	var localPref uint32
	for _, p := range c.Peers {
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("peer %v: %s", p.Addr, fmt.Sprintf(format, args...)))
		}
		if err := c.checkPeer(p); err != nil {
			errs = append(errs, err)
		}
		if seen[p.Addr] {
			bad("listed twice")
		}
		seen[p.Addr] = true
		if p.LocalPref != 0 && p.ASN == c.ASN {
			if localPref != 0 && localPref != p.LocalPref {
				bad("local pref %d differs from another iBGP peer's %d: paths are shared by every session", p.LocalPref, localPref)
			} else {
				localPref = p.LocalPref
			}
		}
	}
	return errors.Join(errs...)
}

// CheckPeer reports what is wrong with p (after its defaults) as a peer of a
// speaker of c, alone: Validate also checks the peers together (an address
// listed twice, the iBGP peers' local preference).
func (c *Config) CheckPeer(p Peer) error {
	p.setDefaults()
	return c.checkPeer(p)
}

// checkPeer checks p, whose defaults are set; it reports every problem.
func (c *Config) checkPeer(p Peer) error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("peer %v: %s", p.Addr, fmt.Sprintf(format, args...)))
	}
	if !p.Addr.IsValid() || p.Addr.IsUnspecified() || p.Addr.IsMulticast() {
		bad("not a unicast address")
	}
	if p.ASN == 0 || p.ASN == asTrans {
		bad("asn %d is not a usable AS number", p.ASN)
	}
	if p.HoldTime%time.Second != 0 || p.KeepaliveInterval%time.Second != 0 || p.ConnectRetry%time.Second != 0 {
		bad("hold time %v, keepalive %v and connect retry %v must be whole seconds", p.HoldTime, p.KeepaliveInterval, p.ConnectRetry)
	}
	if p.HoldTime < 3*time.Second || p.HoldTime > 65535*time.Second {
		bad("hold time %v is not 3s to 65535s", p.HoldTime)
	}
	if p.KeepaliveInterval < time.Second || p.KeepaliveInterval >= p.HoldTime {
		bad("keepalive interval %v is not at least 1s and below the hold time %v", p.KeepaliveInterval, p.HoldTime)
	}
	if p.Passive && c.ListenPort == -1 {
		bad("passive, but the speaker does not listen (listen port -1)")
	}
	if p.ConnectRetry < time.Second {
		bad("connect retry %v is below 1s", p.ConnectRetry)
	}
	if b := p.BFD; b != nil {
		for _, iv := range []struct {
			name string
			d    time.Duration
		}{{"min tx", b.MinTx}, {"min rx", b.MinRx}} {
			if iv.d < minBFDInterval || iv.d > time.Hour {
				bad("bfd %s %v is not 10ms to 1h", iv.name, iv.d)
			}
		}
		if b.Multiplier == 0 {
			bad("bfd multiplier is 0")
		}
		if p.EBGPMultiHop {
			bad("bfd is single hop (RFC 5881): not with eBGP multihop")
		}
	}
	for _, s := range p.Communities {
		if _, err := parseCommunity(s); err != nil {
			bad("%v", err)
		}
	}
	if p.LocalPref != 0 && p.ASN != c.ASN {
		bad("local pref applies to iBGP peers only (peer asn %d, ours %d)", p.ASN, c.ASN)
	}
	return errors.Join(errs...)
}

// parseCommunity reads a standard community (RFC 1997) written "65000:100".
func parseCommunity(s string) (uint32, error) {
	hi, lo, ok := strings.Cut(s, ":")
	if ok {
		h, err1 := strconv.ParseUint(hi, 10, 16)
		l, err2 := strconv.ParseUint(lo, 10, 16)
		if err1 == nil && err2 == nil {
			return uint32(h)<<16 | uint32(l), nil
		}
	}
	return 0, fmt.Errorf("community %q is not of the form 65000:100 (two numbers up to 65535)", s)
}
