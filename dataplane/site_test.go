package dataplane

import (
	"encoding/binary"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/portico-edge/portico/dataplane/xdptest"
)

// The site hand-over's world: this node (nicMAC, tunnel address here) in a site
// whose replicas are r1 and r3 (r3 this node), and two edges of another site, s1
// and s2, reached through the router gwMAC.
var (
	gwMAC  = mustMAC("02:00:00:00:0f:01")
	here   = netip.MustParseAddr("10.8.0.1")
	s1     = Remote{Site: "a", Addr: netip.MustParseAddr("10.9.0.1"), MAC: gwMAC}
	s2     = Remote{Site: "a", Addr: netip.MustParseAddr("10.9.0.2"), MAC: gwMAC}
	siteBs = []Backend{{Addr: s1.Addr}, {Addr: s2.Addr}} // the remotes' table, for pick
)

// withRemotes is desired(bs...) with the other site's edges and this node's
// tunnel address.
func withRemotes(tunnel netip.Addr, remotes []Remote, bs ...Backend) Desired {
	d := desired(bs...)
	d.Tunnel = tunnel
	d.Groups[0].Remotes = remotes
	return d
}

// ipip is the frame to_site makes of an IP packet: an IPv4 header from src to
// dst (protocol 4 for IPv4, 41 for IPv6; DF, TTL 64, id 0) in front of it.
func ipip(dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr, inner []byte) []byte {
	h := make([]byte, 20)
	h[0] = 0x45
	binary.BigEndian.PutUint16(h[2:], uint16(20+len(inner)))
	binary.BigEndian.PutUint16(h[6:], 0x4000)
	h[8] = 64
	h[9] = 4
	if inner[0]>>4 == 6 {
		h[9] = 41
	}
	s, d := src.As4(), dst.As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	binary.BigEndian.PutUint16(h[10:], ipv4Checksum(h))
	frame := append(append(slices.Clone([]byte(dstMAC)), srcMAC...), 0x08, 0x00)
	return append(append(frame, h...), inner...)
}

