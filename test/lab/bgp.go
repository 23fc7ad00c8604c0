package lab

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/test/frr"
	"github.com/portico-edge/portico/test/netlab"
	"github.com/portico-edge/portico/test/traffic"
)

// BGP lab (Options.BGP): the client is no longer on the edges' segment but behind
// a router namespace, "rt", which runs FRR (zebra, bgpd, bfdd) in AS 65000 with L4
// ECMP (fib_multipath_hash_policy=1) over every edge that announces the VIP; the
// agents run with --announce=bgp and peer with it.
//
//	client 10.217.0.2 --- rt 10.217.0.1 | 10.216.0.1 --- bridge --- edges, pods
const (
	RouterASN = 65000
	edgeASN   = 64512
)

var (
	ClientSubnet = netip.MustParsePrefix("10.217.0.0/24")
	BGPClient    = netip.MustParsePrefix("10.217.0.2/24")
	bgpRouterOut = netip.MustParsePrefix("10.217.0.1/24")
)

// BGPOptions turn the lab into the BGP lab.
type BGPOptions struct {
	// BFD is the BFD transmit and receive interval, 0 for no BFD (the hold
	// timer, 3 s, then finds a dead edge). Detection is BFDMultiplier
	// intervals.
	BFD time.Duration
	// BFDMultiplier is the router's and the agents' detection multiplier, 0
	// for 3. A test that does not measure detection takes more: on a starved
	// machine (a parallel build beside the lab) the router or an agent can go
	// unscheduled for longer than 3 intervals, and the session it drops then
	// moves flows the test means to watch stay (CI run 16: 150 ms).
	BFDMultiplier int
	// T receives FRR's logs if the test fails; the router stops with the test.
	T testing.TB
	// Resilient: the router forwards the VIP by a resilient nexthop group
	// (ip nexthop ... type resilient) that follows FRR's route, as a router
	// with resilient ECMP hashing does; otherwise by FRR's own multipath
	// route (hash-threshold).
	Resilient bool
	// PeerObjects: the agents' --bgp-config file has no peer; the router is
	// the BGPPeer object "rt" (with the BFDProfile "lab" for BFD) in the
	// agents' namespace, created before they start.
	PeerObjects bool
	// Password is the sessions' TCP MD5 password (RFC 2385), "" for none: in
	// the file, or with PeerObjects in the Secret "rt-bgp" that "rt" names.
	Password string
}

// Router is the BGP lab's router namespace.
type Router struct {
	*Node
	FRR *frr.Router
	bfd bool   // BFD runs with the edges
	asn uint32 // its AS
	// res, with BGPOptions.Resilient, keeps the resilient group in step
	// with FRR's route.
	res *resilientGroup
}

// RouterAddr is the router's address in the lab's (or site's) subnet.
func (l *Lab) RouterAddr() netip.Addr { return netip.AddrFrom4([4]byte{10, l.subnet, 0, 1}) }

// startRouter builds the router, with an address in each of the subnets (the
// first one's on its node), and the client behind it, and starts FRR peering
// with the edges.
func (l *Lab) startRouter(o *BGPOptions, subnets []byte, edges []netip.Addr) error {
	r, c, err := l.NewRouter(o, RouterSpec{Name: "rt", ASN: RouterASN, Subnets: subnets, Client: BGPClient, Edges: edges})
	if err != nil {
		return err
	}
	l.Router, l.Client, l.Target = r, c, traffic.Target{NS: c.NS, VIP: VIP}
	if o.Resilient {
		res, err := startResilientGroup(r.NS, edges)
		if err != nil {
			return err
		}
		l.Router.res = res
		l.closers = append(l.closers, res.stop)
	}
	return nil
}

// RouterSpec is one router of a lab: its node's name and AS, its addresses on
// the bridge (10.s.0.1 for each subnet s), its client's address behind it (the
// router is .1 of that /24), the edges that peer with it, and other routers it
// peers with (eBGP, by their address and AS).
type RouterSpec struct {
	Name    string
	ASN     uint32
	Subnets []byte
	Client  netip.Prefix
	Edges   []netip.Addr
	Routers []RouterPeer
}

