package nginx

import (
	"cmp"
	"fmt"
	"net/netip"
	"path"
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
		// Options.L4Dir), by upstream name: its endpoints, separated by spaces.
		Endpoints map[string][]byte
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
			if len(eps) == 0 || len(svc.VIPs) == 0 {
				continue
			}
			udp := p.Protocol == model.UDP
			srv := tmplStreamServer{Comment: fmt.Sprintf("%s %s/%d", svc.Name, p.Protocol, p.Port), UDP: udp,
				Upstream: path.Join(r.opt.L4Dir, p.Upstream), Hash: svc.ClientIPAffinity,
				ProxyProtocol: svc.ProxyProtocol && !udp, ProxyDatagrams: svc.ProxyProtocol && udp, Timeout: "1h"}
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
	if len(st.Servers) == 0 {
		return nil
	}
	return &st
}