// TestSiteHandover: in a site hand-over, a TCP packet that no replica of the site
// has goes to the other site's edge in a tunnel; what this node has, new
// connections, UDP and other replicas' flows stay in the site.
func TestSiteHandover(t *testing.T) {
	dr := newModelDirector(t, "b")
	run := func(name string, frame []byte, verdict uint32) []byte {
		t.Helper()
		return dr.run(t, name, frame, verdict)
	}
	bs := []Backend{r1, r3}
	mine := sportFor(t, func(s uint16) xdptest.Packet { return tcp4(s, xdptest.ACK) }, r3, bs...)
	theirs := sportFrom(t, 30000, func(s uint16) xdptest.Packet { return tcp4(s, xdptest.ACK) }, r1, bs...)
	dr.apply(t, withRemotes(here, []Remote{s1, s2}, bs...))
	run("before the hand-over, a flow of this node's replica", tcp4(mine, xdptest.ACK).Bytes(), xdptest.Pass)

	if n, err := dr.d.Handover("edge/web", "c"); err != nil || n != 0 {
		t.Fatalf("Handover to a site with no edges: %d VIPs, %v; want none", n, err)
	}
	if n, err := dr.d.Handover("other/group"); err != nil || n != 0 {
		t.Fatalf("Handover of another group: %d VIPs, %v; want none", n, err)
	}
	n, err := dr.d.Handover("edge/web", "a")
	if err != nil || n != 2 {
		t.Fatalf("Handover: %d VIPs, %v; want 2 (vip4, vip6)", n, err)
	}
	for _, mk := range []func(uint16, uint8) xdptest.Packet{tcp4, tcp6} {
		p := mk(sportFor(t, func(s uint16) xdptest.Packet { return mk(s, xdptest.ACK) }, r3, bs...), xdptest.ACK)
		dst := pick(t, p, siteBs...)
		want := ipip(gwMAC, nicMAC, here, dst, p.IP())
		if out := run("a connection this node does not have", p.Bytes(), xdptest.TX); !slices.Equal(out, want) {
			t.Fatalf("sent % x,\nwant % x", out, want)
		}
		if out := run("its next packet (pinned)", p.Bytes(), xdptest.TX); !slices.Equal(out, want) {
			t.Fatalf("next packet sent % x", out[:34])
		}
	}
	if pinned, _ := dr.state(t); pinned != 2 {
		t.Errorf("%d flows pinned, want the 2 sent to the other site", pinned)
	}
	// Another replica's flow goes to it (the first of its chain: the other
	// site's edge comes last), marked with its class and this node's tag (r3's
	// address ends in 0x000d): its node knows whether it has it, and walks the
	// chain on, past this node, if not.
	p := tcp4(theirs, xdptest.ACK)
	want0 := xdptest.WithTag(xdptest.WithTCPMark(to(p, r1), xdptest.MarkTagged|1<<8|1), 0x000d)
	if out := run("another replica's flow", p.Bytes(), xdptest.TX); !slices.Equal(out, want0) {
		t.Errorf("another replica's flow sent % x,\nwant % x", out, want0)
	}
	// ... and there, from a director, what that node does not have goes on.
	p = tcp4(mine+1, xdptest.ACK)
	for pick(t, p, bs...) != r3.Addr {
		p.SPort++
	}
	want := ipip(gwMAC, nicMAC, here, pick(t, p, siteBs...), p.IP())
	if out := run("from a director, a connection this node does not have", p.WithMACs(r1MAC, nicMAC).Bytes(), xdptest.TX); !slices.Equal(out, want) {
		t.Errorf("from a director: sent % x", out[:34])
	}
	// A new connection stays, and so do its later packets; UDP is never handed over.
	s := sportFrom(t, 20000, func(s uint16) xdptest.Packet { return tcp4(s, xdptest.SYN) }, r3, bs...)
	run("a new connection", tcp4(s, xdptest.SYN).Bytes(), xdptest.Pass)
	if err := dr.d.objs.SockModel.Put(flowOf(tcp4(s, xdptest.SYN)).key(), uint32(lbLbLimitsLB_SOCK_LIVE)); err != nil {
		t.Fatal(err) // this node's stack accepted it
	}
	run("its handshake's ACK", tcp4(s, xdptest.ACK).Bytes(), xdptest.Pass)
	run("its data", tcp4(s, xdptest.ACK|xdptest.PSH).Bytes(), xdptest.Pass)
	u := sportFor(t, udp4, r3, bs...)
	run("UDP", udp4(u).Bytes(), xdptest.Pass)

	c, err := dr.d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Reasons[lbReasonREASON_SITE_OUT]; got != 5 {
		t.Errorf("%d packets sent to the other site, want 5", got)
	}
	// Once the transition is over, nothing new goes there; what went there
	// stays, from a director too, until a new connection reuses its 5-tuple.
	dr.endTransitions(t)
	run("after the hand-over, a new flow of this node's replica", tcp4(mine+7, xdptest.ACK).Bytes(), verdictFor(pickB(t, tcp4(mine+7, xdptest.ACK), bs)))
	fromDir := p.WithMACs(r1MAC, nicMAC)
	if out := run("from a director, after the hand-over", fromDir.Bytes(), xdptest.TX); !slices.Equal(out, want) {
		t.Errorf("from a director, after the hand-over: sent % x", out[:34])
	}
	run("a new connection of its 5-tuple, from a director", syn(fromDir).Bytes(), xdptest.Pass)
	run("its next packet", fromDir.Bytes(), xdptest.Pass)
}

// TestHandoverRenewedKeepsHistory: a hand-over renewed (the same sites, within
// its transition) extends the lease and leaves the mid rings where they are:
// a connection opened between two changes is still found through them.
func TestHandoverRenewedKeepsHistory(t *testing.T) {
	dr := newDirector(t, "a")
	dr.apply(t, withRemotes(here, []Remote{s1, s2}, r1, r2, r3))
	dr.apply(t, withRemotes(here, []Remote{s1, s2}, r1, draining(r2), r3)) // a transition
	dr.apply(t, withRemotes(here, []Remote{s1, s2}, r1, r2, r3))           // its mid ring: r2 draining
	for round := range 2 {                                                 // started, then renewed
		if _, err := dr.d.Handover("edge/web"); err != nil {
			t.Fatal(err)
		}
		vip := dr.d.st.vipIDs[vip4]
		var m lbRingMeta
		if err := dr.d.objs.RingsMeta.Lookup(vip, &m); err != nil {
			t.Fatal(err)
		}
		if int(m.MidCount) != len(dr.d.st.midSlots[vip]) || m.MidHead != dr.d.st.midHead[vip] || m.MidCount == 0 {
			t.Fatalf("hand-over round %d: rings_meta says %d mid rings from place %d, the history holds %d from %d",
				round, m.MidCount, m.MidHead, len(dr.d.st.midSlots[vip]), dr.d.st.midHead[vip])
		}
	}
}