// RouterPeer is another router a router peers with.
type RouterPeer struct {
	Addr netip.Addr
	ASN  uint32
}

// NewRouter builds a router and its client (a namespace behind it) and starts
// FRR: zebra, bgpd (ECMP over the edges, multipath-relax) and, with BFD, bfdd.
func (l *Lab) NewRouter(o *BGPOptions, sp RouterSpec) (*Router, *Node, error) {
	rt, err := l.Net.AddNode(sp.Name, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, sp.Subnets[0], 0, 1}), 24), net.HardwareAddr{0x02, 0, 10, sp.Subnets[0], 0, 1})
	if err != nil {
		return nil, nil, err
	}
	for _, sn := range sp.Subnets[1:] {
		if err := netlab.IP("-n", rt.NS, "addr", "add", fmt.Sprintf("10.%d.0.1/24", sn), "dev", "eth0"); err != nil {
			return nil, nil, err
		}
	}
	routerAddr := rt.Addr.Addr()
	r := &Router{Node: &Node{Node: rt}, asn: sp.ASN}
	clName := "cl" + strings.TrimPrefix(sp.Name, "rt")
	ns := l.Net.Prefix + clName
	if err := netlab.IP("netns", "add", ns); err != nil {
		return nil, nil, err
	}
	l.Net.OnClose(func() error { return netlab.IP("netns", "del", ns) })
	out := netip.PrefixFrom(netip.AddrFrom4([4]byte{sp.Client.Addr().As4()[0], sp.Client.Addr().As4()[1], sp.Client.Addr().As4()[2], 1}), 24)
	for _, args := range [][]string{
		{"-n", rt.NS, "link", "add", "eth1", "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"-n", rt.NS, "addr", "add", out.String(), "dev", "eth1"},
		{"-n", rt.NS, "link", "set", "eth1", "up"},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "addr", "add", sp.Client.String(), "dev", "eth0"},
		{"-n", ns, "link", "set", "eth0", "up"},
		{"-n", ns, "route", "add", "default", "via", out.Addr().String()},
	} {
		if err := netlab.IP(args...); err != nil {
			return nil, nil, err
		}
	}
	for _, kv := range [][2]string{{"net.ipv4.ip_forward", "1"}, {"net.ipv4.fib_multipath_hash_policy", "1"}} {
		if err := netlab.Sysctl(rt.NS, kv[0], kv[1]); err != nil {
			return nil, nil, err
		}
	}
	client := &Node{Node: &netlab.Node{Name: clName, NS: ns, Addr: sp.Client}}

	dir, err := os.MkdirTemp("", "portico-lab-frr-")
	if err != nil {
		return nil, nil, err
	}
	l.closers = append(l.closers, func() error { return os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, nil, err
	}
	confs := frrConfigs(o, sp, routerAddr)
	t := o.T
	if t == nil {
		return nil, nil, fmt.Errorf("BGPOptions.T is required")
	}
	r.FRR = frr.Start(t, rt.NS, dir, confs)
	r.bfd = o.BFD > 0
	return r, client, nil
}

