package nginx

import (
	"cmp"
	"fmt"
	"net/netip"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/portico-edge/portico/controlplane/model"
)

// Stream template data: L4 Services (model.Service) through nginx's stream
// module, which nginx.conf loads only when there is one.
type (
	tmplStream struct {
		Servers []tmplStreamServer
		JS      string // the digest of the njs module
		// Endpoints are the contents of each port's endpoint file (in
		// Options.L4Dir), by upstream name: its endpoints, separated by spaces;
		// and of each steered route's file, by steeredFile.
		Endpoints map[string][]byte
		// Steered are the fixed listeners of Options.L4Steered, when a TCP
		// Service port is in the group; Routes what they serve.
		Steered []tmplSteered
		Routes  []L4Route
	}
	tmplSteered struct {
		Listen        []string
		Route         string // the route file's path, from nginx's $server_addr and $server_port
		ProxyProtocol bool
		Timeout       string // proxy_timeout: L4TCPIdleTimeout
	}
	tmplStreamServer struct {
		Comment        string // Service and port
		Listen         []string
		UDP            bool
		Timeout        string // proxy_timeout
		Upstream       string // the port's endpoint file
		Hash           bool   // client-address affinity (portico.pick's rendezvous hash)
		ProxyProtocol  bool   // TCP: nginx's PROXY v1 header
		ProxyDatagrams bool   // UDP: the njs filter's PROXY v2 header on every datagram
	}
)

// L4TCPIdleTimeout is how long an L4 Service's TCP connection may be idle
// (nginx's proxy_timeout) before nginx ends it: a week, longer than the
// kernel's conntrack keeps an idle established flow (5 days) and kube-proxy's
// (24 h), so an idle connection lives at least as long through Portico as
// through kernel forwarding. A connection whose peer vanished without a FIN or
// RST is found sooner by TCP keepalive, on both legs (the listeners'
// so_keepalive, proxy_socket_keepalive: the kernel's tcp_keepalive_* settings,
// 2 h 11 min by default).
const L4TCPIdleTimeout = "7d"

// stream renders the rendered group's L4 Services: one server per Service port,
// listening on each of the Service's VIPs (which the agent keeps on lo), and one
// endpoint file per port with the Service's ready endpoints, which portico.pick
// reads for each new connection: an endpoint change rewrites the file and needs
// no reload. A port without endpoints gets no server, so its connections are
// refused as the kernel refuses them (a TCP reset, an ICMP port unreachable), as
// kube-proxy does for a Service without endpoints; a port that gains or loses
// its last endpoint reloads nginx, whose old workers keep their connections.
func (r *renderer) stream(snap model.Snapshot) *tmplStream {
	st := tmplStream{JS: jsDigest, Endpoints: map[string][]byte{}}
	steered := r.opt.L4Steered[0] != 0
	anyTCP := false
	for _, svc := range snap.Services {
		if r.opt.Group != "" && svc.Group != r.opt.Group {
			continue
		}
		obj := "Service " + svc.Name
		if commentSafe(svc.Name) != svc.Name {
			r.problem("Service "+strconv.Quote(svc.Name), "metadata.name", model.ReasonInvalidUpstream, "name not safe in a comment; not served")
			continue
		}
		for _, p := range svc.Ports {
			u, ok := r.upstreams[p.Upstream]
			if !ok {
				r.problem(obj, fmt.Sprintf("port %s/%d", p.Protocol, p.Port), model.ReasonUpstreamNotFound,
					fmt.Sprintf("upstream %q does not exist; not served", p.Upstream))
				continue
			}
			if err := validateUpstreamName(p.Upstream); err != nil {
				r.problem("Upstream "+strconv.Quote(p.Upstream), "name", model.ReasonInvalidUpstream, err.Error()+"; not served")
				continue
			}
			var eps []string
			for _, e := range u.Endpoints {
				if e.Addr().Zone() != "" || !e.Addr().IsValid() || e.Port() == 0 {
					r.problem("Upstream "+p.Upstream, "endpoints", model.ReasonInvalidEndpoint, fmt.Sprintf("endpoint %s left out", e))
					continue
				}
				eps = append(eps, e.String())
			}
			udp := p.Protocol == model.UDP
			if steered && !udp {
				anyTCP = true
				r.steer(&st, svc, p, eps)
				continue
			}
			if len(eps) == 0 || len(svc.VIPs) == 0 {
				continue
			}
			srv := tmplStreamServer{Comment: fmt.Sprintf("%s %s/%d", svc.Name, p.Protocol, p.Port), UDP: udp,
				Upstream: path.Join(r.opt.L4Dir, p.Upstream), Hash: svc.ClientIPAffinity,
				ProxyProtocol: svc.ProxyProtocol && !udp, ProxyDatagrams: svc.ProxyProtocol && udp, Timeout: L4TCPIdleTimeout}
			if udp {
				srv.Timeout = strconv.Itoa(int(cmp.Or(svc.UDPIdleTimeout, model.DefaultUDPIdleTimeout))) + "s"
			}
			for _, v := range svc.VIPs {
				srv.Listen = append(srv.Listen, netip.AddrPortFrom(v, p.Port).String())
			}
			st.Servers = append(st.Servers, srv)
			st.Endpoints[p.Upstream] = []byte(strings.Join(eps, " ") + "\n")
		}
	}
	if anyTCP {
		// Both listeners, whichever classes the routes use: a Service that
		// turns the PROXY protocol on must not reload nginx either.
		for i, port := range r.opt.L4Steered {
			l := tmplSteered{Listen: []string{"0.0.0.0:" + strconv.Itoa(int(port))},
				Route: path.Join(r.opt.L4Dir, steeredDir) + "/${server_addr}_${server_port}", ProxyProtocol: i == int(ProxyRoute),
				Timeout: L4TCPIdleTimeout}
			if r.opt.ListenIPv6 {
				l.Listen = append(l.Listen, "[::]:"+strconv.Itoa(int(port)))
			}
			st.Steered = append(st.Steered, l)
		}
		slices.SortFunc(st.Routes, func(a, b L4Route) int { return a.VIP.Compare(b.VIP) })
	}
	if len(st.Servers) == 0 && len(st.Steered) == 0 {
		return nil
	}
	return &st
}