// pickB is pick returning the backend.
func pickB(t testing.TB, p xdptest.Packet, bs []Backend) Backend {
	t.Helper()
	a := pick(t, p, bs...)
	for _, b := range bs {
		if b.Addr == a {
			return b
		}
	}
	t.Fatalf("pick gave %s", a)
	return Backend{}
}

// TestSiteTunnelIn: the other site's edge takes the packet out of the tunnel and
// steers it as its own, and never sends it on to a site, even in a hand-over of
// its own.
func TestSiteTunnelIn(t *testing.T) {
	dr := newDirector(t, "a")
	run := func(name string, frame []byte, verdict uint32) []byte {
		t.Helper()
		return dr.run(t, name, frame, verdict)
	}
	bs := []Backend{r1, r3}
	dr.apply(t, withRemotes(s1.Addr, []Remote{{Addr: here, MAC: gwMAC}}, bs...))
	if _, err := dr.d.Handover("edge/web"); err != nil {
		t.Fatal(err)
	}
	for _, mk := range []func(uint16, uint8) xdptest.Packet{tcp4, tcp6} {
		s := sportFor(t, func(s uint16) xdptest.Packet { return mk(s, xdptest.ACK) }, r3, bs...)
		p := mk(s, xdptest.ACK)
		in := ipip(nicMAC, gwMAC, here, s1.Addr, p.IP())
		out := run("to this node's replica", in, xdptest.Pass)
		if want := p.WithMACs(gwMAC, nicMAC).Bytes(); !slices.Equal(out, want) {
			t.Errorf("passed % x,\nwant % x", out, want)
		}
	}
	s := sportFor(t, func(s uint16) xdptest.Packet { return tcp4(s, xdptest.ACK) }, r1, bs...)
	p := tcp4(s, xdptest.ACK)
	out := run("to another replica", ipip(nicMAC, gwMAC, here, s1.Addr, p.IP()), xdptest.TX)
	if m, _ := xdptest.TCPMark(out); net.HardwareAddr(out[0:6]).String() != r1MAC.String() || m != int(lbLbLimitsLB_MARK_FINAL) || !xdptest.TCPChecksumOK(out) {
		t.Errorf("to another replica: sent % x (mark %d), want to r1, marked to be served there", out[:54], m)
	}
	// Not for this node, or not VIP traffic: untouched.
	for name, frame := range map[string][]byte{
		"to another tunnel address": ipip(nicMAC, gwMAC, here, s2.Addr, p.IP()),
		"inner packet to no VIP": func() []byte {
			q := p
			q.Dst = other4
			return ipip(nicMAC, gwMAC, here, s1.Addr, q.IP())
		}(),
	} {
		if out := run(name, slices.Clone(frame), xdptest.Pass); !slices.Equal(out, frame) {
			t.Errorf("%s: changed to % x", name, out[:34])
		}
	}
	// VIP traffic in a tunnel from no other site's edge (issue 24, attack 6:
	// a stranger reached the VIPs with a source of its choosing, past the
	// network's filters) is dropped; so is an edge's once its site is gone.
	stranger := netip.MustParseAddr("203.0.113.66")
	run("VIP traffic from a stranger", ipip(nicMAC, gwMAC, stranger, s1.Addr, p.IP()), xdptest.Drop)
	dr.apply(t, withRemotes(s1.Addr, []Remote{{Addr: stranger, MAC: gwMAC}}, bs...))
	run("from the stranger, now another site's edge", ipip(nicMAC, gwMAC, stranger, s1.Addr, p.IP()), xdptest.TX)
	run("from the edge of a site no longer a peer", ipip(nicMAC, gwMAC, here, s1.Addr, p.IP()), xdptest.Drop)
	c, err := dr.d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if c.Reasons[lbReasonREASON_SITE_IN] != 4 || c.Reasons[lbReasonREASON_SITE_OUT] != 0 || c.Reasons[lbReasonREASON_SITE_STRANGER] != 2 {
		t.Errorf("%d taken out of the tunnel (want 4), %d sent to a site (want 0), %d from strangers dropped (want 2)",
			c.Reasons[lbReasonREASON_SITE_IN], c.Reasons[lbReasonREASON_SITE_OUT], c.Reasons[lbReasonREASON_SITE_STRANGER])
	}
}