// frrConfigs are the daemons' configurations of router sp (its address
// routerAddr): bgpd peers with the edges (a peer group, with o's BFD and
// password) and with sp.Routers, ECMP over up to 8 paths.
func frrConfigs(o *BGPOptions, sp RouterSpec, routerAddr netip.Addr) map[string]string {
	var b strings.Builder
	fmt.Fprintf(&b, "hostname %s\nrouter bgp %d\n bgp router-id %s\n no bgp ebgp-requires-policy\n", sp.Name, sp.ASN, routerAddr)
	b.WriteString(" bgp bestpath as-path multipath-relax\n neighbor EDGES peer-group\n")
	fmt.Fprintf(&b, " neighbor EDGES remote-as %d\n neighbor EDGES timers 1 3\n neighbor EDGES timers connect 1\n", edgeASN)
	b.WriteString(" neighbor EDGES advertisement-interval 0\n")
	if o.Password != "" {
		fmt.Fprintf(&b, " neighbor EDGES password %s\n", o.Password)
	}
	bfdd := "hostname " + sp.Name + "\n"
	if o.BFD > 0 {
		ms := o.BFD.Milliseconds()
		bfdd += fmt.Sprintf("bfd\n profile edges\n  transmit-interval %d\n  receive-interval %d\n  detect-multiplier %d\n exit\nexit\n", ms, ms, o.bfdMultiplier())
		b.WriteString(" neighbor EDGES bfd\n neighbor EDGES bfd profile edges\n")
	}
	for _, e := range sp.Edges {
		fmt.Fprintf(&b, " neighbor %s peer-group EDGES\n", e)
	}
	for _, p := range sp.Routers {
		fmt.Fprintf(&b, " neighbor %s remote-as %d\n neighbor %s timers 1 3\n neighbor %s timers connect 1\n neighbor %s advertisement-interval 0\n",
			p.Addr, p.ASN, p.Addr, p.Addr, p.Addr)
	}
	b.WriteString(" address-family ipv4 unicast\n  maximum-paths 8\n exit-address-family\n")
	return map[string]string{"zebra": "hostname " + sp.Name + "\n", "bfdd": bfdd, "bgpd": b.String()}
}

// StartPeerRouter starts another router on the lab's bridge, at 10.<subnet>.0.host,
// in AS asn, peering with every edge (BFD with o's timers, o's password) and
// forwarding nothing for the client: a second upstream the edges may peer with.
func (l *Lab) StartPeerRouter(o *BGPOptions, name string, host byte, asn uint32) (*Router, error) {
	addr := netip.AddrFrom4([4]byte{10, l.subnet, 0, host})
	rt, err := l.Net.AddNode(l.name+name, netip.PrefixFrom(addr, 24), net.HardwareAddr{0x02, 0, 10, l.subnet, 0, host})
	if err != nil {
		return nil, err
	}
	var edges []netip.Addr
	for i := range l.Edges {
		edges = append(edges, l.EdgeAddr(i))
	}
	dir, err := os.MkdirTemp("", "portico-lab-frr-")
	if err != nil {
		return nil, err
	}
	l.closers = append(l.closers, func() error { return os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	if o.T == nil {
		return nil, fmt.Errorf("BGPOptions.T is required")
	}
	r := &Router{Node: &Node{Node: rt}, asn: asn, bfd: o.BFD > 0}
	r.FRR = frr.Start(o.T, rt.NS, dir, frrConfigs(o, RouterSpec{Name: name, ASN: asn, Edges: edges}, addr))
	return r, nil
}

func (o *BGPOptions) bfdMultiplier() int {
	if o.BFDMultiplier == 0 {
		return 3
	}
	return o.BFDMultiplier
}

// EdgeAddr is edge i's address on the bridge (buildSite gives it).
func (l *Lab) EdgeAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, l.subnet, 0, byte(11 + i)})
}

// bgpConfig writes the agents' --bgp-config file.
func (l *Lab) bgpConfig() (string, error) {
	p := filepath.Join(l.Dir, "bgp.yaml")
	var b strings.Builder
	fmt.Fprintf(&b, "asn: %d\nwithdrawAfter: 3s\n", edgeASN)
	if l.bgp.PeerObjects {
		b.WriteString("peers: [] # the BGPPeer objects (bgpObjectsYAML)\n")
		return p, writeAtomically(p, b.String())
	}
	if l.bgp.BFD > 0 {
		fmt.Fprintf(&b, "bfdProfiles:\n- {name: lab, transmitInterval: %s, receiveInterval: %s, detectMultiplier: %d}\n", l.bgp.BFD, l.bgp.BFD, l.bgp.bfdMultiplier())
	}
	fmt.Fprintf(&b, "peers:\n- address: %s\n  asn: %d\n  holdTime: 3s\n  keepaliveInterval: 1s\n", l.RouterAddr(), l.routerASN())
	if l.bgp.BFD > 0 {
		b.WriteString("  bfdProfile: lab\n")
	}
	if l.bgp.Password != "" {
		fmt.Fprintf(&b, "  password: %q\n", l.bgp.Password)
	}
	return p, writeAtomically(p, b.String())
}