// L4Route is a TCP VIP and port that a steered listener serves
// (Options.L4Steered), and which: PlainRoute or ProxyRoute; or that nginx's
// HTTP or HTTPS listener serves (a Gateway's listener on another port),
// HTTPRoute or HTTPSRoute, and Listen is that listener's port.
type L4Route struct {
	VIP    netip.AddrPort
	Class  uint32
	Listen uint16
}

// The listener classes of L4Route: the indices of Options.L4Steered, then
// nginx's HTTP and HTTPS listeners.
const (
	PlainRoute uint32 = 0
	ProxyRoute uint32 = 1
	HTTPRoute  uint32 = 2
	HTTPSRoute uint32 = 3
)

// steeredDir is the subdirectory of Options.L4Dir with the steered routes'
// files.
const steeredDir = "tcp"

// steer adds a TCP Service port's routes, one per VIP, when it has endpoints:
// its file names the balancing ("hash" for client-address affinity, else
// "any") and the endpoints.
func (r *renderer) steer(st *tmplStream, svc model.Service, p model.ServicePort, eps []string) {
	if len(eps) == 0 {
		return
	}
	mode := "any"
	if svc.ClientIPAffinity {
		mode = "hash"
	}
	body := []byte(mode + " " + strings.Join(eps, " ") + "\n")
	class := PlainRoute
	if svc.ProxyProtocol {
		class = ProxyRoute
	}
	for _, v := range svc.VIPs {
		name, ok := steeredFile(v, p.Port)
		if !ok {
			r.problem("Service "+svc.Name, fmt.Sprintf("port %s/%d", p.Protocol, p.Port), model.ReasonInvalidVIP,
				fmt.Sprintf("VIP %s is an IPv4-compatible or -mapped IPv6 address, which nginx names otherwise; not served", v))
			continue
		}
		st.Endpoints[name] = body
		st.Routes = append(st.Routes, L4Route{VIP: netip.AddrPortFrom(v, p.Port), Class: class})
	}
}

// steeredFile is the name, inside Options.L4Dir, of a route's file, as
// portico.js finds it from nginx's $server_addr and $server_port. nginx
// writes IPv6 addresses as RFC 5952 does (and Go), except those in ::/96 and
// ::ffff:0:0/96, which it writes with an IPv4 tail: those are refused.
func steeredFile(vip netip.Addr, port uint16) (string, bool) {
	if vip.Is6() {
		b := vip.As16()
		if [10]byte(b[:10]) == [10]byte{} && (b[10] == 0 && b[11] == 0 || b[10] == 0xff && b[11] == 0xff) {
			return "", false
		}
	}
	return steeredDir + "/" + vip.String() + "_" + strconv.Itoa(int(port)), true
}