// TestRemotesValidation: remote edges need a tunnel address, IPv4 and a MAC.
func TestRemotesValidation(t *testing.T) {
	d := loadForTest(t)
	for name, tc := range map[string]struct {
		want Desired
		err  string
	}{
		"no tunnel":       {withRemotes(netip.Addr{}, []Remote{s1}, r1, r3), "need a tunnel address"},
		"IPv6 tunnel":     {withRemotes(netip.MustParseAddr("2001:db8::1"), []Remote{s1}, r1, r3), "not IPv4"},
		"no MAC":          {withRemotes(here, []Remote{{Addr: s1.Addr}}, r1, r3), "no next-hop MAC"},
		"IPv6 remote":     {withRemotes(here, []Remote{{Addr: vip6, MAC: gwMAC}}, r1, r3), "not an IPv4 address"},
		"a replica twice": {withRemotes(here, []Remote{{Addr: r1.Addr, MAC: gwMAC}}, r1, r3), "a replica and a remote edge"},
	} {
		if _, err := d.Apply(tc.want); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: error %v, want one saying %q", name, err, tc.err)
		}
	}
	// Valid: the remotes get backends, flagged, outside the ring.
	if _, err := d.Apply(withRemotes(here, []Remote{s1, s2}, r1, r3)); err != nil {
		t.Fatal(err)
	}
	vips, err := d.VIPs()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vips {
		remote := 0
		for _, b := range v.Backends {
			if b.Remote {
				remote++
				if b.Slots != 0 {
					t.Errorf("%s: remote edge %s has %d ring slots", v.Addr, b.Addr, b.Slots)
				}
			}
		}
		if remote != 2 {
			t.Errorf("%s: %d remote edges, want 2", v.Addr, remote)
		}
	}
}

// withSpill is withRemotes with the site spilling ratio of its slots to spill.
func withSpill(tunnel netip.Addr, spill []Remote, ratio float64, bs ...Backend) Desired {
	d := withRemotes(tunnel, nil, bs...)
	d.Groups[0].Spill, d.Groups[0].SpillRatio = spill, ratio
	return d
}

// spilled reports whether the frame xdp_lb sent went to the other site (a
// tunnel frame to the router), and to which edge.
func spilled(out []byte) (netip.Addr, bool) {
	if len(out) < 34 || net.HardwareAddr(out[0:6]).String() != gwMAC.String() || out[23] != 4 && out[23] != 41 {
		return netip.Addr{}, false
	}
	return netip.AddrFrom4([4]byte(out[30:34])), true
}

// spillsAt says whether a flow's slot spills at a ratio (the order Apply uses),
// to choose flows; what xdp_lb does is what the tests check.
func spillsAt(p xdptest.Packet, ratio float64) bool {
	f := Flow{Src: p.Src, Dst: p.Dst, SPort: p.SPort, DPort: p.DPort, Protocol: p.Proto}
	slot := int(FlowHash(f, testSeed) % testRing)
	return slices.Contains(spillOrder(testRing)[:spillSlots(ratio, testRing)], slot)
}

// spills runs a frame through the director and reports whether it went to the
// other site.
func (dr director) spills(t *testing.T, frame []byte) bool {
	t.Helper()
	_, out, err := xdptest.Run(dr.d.Program(), frame)
	if err != nil {
		t.Fatal(err)
	}
	_, sp := spilled(out)
	return sp
}