// writeAtomically replaces the file at p by one with text (a rename), so that an
// agent starting beside the one that writes it never reads it half written:
// each agent's start writes the lab's one BGP file (an agent that read it
// truncated stopped with "asn 0 is not a usable AS number").
func writeAtomically(p, text string) error {
	tmp, err := os.CreateTemp(filepath.Dir(p), filepath.Base(p)+".*")
	if err != nil {
		return err
	}
	if _, err := tmp.WriteString(text); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), p)
}

// routerASN is the lab's router's AS.
func (l *Lab) routerASN() uint32 {
	if l.Router != nil && l.Router.asn != 0 {
		return l.Router.asn
	}
	return RouterASN
}

// bgpObjectsYAML is, with BGPOptions.PeerObjects, the objects that make the
// router the agents' peer: the BGPPeer "rt" for every edge, with the BFDProfile
// "lab" and the password Secret "rt-bgp" when the options have them.
func (l *Lab) bgpObjectsYAML() string {
	var b strings.Builder
	if l.bgp.BFD > 0 {
		ms := l.bgp.BFD.Milliseconds()
		fmt.Fprintf(&b, "apiVersion: portico.io/v1alpha1\nkind: BFDProfile\nmetadata: {name: lab, namespace: %s}\nspec: {transmitInterval: %d, receiveInterval: %d, detectMultiplier: %d}\n---\n",
			AgentNamespace, ms, ms, l.bgp.bfdMultiplier())
	}
	if l.bgp.Password != "" {
		fmt.Fprintf(&b, "apiVersion: v1\nkind: Secret\nmetadata: {name: rt-bgp, namespace: %s}\ntype: kubernetes.io/basic-auth\nstringData: {password: %q}\n---\n",
			AgentNamespace, l.bgp.Password)
	}
	fmt.Fprintf(&b, "apiVersion: portico.io/v1alpha1\nkind: BGPPeer\nmetadata: {name: rt, namespace: %s}\nspec:\n  address: %s\n  asn: %d\n  holdTime: 3s\n  keepaliveInterval: 1s\n",
		AgentNamespace, l.RouterAddr(), l.routerASN())
	if l.bgp.BFD > 0 {
		b.WriteString("  bfdProfile: lab\n")
	}
	if l.bgp.Password != "" {
		b.WriteString("  passwordSecret: {name: rt-bgp}\n")
	}
	return b.String()
}

// Nexthops is the set of edge addresses FRR's route to the VIP names (with
// BGPOptions.Resilient the router forwards by a group that follows it).
func (r *Router) Nexthops() ([]netip.Addr, error) {
	out, err := exec.Command("ip", "-n", r.NS, "route", "show", "exact", VIP.String()+"/32", "proto", "bgp").Output()
	if err != nil {
		return nil, fmt.Errorf("ip route show in %s: %w", r.NS, err)
	}
	var hops []netip.Addr
	f := strings.Fields(string(out))
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "via" {
			if a, err := netip.ParseAddr(f[i+1]); err == nil {
				hops = append(hops, a)
			}
		}
	}
	return hops, nil
}

// Announced reports an error until the router's route to the VIP has want next
// hops and, with BFD, the router's BFD sessions with want edges are up (a
// session whose BFD never came up is reset a few seconds later).
func (r *Router) Announced(want int) error {
	hops, err := r.Nexthops()
	if err != nil {
		return err
	}
	if len(hops) != want {
		return fmt.Errorf("the router's route to %s has next hops %v, want %d", VIP, hops, want)
	}
	if !r.bfd {
		return nil
	}
	var peers []struct {
		Peer   string `json:"peer"`
		Status string `json:"status"`
	}
	if err := r.FRR.VtyJSON("show bfd peers json", &peers); err != nil {
		return err
	}
	up := 0
	for _, p := range peers {
		if p.Status == "up" {
			up++
		}
	}
	if up < want {
		return fmt.Errorf("the router's BFD sessions: %+v, want %d up", peers, want)
	}
	return nil
}

