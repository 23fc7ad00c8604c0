package nginx

import (
	"net/netip"
	"slices"
	"strconv"

	"github.com/portico-edge/portico/controlplane/model"
)

func hostSnapshot(hosts ...string) model.Snapshot {
	s := model.Snapshot{Upstreams: []model.Upstream{{Name: "ns-svc-80", Endpoints: []netip.AddrPort{ap("10.0.0.1:80")}}}}
	for _, h := range hosts {
		s.Servers = append(s.Servers, model.Server{Host: h, Locations: []model.Location{{Path: "/", Type: model.PathPrefix, Upstream: "ns-svc-80"}}})
	}
	return s
}

// withL4 adds an L4 Service with one TCP port to s: a change only a reload
// applies (nginx must listen on the port).
func withL4(s model.Snapshot, name string, port uint16) model.Snapshot {
	up := "l4-" + strconv.Itoa(int(port))
	s.Upstreams = append(slices.Clone(s.Upstreams), model.Upstream{Name: up, Endpoints: []netip.AddrPort{ap("10.0.0.9:9")}})
	s.Services = append(slices.Clone(s.Services), model.Service{Name: name, VIPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")},
		Ports: []model.ServicePort{{Protocol: model.TCP, Port: port, Upstream: up}}})
	return s
}