// TestSpill: a site above its capacity spills the share of its ring's slots
// that its ratio says, and only new connections move: a lower ratio keeps the
// connections that spilled where they are, a higher one keeps the older ones
// here; another site's packets are never spilled on.
func TestSpill(t *testing.T) {
	dr := newDirector(t, "b")
	run := func(frame []byte) (uint32, []byte) {
		t.Helper()
		v, out, err := xdptest.Run(dr.d.Program(), frame)
		if err != nil {
			t.Fatal(err)
		}
		return v, out
	}
	bs := []Backend{r1, r2}
	const flows = 600
	isSpilled := func(frame []byte) bool {
		t.Helper()
		return dr.spills(t, frame)
	}
	newConns := func(ratio float64, from uint16) {
		t.Helper()
		dr.apply(t, withSpill(here, []Remote{s1, s2}, ratio, bs...))
		edges := map[netip.Addr]int{}
		n := 0
		for i := range flows {
			p := tcp4(from+uint16(i), xdptest.SYN)
			v, o := run(p.Bytes())
			if v != xdptest.TX {
				t.Fatalf("SYN %d: verdict %s", i, xdptest.VerdictName(v))
			}
			a, sp := spilled(o)
			if sp != spillsAt(p, ratio) {
				t.Fatalf("ratio %.1f: SYN from %d spilled %v, its slot says %v", ratio, p.SPort, sp, !sp)
			}
			if sp {
				n++
				edges[a]++
			}
			// The handshake's ACK, and a packet after it that the flow
			// cache does not answer (another CPU's, or after a ring
			// change): the first follows new_pins, the next the pin it
			// became.
			for _, what := range []string{"next packet", "packet after that"} {
				if isSpilled(tcp4(p.SPort, xdptest.ACK).Bytes()) != sp {
					t.Fatalf("ratio %.1f: flow %d: SYN spilled %v, its %s not alike", ratio, p.SPort, sp, what)
				}
				dr.retireCaches(t)
			}
		}
		t.Logf("ratio %.1f: %d of %d new connections spilled, by edge %v", ratio, n, flows, edges)
		if want := int(ratio * flows); n < want-flows/10 || n > want+flows/10 {
			t.Errorf("ratio %.1f: %d of %d spilled", ratio, n, flows)
		}
		if n > 0 && len(edges) != 2 {
			t.Errorf("ratio %.1f: spilled to %v, want both edges", ratio, edges)
		}
	}
	newConns(0, 10000)
	newConns(0.5, 11000)
	// A lower ratio: new connections in the slots it takes back stay here; the
	// connections that spilled in them stay there.
	newConns(0.2, 12000)
	back := 0
	for i := range flows {
		p := tcp4(11000+uint16(i), xdptest.ACK)
		if spillsAt(p, 0.5) && !spillsAt(p, 0.2) {
			back++
			if !isSpilled(p.Bytes()) {
				t.Errorf("flow %d spilled at 0.5, its slot was taken back at 0.2: its packets came back", p.SPort)
			}
		}
	}
	if back == 0 {
		t.Fatal("no slot taken back")
	}
	// A higher ratio: older connections (on r1 and r2) stay where they are.
	dr.endTransitions(t)
	var older []xdptest.Packet
	for sport := uint16(40000); len(older) < 50 && sport < 45000; sport++ {
		if p := tcp4(sport, xdptest.ACK); !spillsAt(p, 0.2) && spillsAt(p, 0.8) {
			if isSpilled(p.Bytes()) {
				t.Fatalf("flow %d spilled at 0.2", sport)
			}
			older = append(older, p)
		}
	}
	dr.apply(t, withSpill(here, []Remote{s1, s2}, 0.8, bs...))
	for _, p := range older {
		if isSpilled(p.Bytes()) {
			t.Errorf("flow %d, older than the higher ratio, spilled", p.SPort)
		}
	}
	// UDP spills too (once the transition is over: in one, a UDP flow cannot
	// be told from an older one).
	dr.endTransitions(t)
	udp := 0
	for i := range 200 {
		if p := udp4(uint16(30000 + i)); isSpilled(p.Bytes()) != spillsAt(p, 0.8) {
			t.Fatalf("UDP flow %d: spilled %v", p.SPort, !spillsAt(p, 0.8))
		} else if spillsAt(p, 0.8) {
			udp++
		}
	}
	if udp == 0 {
		t.Error("no UDP flow spilled at 0.8")
	}

	// The site spilled to spills too: what it gets is served there.
	a := newDirector(t, "a")
	a.apply(t, withSpill(s1.Addr, []Remote{{Site: "b", Addr: here, MAC: gwMAC}}, 0.8, r1, r3))
	for i := range 200 {
		p := tcp4(uint16(50000+i), xdptest.SYN)
		v, o, err := xdptest.Run(a.d.Program(), ipip(nicMAC, gwMAC, here, s1.Addr, p.IP()))
		if err != nil {
			t.Fatal(err)
		}
		if _, sp := spilled(o); sp || (v != xdptest.Pass && v != xdptest.TX) {
			t.Fatalf("a packet from b, at a spilling: verdict %s, spilled on %v", xdptest.VerdictName(v), sp)
		}
	}
	c, err := a.d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if c.Reasons[lbReasonREASON_SITE_OUT] != 0 || c.Reasons[lbReasonREASON_SITE_IN] != 200 {
		t.Errorf("a: %d sent to a site, %d taken in; want 0 and 200", c.Reasons[lbReasonREASON_SITE_OUT], c.Reasons[lbReasonREASON_SITE_IN])
	}
	// Validation.
	for _, bad := range []Desired{withSpill(here, []Remote{s1}, 0.95, bs...), withSpill(here, nil, 0.3, bs...), withSpill(netip.Addr{}, []Remote{s1}, 0.3, bs...)} {
		if _, err := dr.d.Apply(bad); err == nil {
			t.Errorf("spill ratio %v to %v (tunnel %v) accepted", bad.Groups[0].SpillRatio, bad.Groups[0].Spill, bad.Tunnel)
		}
	}
}