// Choose asks the router's kernel which edge it sends a TCP flow from the client
// (source port sport) to the VIP's port 80 to: its L4 ECMP choice.
func (r *Router) Choose(sport uint16) (netip.Addr, error) {
	out, err := exec.Command("ip", "-n", r.NS, "route", "get", VIP.String(), "from", BGPClient.Addr().String(),
		"iif", "eth1", "ipproto", "tcp", "sport", fmt.Sprint(sport), "dport", "80").Output()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("ip route get in %s: %w", r.NS, err)
	}
	f := strings.Fields(string(out))
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "via" {
			return netip.ParseAddr(f[i+1])
		}
	}
	return netip.Addr{}, fmt.Errorf("ip route get: no next hop in %q", out)
}

// Choices is the router's choice of edge for n TCP flows from the client, source
// ports from on (Choose for each).
// All n are asked of one `ip -batch` process: one process each took a minute
// for 600 on a loaded machine, and held connections idled out meanwhile
// (nginx's keepalive_timeout, 75 s: TestBGPResilient's "unexpected EOF").
func (r *Router) Choices(from uint16, n int) (map[uint16]netip.Addr, error) {
	var in strings.Builder
	for i := range n {
		fmt.Fprintf(&in, "route get %s from %s iif eth1 ipproto tcp sport %d dport 80\n", VIP, BGPClient.Addr(), from+uint16(i))
	}
	cmd := exec.Command("ip", "-n", r.NS, "-batch", "-")
	cmd.Stdin = strings.NewReader(in.String())
	b, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("ip -batch route get in %s: %w", r.NS, err)
	}
	out := map[uint16]netip.Addr{}
	i := 0
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != VIP.String() {
			continue // "cache" lines
		}
		j := slices.Index(f, "via")
		if j < 0 || j+1 >= len(f) {
			return nil, fmt.Errorf("ip route get: no next hop in %q", line)
		}
		a, err := netip.ParseAddr(f[j+1])
		if err != nil {
			return nil, err
		}
		out[from+uint16(i)] = a
		i++
	}
	if i != n {
		return nil, fmt.Errorf("ip -batch route get: %d answers for %d flows:\n%s", i, n, b)
	}
	return out, nil
}

// waitGone waits until the router's route to the VIP has lost victim's next hop
// (and kept the others'), and returns how long after since that took.
func (r *Router) waitGone(victim *Node, edges int, since time.Time, timeout time.Duration) (time.Duration, error) {
	for {
		hops, err := r.Nexthops()
		if err == nil && len(hops) == edges-1 && !slices.Contains(hops, victim.Addr.Addr()) {
			return time.Since(since), nil
		}
		if time.Since(since) > timeout {
			return 0, fmt.Errorf("%s's next hop still in the route %v after the fault: %v (%v)", victim.Name, timeout, hops, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// ReviveEdge brings back an edge KillEdge took down, as a node back from a
// reboot: its data plane is gone (program detached, pins removed), its link comes
// up with the routes that taking the link down removed (to the client, to other
// sites), and its agent starts, with an nginx of its own.
func (l *Lab) ReviveEdge(n *Node) error {
	a := l.Agent(l.EdgeNo(n))
	if err := dataplane.Uninstall(a.PinPath); err != nil {
		return err
	}
	// KillEdge left its nginx running, cut off; a rebooted machine has none
	// (the new agent attaches xdp_lb before it starts nginx, so no frame meets
	// a stack without it).
	if err := l.stopNginx(filepath.Join(a.Dir, "nginx")); err != nil {
		return err
	}
	if err := netlab.IP("-n", n.NS, "link", "set", "eth0", "up"); err != nil {
		return err
	}
	l.mu.Lock()
	routes := l.routes[n]
	l.mu.Unlock()
	for _, r := range routes {
		if err := netlab.IP(append([]string{"-n", n.NS, "route", "replace"}, strings.Fields(r)...)...); err != nil {
			return err
		}
	}
	_, err := l.StartAgent(l.EdgeNo(n))
	return err
}
