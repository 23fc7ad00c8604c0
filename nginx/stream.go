package nginx

import (
	"cmp"
	"fmt"
	"net/netip"
	"strconv"

	"github.com/portico-edge/portico/controlplane/model"
)

// Stream template data: L4 Services (model.Service) through nginx's stream
// module, which nginx.conf loads only when there is one.
type (
	tmplStream struct {
		Upstreams []tmplStreamUpstream
		Servers   []tmplStreamServer
		// JS is the digest of the njs module, imported when a UDP server
		// sends the PROXY protocol; "" when none does.
		JS string
	}
	tmplStreamUpstream struct {
		Name      string
		Hash      bool     // client-address affinity: consistent hash of $remote_addr
		Endpoints []string // address:port
	}
	tmplStreamServer struct {
		Comment        string // Service and port
		Listen         []string
		UDP            bool
		Timeout        string // proxy_timeout
		Upstream       string
		ProxyProtocol  bool // TCP: nginx's PROXY v1 header
		ProxyDatagrams bool // UDP: the njs filter's PROXY v2 header on every datagram
	}
)

// stream renders the rendered group's L4 Services: one server per Service port,
// listening on each of the Service's VIPs (which the agent keeps on lo), and one
// upstream per port with the Service's ready endpoints. A port without endpoints
// gets no server, so its connections are refused as the kernel refuses them (a
// TCP reset, an ICMP port unreachable), as kube-proxy does for a Service without
// endpoints. Unlike HTTP upstreams, these endpoints are in nginx.conf: a change
// of them reloads nginx, which keeps established connections in the old workers.
func (r *renderer) stream(snap model.Snapshot) *tmplStream {
	var st tmplStream
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
				Upstream: p.Upstream, ProxyProtocol: svc.ProxyProtocol && !udp, ProxyDatagrams: svc.ProxyProtocol && udp, Timeout: "1h"}
			if srv.ProxyDatagrams {
				st.JS = jsDigest
			}
			if udp {
				srv.Timeout = strconv.Itoa(int(cmp.Or(svc.UDPIdleTimeout, model.DefaultUDPIdleTimeout))) + "s"
			}
			for _, v := range svc.VIPs {
				srv.Listen = append(srv.Listen, netip.AddrPortFrom(v, p.Port).String())
			}
			st.Servers = append(st.Servers, srv)
			st.Upstreams = append(st.Upstreams, tmplStreamUpstream{Name: p.Upstream, Hash: svc.ClientIPAffinity, Endpoints: eps})
		}
	}
	if len(st.Servers) == 0 {
		return nil
	}
	return &st
}