// TestSpillTakenBack: a transition that starts at a spilling ring and takes
// slots back. A packet with no pin in such a slot belongs to a connection that
// spilled before the change, and stays at the other site; a connection opened
// here since (its SYN followed the new ring, its handshake pinned it) stays
// here, also past the flow cache (another CPU's packet, or one after a ring
// change): its pin, not the slot's past, decides.
func TestSpillTakenBack(t *testing.T) {
	dr := newDirector(t, "b")
	bs := []Backend{r1, r2}
	isSpilled := func(p xdptest.Packet) bool {
		t.Helper()
		return dr.spills(t, p.Bytes())
	}
	dr.apply(t, withSpill(here, []Remote{s1, s2}, 0.5, bs...))
	dr.endTransitions(t)
	dr.apply(t, withSpill(here, []Remote{s1, s2}, 0.2, bs...))
	older, newer := 0, 0
	for sport := uint16(20000); sport < 22000; sport++ {
		if p := tcp4(sport, xdptest.ACK); !spillsAt(p, 0.5) || spillsAt(p, 0.2) {
			continue
		}
		if sport%2 == 0 {
			older++
			if !isSpilled(tcp4(sport, xdptest.ACK)) {
				t.Errorf("flow %d, spilled before its slot was taken back: its packet came back", sport)
			}
			continue
		}
		newer++
		if isSpilled(tcp4(sport, xdptest.SYN)) {
			t.Fatalf("flow %d: a SYN in a slot taken back spilled", sport)
		}
		for _, what := range []string{"handshake's ACK", "next packet"} {
			if isSpilled(tcp4(sport, xdptest.ACK)) {
				t.Errorf("flow %d, opened here after its slot was taken back: its %s spilled", sport, what)
			}
			dr.retireCaches(t)
		}
	}
	if older == 0 || newer == 0 {
		t.Fatalf("flows in slots taken back: %d older, %d newer", older, newer)
	}
	t.Logf("slots taken back: %d older connections stayed spilled, %d newer stayed here", older, newer)
}

// TestSitePeersBeforeTheFirstApply: a restarted agent takes tunnel traffic from
// the other sites' edges from its start, before its first Apply, even when it
// finds site_peers empty (an upgrade from a version without it): the remote
// backends it finds pinned name them.
func TestSitePeersBeforeTheFirstApply(t *testing.T) {
	dr := newDirector(t, "a")
	bs := []Backend{r1, r3}
	dr.apply(t, withRemotes(s1.Addr, []Remote{{Site: "b", Addr: here, MAC: gwMAC}}, bs...))
	if _, err := dr.d.Handover("edge/web"); err != nil {
		t.Fatal(err)
	}
	k := lbSitePeerKey{Addr: here.As4()}
	if err := dr.d.objs.SitePeers.Delete(&k); err != nil {
		t.Fatal(err)
	}
	again, err := Load(Options{PinPath: dr.d.opts.PinPath, RingSize: testRing, FlowEntries: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	var v uint32
	if err := again.objs.SitePeers.Lookup(&k, &v); err != nil {
		t.Errorf("after the restart, before any Apply: %s not among the site peers: %v", here, err)
	}
}
