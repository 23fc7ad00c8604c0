package model

import (
	"net/netip"
	"strings"
	"testing"
)

// valid is a snapshot that follows every rule; each case of TestValidate breaks one.
func valid() Snapshot {
	return Snapshot{
		Groups: []Group{
			{Name: "edge/a", VIPs: []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")}, VRID: 1,
				Ports:    []Port{{TCP, 80}, {TCP, 443}, {UDP, 443}},
				Replicas: []Replica{{Node: "n1", Addr: netip.MustParseAddr("10.0.0.1"), State: Ready}, {Addr: netip.MustParseAddr("10.0.0.2"), State: Draining}}},
			{Name: "edge/b", UnmatchedHost: UnmatchedHostNotFound},
		},
		Servers: []Server{
			{Group: "edge/a", Host: "", DefaultUpstream: "app-web-80"},
			{Group: "edge/a", Host: "example.com", TLSCertificate: "app/tls", Locations: []Location{
				{Path: "/", Type: PathPrefix, Upstream: "app-web-80"},
				{Path: "/api", Type: PathExact, Upstream: "app-api-80"},
				{Path: "/api", Type: PathPrefix, Upstream: "app-api-80"},
			}},
			{Group: "edge/a", View: "app/gw", Port: 80, Host: "example.com"},
			{Group: "edge/b", Host: "example.com"},
		},
		Views: []View{{Name: "app/gw", Group: "edge/a", VIPs: []netip.Addr{netip.MustParseAddr("192.0.2.9")}, Ports: []Port{{TCP, 80}, {TCP, 443}}, TLSPorts: []uint16{443}}},
		Upstreams: []Upstream{
			{Name: "app-api-80"},
			{Name: "app-web-80", Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.1.0.1:80"), netip.MustParseAddrPort("[fd00::1]:80")}},
		},
		Certificates: []Certificate{{Name: "app/tls"}},
	}
}

func TestValidate(t *testing.T) {
	if err := valid().Validate(); err != nil {
		t.Fatalf("valid snapshot: %v", err)
	}
	if err := (Snapshot{}).Validate(); err != nil {
		t.Fatalf("empty snapshot: %v", err)
	}
	tests := []struct {
		name   string
		breaks func(*Snapshot)
		want   string
	}{
		{"groups out of order", func(s *Snapshot) { s.Groups[0], s.Groups[1] = s.Groups[1], s.Groups[0] }, `groups: "edge/b" before "edge/a", out of order`},
		{"group twice", func(s *Snapshot) { s.Groups[1].Name = "edge/a" }, `groups: "edge/a" twice`},
		{"nine IPv4 VIPs", func(s *Snapshot) {
			s.Groups[0].VIPs = nil
			for i := range 9 {
				s.Groups[0].VIPs = append(s.Groups[0].VIPs, netip.AddrFrom4([4]byte{192, 0, 2, byte(1 + i)}))
			}
		}, "group edge/a: more than 8 vips of an address family"},
		{"http port not served", func(s *Snapshot) { s.Groups[0].HTTPPort = 8080 }, "group edge/a: http port 8080 is not one of the group's TCP ports"},
		{"http and https on one port", func(s *Snapshot) { s.Groups[0].HTTPPort, s.Groups[0].HTTPSPort = 443, 443 }, "group edge/a: http and https share port 443"},
		{"bad affinity cookie", func(s *Snapshot) { s.Servers[1].Locations[0].Affinity.Cookie = "a b" }, `server edge/a "example.com": path "/": affinity cookie "a b"`},
		{"mapped VIP", func(s *Snapshot) { s.Groups[0].VIPs[0] = netip.MustParseAddr("::ffff:192.0.2.1") }, `group edge/a: vip "::ffff:192.0.2.1" is not a plain`},
		{"ports out of order", func(s *Snapshot) { s.Groups[0].Ports[0].Port = 8080 }, `group edge/a: ports: "TCP/8080" before "TCP/443", out of order`},
		{"unknown protocol", func(s *Snapshot) { s.Groups[0].Ports[2].Protocol = "SCTP" }, `group edge/a: port 443 has protocol "SCTP"`},
		{"replica twice", func(s *Snapshot) { s.Groups[0].Replicas[1].Addr = s.Groups[0].Replicas[0].Addr }, `group edge/a: replicas: "10.0.0.1" twice`},
		{"replica state", func(s *Snapshot) { s.Groups[0].Replicas[0].State = "" }, `group edge/a: replica 10.0.0.1 has state ""`},
		{"unmatched host answer", func(s *Snapshot) { s.Groups[1].UnmatchedHost = "not-found" }, `group edge/b: unmatched host answer "not-found"`},
		{"view of another group", func(s *Snapshot) { s.Servers[3].View = "app/gw" }, `server edge/b "example.com": view "app/gw" is not one of group edge/b's`},
		{"missing view", func(s *Snapshot) { s.Servers[2].View = "app/gone" }, `view "app/gone" is not one of group edge/a's`},
		{"view servers out of order", func(s *Snapshot) { s.Servers[2].View, s.Servers[2].Port = "", 0 }, `servers: "edge/a example.com" twice`},
		{"port outside a view", func(s *Snapshot) { s.Servers[1].Port = 80 }, `server edge/a "example.com": port 80 or listener "" outside a view`},
		{"bad listener", func(s *Snapshot) { s.Servers[2].Listener = "a b" }, `server edge/a "example.com": listener "a b"`},
		{"port not the view's", func(s *Snapshot) { s.Servers[2].Port = 8080 }, `server edge/a "example.com": port 8080 is not one of view app/gw's`},
		{"tls port not the view's", func(s *Snapshot) { s.Views[0].TLSPorts = []uint16{8443} }, "view app/gw: tls port 8443 is not one of its ports"},
		{"view without VIP", func(s *Snapshot) { s.Views[0].VIPs = nil }, "view app/gw: no vip"},
		{"view without port", func(s *Snapshot) { s.Views[0].Ports = nil }, "view app/gw: no port"},
		{"view UDP port", func(s *Snapshot) { s.Views[0].Ports[1].Protocol = UDP; s.Views[0].TLSPorts = nil }, "view app/gw: port UDP/443 is not a TCP port"},
		{"view of a missing group", func(s *Snapshot) { s.Views[0].Group = "edge/c" }, `view app/gw: group "edge/c" does not exist`},
		{"view VIP a group's", func(s *Snapshot) { s.Views[0].VIPs[0] = netip.MustParseAddr("192.0.2.1") }, "view app/gw: vip 192.0.2.1 is also group edge/a's"},
		{"servers out of order", func(s *Snapshot) { s.Servers[0].Host = "z.example.com" }, `servers: "edge/a z.example.com" before "edge/a example.com", out of order`},
		{"server of a missing group", func(s *Snapshot) { s.Servers[3].Group = "edge/c" }, `server edge/c "example.com": group "edge/c" does not exist`},
		{"missing certificate", func(s *Snapshot) { s.Servers[1].TLSCertificate = "app/gone" }, `certificate "app/gone" does not exist`},
		{"missing default upstream", func(s *Snapshot) { s.Servers[0].DefaultUpstream = "gone" }, `server edge/a "": default upstream "gone" does not exist`},
		{"missing upstream", func(s *Snapshot) { s.Servers[1].Locations[0].Upstream = "gone" }, `path "/": upstream "gone" does not exist`},
		{"location twice", func(s *Snapshot) { s.Servers[1].Locations[2].Type = PathExact }, `locations: "Exact /api" twice`},
		{"location rank twice", func(s *Snapshot) {
			s.Servers[1].Locations = append(s.Servers[1].Locations, Location{Path: "/api", Type: PathPrefix, Upstream: "app-api-80"})
			s.Servers[1].Locations[2].Rank, s.Servers[1].Locations[3].Rank = 2, 2
		}, `locations: "Prefix /api rank 2" twice`},
		{"two targets", func(s *Snapshot) { s.Servers[1].Locations[0].Status = 500 }, `path "/": 2 of upstream, backends and status set, want 1`},
		{"backend missing upstream", func(s *Snapshot) {
			s.Servers[1].Locations[0].Upstream = ""
			s.Servers[1].Locations[0].Backends = []Backend{{Upstream: "app-web-80", Weight: 1}, {Upstream: "gone", Weight: 1}}
		}, `path "/": upstream "gone" does not exist`},
		{"backend both", func(s *Snapshot) {
			s.Servers[1].Locations[0].Upstream = ""
			s.Servers[1].Locations[0].Backends = []Backend{{Upstream: "app-web-80", Status: 500, Weight: 1}}
		}, `path "/": a backend names both or neither`},
		{"redirect not 3xx", func(s *Snapshot) {
			s.Servers[1].Locations[0].Upstream, s.Servers[1].Locations[0].Status = "", 200
			s.Servers[1].Locations[0].Filters.Redirect = &Redirect{Scheme: "https"}
		}, `path "/": a redirect answers status 200, not a 3xx`},
		{"prefix rewrite on exact", func(s *Snapshot) {
			s.Servers[1].Locations[1].Filters.Rewrite = &Rewrite{Path: PathChange{Type: PathChangePrefix, Value: "/v2"}}
		}, `path "/api": a prefix replacement needs a Prefix path, not Exact`},
		{"unknown path type", func(s *Snapshot) { s.Servers[1].Locations[0].Type = "Regex" }, `path "/" has type "Regex"`},
		{"endpoints out of order", func(s *Snapshot) {
			e := s.Upstreams[1].Endpoints
			e[0], e[1] = e[1], e[0]
		}, `upstream app-web-80: endpoints: "[fd00::1]:80" before "10.1.0.1:80", out of order`},
		{"invalid endpoint", func(s *Snapshot) { s.Upstreams[0].Endpoints = []netip.AddrPort{{}} }, "upstream app-api-80: endpoint"},
		{"certificate twice", func(s *Snapshot) { s.Certificates = append(s.Certificates, s.Certificates[0]) }, `certificates: "app/tls" twice`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := valid()
			tc.breaks(&s)
			err := s.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
