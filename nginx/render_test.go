package nginx

import (
	"bytes"
	"flag"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/testenv"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// goldenOptions are production options with every file relative to nginx's prefix, so
// `nginx -t -p <tempdir>` validates the golden text byte for byte.
func goldenOptions() Options {
	o := DefaultOptions("")
	o.ListenIPv6 = true // not the node's: golden files are the same everywhere
	return o
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func testCert(t testing.TB, name string) model.Certificate {
	t.Helper()
	crt, err := os.ReadFile(filepath.Join("testdata", "certs", "secure.example.com.crt"))
	if err != nil {
		t.Fatal(err)
	}
	key, err := os.ReadFile(filepath.Join("testdata", "certs", "secure.example.com.key"))
	if err != nil {
		t.Fatal(err)
	}
	return model.Certificate{Name: name, CertPEM: crt, KeyPEM: key}
}

func goldenCases(t testing.TB) map[string]model.Snapshot {
	web := model.Upstream{Name: "shop-web-80", Endpoints: []netip.AddrPort{ap("10.0.1.10:8080"), ap("10.0.1.11:8080")}}
	api := model.Upstream{Name: "shop-api-http", Endpoints: []netip.AddrPort{ap("10.0.2.10:9000")}}
	l4 := model.Snapshot{
		Groups: []model.Group{{Name: "edge/a"}, {Name: "edge/b"}},
		Services: []model.Service{
			{Name: "shop/dns", Group: "edge/a", VIPs: []netip.Addr{netip.MustParseAddr("127.0.0.53"), netip.MustParseAddr("127.0.0.153")},
				ProxyProtocol: true, ClientIPAffinity: true, Ports: []model.ServicePort{
					{Protocol: model.TCP, Port: 15353, Upstream: "shop-dns-15353-tcp"}, {Protocol: model.UDP, Port: 15353, Upstream: "shop-dns-15353-udp"}}},
			{Name: "shop/empty", Group: "edge/a", VIPs: []netip.Addr{netip.MustParseAddr("127.0.0.54")}, Ports: []model.ServicePort{
				{Protocol: model.TCP, Port: 15432, Upstream: "shop-empty-15432-tcp"}}},
			{Name: "shop/other", Group: "edge/b", VIPs: []netip.Addr{netip.MustParseAddr("127.0.0.55")}, Ports: []model.ServicePort{
				{Protocol: model.TCP, Port: 15022, Upstream: "shop-other-15022-tcp"}}},
		},
		Upstreams: []model.Upstream{
			{Name: "shop-dns-15353-tcp", Endpoints: []netip.AddrPort{ap("10.0.5.1:5353"), ap("10.0.5.2:5353")}},
			{Name: "shop-dns-15353-udp", Endpoints: []netip.AddrPort{ap("10.0.5.1:5353"), ap("[2001:db8:5::2]:5353")}},
			{Name: "shop-empty-15432-tcp"},
			{Name: "shop-other-15022-tcp", Endpoints: []netip.AddrPort{ap("10.0.5.9:22")}},
		},
	}
	return map[string]model.Snapshot{
		"one-host": {
			Servers: []model.Server{{Group: "edge/a", Host: "shop.example.com", Locations: []model.Location{
				{Path: "/", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/web"},
			}}},
			Upstreams: []model.Upstream{web},
		},
		"many-hosts-path-types": {
			Servers: []model.Server{
				{Group: "edge/a", Host: "*.apps.example.com", Locations: []model.Location{
					{Path: "/", Type: model.PathImplementationSpecific, Upstream: "shop-web-80", Source: "shop/wild"},
				}},
				{Group: "edge/a", Host: "api.example.com", Locations: []model.Location{
					{Path: "/", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/api"},
					{Path: "/v1", Type: model.PathExact, Upstream: "shop-api-http", Source: "shop/api"},
					{Path: "/v1", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/api"},
					{Path: "/v1/users/", Type: model.PathPrefix, Upstream: "shop-api-http", Source: "shop/api"},
					{Path: "/v2/", Type: model.PathExact, Upstream: "shop-api-http", Source: "shop/api"},
					{Path: "/static", Type: model.PathImplementationSpecific, Upstream: "shop-web-80", Source: "shop/api"},
				}},
				{Group: "edge/a", Host: "shop.example.com", Locations: []model.Location{
					{Path: "/cart", Type: model.PathPrefix, Upstream: "shop-api-http", Source: "shop/web"},
				}},
				{Group: "edge/b", Host: "other-group.example.com", Locations: []model.Location{
					{Path: "/", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/other"},
				}},
			},
			Upstreams: []model.Upstream{api, web},
		},
		// Group edge/a answers hosts it has no server for with 404.
		"unmatched-host-not-found": {
			Groups: []model.Group{{Name: "edge/a", UnmatchedHost: model.UnmatchedHostNotFound}, {Name: "edge/b"}},
			Servers: []model.Server{{Group: "edge/a", Host: "shop.example.com", Locations: []model.Location{
				{Path: "/", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/web"},
			}}},
			Upstreams: []model.Upstream{web},
		},
		// Views (Gateways with VIPs of their own): each port of each has its
		// own hosts, catch-all (404 when it has none) and wildcard depths,
		// keyed by its prefix; "a:" maps their VIPs (text and bytes) and
		// ports to it. The same host in
		// the group's own hosts and in two views is three entries; another
		// group's view is not rendered.
		"views": {
			Groups: []model.Group{{Name: "edge/a", UnmatchedHost: model.UnmatchedHostNotFound}, {Name: "edge/b"}},
			Views: []model.View{
				{Name: "infra/gw-1", Group: "edge/a", VIPs: []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8::10")},
					Ports: []model.Port{{Protocol: model.TCP, Port: 80}, {Protocol: model.TCP, Port: 8443}}, TLSPorts: []uint16{8443}},
				{Name: "infra/gw-2", Group: "edge/a", VIPs: []netip.Addr{netip.MustParseAddr("192.0.2.11")}, Ports: []model.Port{{Protocol: model.TCP, Port: 80}}},
				{Name: "infra/gw-3", Group: "edge/b", VIPs: []netip.Addr{netip.MustParseAddr("192.0.2.12")}, Ports: []model.Port{{Protocol: model.TCP, Port: 80}}},
			},
			Servers: []model.Server{
				{Group: "edge/a", Host: "shop.example.com", Locations: []model.Location{{Path: "/", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/web"}}},
				{Group: "edge/a", View: "infra/gw-1", Port: 80, Host: "", Locations: []model.Location{{Path: "/", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/route-1"}}},
				{Group: "edge/a", View: "infra/gw-1", Port: 80, Host: "**.example.com", Locations: []model.Location{{Path: "/deep", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/route-1"}}},
				{Group: "edge/a", View: "infra/gw-1", Port: 80, Host: "shop.example.com", Locations: []model.Location{{Path: "/one", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/route-1"}}},
				{Group: "edge/a", View: "infra/gw-2", Port: 80, Host: "shop.example.com", Locations: []model.Location{{Path: "/two", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/route-2"}}},
				{Group: "edge/b", View: "infra/gw-3", Port: 80, Host: "shop.example.com", Locations: []model.Location{{Path: "/three", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/route-3"}}},
			},
			Upstreams: []model.Upstream{web},
		},
		// Group edge/a serves HTTP on 8080 and HTTPS on 8443 (its Service's ports
		// named http and https); the redirect names the HTTPS port.
		"custom-ports": {
			Groups: []model.Group{{Name: "edge/a", HTTPPort: 8080, HTTPSPort: 8443}, {Name: "edge/b", HTTPPort: 9080}},
			Servers: []model.Server{
				{Group: "edge/a", Host: "secure.example.com", TLSCertificate: "shop/secure-tls", SSLRedirect: true, Locations: []model.Location{
					{Path: "/", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/secure"},
				}},
			},
			Upstreams:    []model.Upstream{web},
			Certificates: []model.Certificate{testCert(t, "shop/secure-tls")},
		},
		// L4 Services: TCP and UDP ports, PROXY protocol (TCP only) and
		// client-address affinity; a port without endpoints gets no server;
		// another group's Service is not rendered. nginx -t binds the listen
		// addresses, so the VIPs here are loopback ones.
		"l4-services": l4,
		// The same L4 Services with steered listeners (Options.L4Steered): the
		// TCP ports become routes and files, served by two fixed listeners; the
		// UDP port keeps its own.
		"l4-steered": l4,
		// Cookie affinity on two paths (one with a max-age), none on a third.
		"cookie-affinity": {
			Servers: []model.Server{{Group: "edge/a", Host: "shop.example.com", Locations: []model.Location{
				{Path: "/", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/web"},
				{Path: "/cart/", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/cart", Affinity: model.CookieAffinity{Cookie: "portico-affinity"}},
				{Path: "/pay", Type: model.PathExact, Upstream: "shop-api-http", Source: "shop/pay", Affinity: model.CookieAffinity{Cookie: "PAY_id", MaxAge: 3600}},
			}}},
			Upstreams: []model.Upstream{api, web},
		},
		"tls-redirect": {
			Servers: []model.Server{
				{Group: "edge/a", Host: "bad-cert.example.com", TLSCertificate: "shop/broken", Locations: []model.Location{
					{Path: "/", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/bad"},
				}},
				{Group: "edge/a", Host: "missing-cert.example.com", TLSCertificate: "shop/absent", SSLRedirect: true, Locations: []model.Location{
					{Path: "/", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/missing"},
				}},
				{Group: "edge/a", Host: "plain.example.com", Locations: []model.Location{
					{Path: "/", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/plain"},
				}},
				{Group: "edge/a", Host: "redirect-no-tls.example.com", SSLRedirect: true, Locations: []model.Location{
					{Path: "/", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/no-tls"},
				}},
				{Group: "edge/a", Host: "secure.example.com", TLSCertificate: "shop/secure-tls", SSLRedirect: true, Locations: []model.Location{
					{Path: "/", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/secure"},
				}},
				{Group: "edge/a", Host: "www.example.org", TLSCertificate: "shop/secure-tls", Locations: []model.Location{
					{Path: "/", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/org"},
				}},
			},
			Upstreams: []model.Upstream{web},
			Certificates: []model.Certificate{
				{Name: "shop/broken", CertPEM: []byte("-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n"), KeyPEM: []byte("junk")},
				testCert(t, "shop/secure-tls"),
				testCert(t, "shop/unreferenced"),
			},
		},
		"default-backend": {
			Servers: []model.Server{
				{Group: "edge/a", Host: "", DefaultUpstream: "shop-web-80"},
				{Group: "edge/a", Host: "shop.example.com", DefaultUpstream: "shop-web-80", Locations: []model.Location{
					{Path: "/api", Type: model.PathPrefix, Upstream: "shop-api-http", Source: "shop/web"},
				}},
			},
			Upstreams: []model.Upstream{api, web},
		},
		// Pod routes: trafficHosts "host1 host2", publicPaths "80:/ 3000:/nodejs", and a
		// test.k8s.local route served by three pods.
		"pod-routes": {
			Servers: []model.Server{
				{Group: "edge/a", Host: "host1", Locations: []model.Location{
					{Path: "/", Type: model.PathPrefix, Upstream: "default-nodejs-k8s-env-80", Source: "default/nodejs-k8s-env-eq7mh"},
					{Path: "/nodejs", Type: model.PathPrefix, Upstream: "default-nodejs-k8s-env-3000", Source: "default/nodejs-k8s-env-eq7mh"},
				}},
				{Group: "edge/a", Host: "host2", Locations: []model.Location{
					{Path: "/", Type: model.PathPrefix, Upstream: "default-nodejs-k8s-env-80", Source: "default/nodejs-k8s-env-eq7mh"},
					{Path: "/nodejs", Type: model.PathPrefix, Upstream: "default-nodejs-k8s-env-3000", Source: "default/nodejs-k8s-env-eq7mh"},
				}},
				{Group: "edge/a", Host: "test.k8s.local", Locations: []model.Location{
					{Path: "/nodejs", Type: model.PathPrefix, Upstream: "default-nodejs-k8s-env-3000", Source: "default/nodejs-k8s-env-eq7mh"},
				}},
			},
			Upstreams: []model.Upstream{
				{Name: "default-nodejs-k8s-env-3000", Endpoints: []netip.AddrPort{ap("10.244.69.6:3000"), ap("10.244.69.8:3000"), ap("10.244.69.9:3000")}},
				{Name: "default-nodejs-k8s-env-80", Endpoints: []netip.AddrPort{ap("10.244.69.6:80")}},
			},
		},
		"ipv6-endpoints": {
			Servers: []model.Server{{Group: "edge/a", Host: "v6.example.com", Locations: []model.Location{
				{Path: "/", Type: model.PathPrefix, Upstream: "shop-v6-80", Source: "shop/v6"},
			}}},
			Upstreams: []model.Upstream{{Name: "shop-v6-80", Endpoints: []netip.AddrPort{
				ap("10.0.3.1:80"), ap("[2001:db8::1]:80"), ap("[2001:db8::2]:8080"), ap("[fe80::1%eth0]:80"),
			}}},
		},
		"no-endpoints": {
			Servers: []model.Server{{Group: "edge/a", Host: "empty.example.com", Locations: []model.Location{
				{Path: "/", Type: model.PathPrefix, Upstream: "shop-empty-80", Source: "shop/empty"},
				{Path: "/gone", Type: model.PathPrefix, Upstream: "shop-deleted-80", Source: "shop/empty"},
				{Path: "/ok", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/empty"},
			}}},
			Upstreams: []model.Upstream{{Name: "shop-empty-80"}, web},
		},
		"injection": {
			Servers: []model.Server{
				{Group: "edge/a", Host: "", Locations: []model.Location{
					{Path: "/ok", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/x\n}\nserver {"},
				}},
				{Group: "edge/a", Host: "a.example.com;return 200", Locations: []model.Location{{Path: "/", Type: model.PathPrefix, Upstream: "shop-web-80"}}},
				{Group: "edge/a", Host: "b.example.com\n}", Locations: []model.Location{{Path: "/", Type: model.PathPrefix, Upstream: "shop-web-80"}}},
				{Group: "edge/a", Host: "Upper.example.com", Locations: []model.Location{{Path: "/", Type: model.PathPrefix, Upstream: "shop-web-80"}}},
				{Group: "edge/a", Host: "*.*.example.com", Locations: []model.Location{{Path: "/", Type: model.PathPrefix, Upstream: "shop-web-80"}}},
				{Group: "edge/a", Host: "paths.example.com", Locations: []model.Location{
					{Path: "/a;return 200 x", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/evil"},
					{Path: "/b { }", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/evil"},
					{Path: "/c\"quoted\"", Type: model.PathExact, Upstream: "shop-web-80", Source: "shop/evil"},
					{Path: "/d$host", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/evil"},
					{Path: "/e/../etc", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/evil"},
					{Path: "/f#comment", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/evil"},
					{Path: "/g%3B", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/evil"},
					{Path: "relative", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/evil"},
					{Path: "/h", Type: "Regex", Upstream: "shop-web-80", Source: "shop/evil"},
					{Path: "/i", Type: model.PathPrefix, Upstream: "evil;proxy_pass http://x", Source: "shop/evil"},
					{Path: "/safe-path_~!&*+,=:@.x", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/evil"},
				}},
			},
			Upstreams: []model.Upstream{
				{Name: "evil;proxy_pass http://x", Endpoints: []netip.AddrPort{ap("10.0.0.1:80")}},
				web,
			},
		},
	}
}

// TestRenderGroupPorts: a group port that this nginx's status or liveness server
// already uses is reported and the agent's port kept; so are http and https
// ending up on one port.
func TestRenderGroupPorts(t *testing.T) {
	opt := goldenOptions()
	opt.Group = "edge/a"
	opt.LivenessPort = 10247
	for _, tc := range []struct {
		name            string
		http, https     uint16
		wantHTTP, wantS string
		problems        int
	}{
		{name: "both", http: 8080, https: 8443, wantHTTP: "listen 8080", wantS: "listen 8443 ssl"},
		{name: "liveness port", http: 10247, https: 8443, wantHTTP: "listen 80", wantS: "listen 8443 ssl", problems: 1},
		{name: "status port", http: 8080, https: opt.StatusPort, wantHTTP: "listen 8080", wantS: "listen 443 ssl", problems: 1},
		{name: "http on the default https port", http: 443, wantHTTP: "listen 80", wantS: "listen 443 ssl", problems: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap := model.Snapshot{
				Groups: []model.Group{{Name: "edge/a", HTTPPort: tc.http, HTTPSPort: tc.https}},
				Servers: []model.Server{{Group: "edge/a", Host: "secure.example.com", TLSCertificate: "shop/secure-tls", Locations: []model.Location{
					{Path: "/", Type: model.PathPrefix, Upstream: "shop-web-80", Source: "shop/secure"},
				}}},
				Upstreams:    []model.Upstream{{Name: "shop-web-80", Endpoints: []netip.AddrPort{ap("10.0.1.10:8080")}}},
				Certificates: []model.Certificate{testCert(t, "shop/secure-tls")},
			}
			cfg, err := Render(snap, opt)
			if err != nil {
				t.Fatal(err)
			}
			text := string(cfg.Text)
			for _, want := range []string{tc.wantHTTP + " default_server;", tc.wantS} {
				if !strings.Contains(text, want) {
					t.Errorf("config lacks %q", want)
				}
			}
			var conflicts []model.Problem
			for _, p := range cfg.Problems {
				if p.Reason == model.ReasonPortConflict {
					conflicts = append(conflicts, p)
				}
			}
			if len(conflicts) != tc.problems {
				t.Errorf("port conflicts reported: %v, want %d", conflicts, tc.problems)
			}
		})
	}
}

func TestRenderGolden(t *testing.T) {
	for name, snap := range goldenCases(t) {
		t.Run(name, func(t *testing.T) {
			opt := goldenOptions()
			opt.Group = "edge/a"
			if strings.HasPrefix(name, "l4-steered") {
				opt.L4Steered = [2]uint16{10242, 10243}
			}
			cfg, err := Render(snap, opt)
			if err != nil {
				t.Fatal(err)
			}
			again, err := Render(snap, opt)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(cfg.Text, again.Text) || !bytes.Equal(cfg.Table.encode(cfg.Digest, 1), again.Table.encode(again.Digest, 1)) {
				t.Fatal("two renders of the same snapshot differ")
			}
			var problems strings.Builder
			for _, p := range cfg.Problems {
				fmt.Fprintln(&problems, p.String())
			}
			checkGolden(t, filepath.Join("testdata", name, "nginx.conf.golden"), cfg.Text)
			checkGolden(t, filepath.Join("testdata", name, "problems.golden"), []byte(problems.String()))
			checkGolden(t, filepath.Join("testdata", name, "table.golden"), cfg.Table.encode(cfg.Digest, 1))
			if len(cfg.L4) > 0 {
				var l4 bytes.Buffer
				for _, f := range slices.Sorted(maps.Keys(cfg.L4)) {
					fmt.Fprintf(&l4, "%s: %s", f, cfg.L4[f])
				}
				for _, r := range cfg.L4Routes {
					fmt.Fprintf(&l4, "route %s class %d\n", r.VIP, r.Class)
				}
				checkGolden(t, filepath.Join("testdata", name, "l4.golden"), l4.Bytes())
			}
			nginxTest(t, t.TempDir(), cfg, opt)
		})
	}
}

func checkGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./nginx -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s differs (-want +got), refresh with -update if intended:\n%s", path, diff)
	}
}

// TestRenderLivenessAddr: with LivenessAddr the liveness server listens on that
// address alone (the node's own, not every address of the node, its VIPs among
// them); real nginx accepts it.
func TestRenderLivenessAddr(t *testing.T) {
	opt := goldenOptions()
	opt.LivenessPort = testenv.Ports(t, 1)[0]
	opt.LivenessAddr = netip.MustParseAddr("127.0.0.1")
	cfg, err := Render(model.Snapshot{}, opt)
	if err != nil {
		t.Fatal(err)
	}
	text := string(cfg.Text)
	want := fmt.Sprintf("listen 127.0.0.1:%d", opt.LivenessPort)
	if !strings.Contains(text, want) {
		t.Errorf("config lacks %q", want)
	}
	if strings.Contains(text, fmt.Sprintf("listen %d", opt.LivenessPort)) {
		t.Errorf("config still listens on every address's port %d", opt.LivenessPort)
	}
	nginxTest(t, t.TempDir(), cfg, opt)
}
