package nginx

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"net/netip"
	"path"
	"slices"
	"strconv"
	"strings"
	"text/template"

	"github.com/portico-edge/portico/controlplane/model"
)

//go:embed templates/nginx.conf.tmpl
var templateFS embed.FS

var confTemplate = template.Must(template.New("nginx.conf.tmpl").ParseFS(templateFS, "templates/nginx.conf.tmpl"))

// checksumPlaceholder stands for the configuration's checksum while it is computed.
// It contains '%', which no validated value can contain.
const checksumPlaceholder = "%PORTICO-CHECKSUM%"

// Config is one rendered configuration and what it needs on disk.
type Config struct {
	// Text is the nginx.conf. It holds what only a reload can change: where
	// nginx listens (the HTTP and HTTPS ports, each L4 Service's addresses and
	// ports) and its own settings. Hosts, paths, certificates and endpoints are
	// in Table.
	Text []byte
	// Checksum identifies Text; the status port's /healthz answers with it, so a
	// client can tell which configuration the serving workers run.
	Checksum string
	// Table is every host's routes, every certificate and every upstream's
	// endpoints (see lua/portico.lua), and Digest its digest, which the control
	// socket answers with once nginx uses it.
	Table  table
	Digest string
	// L4 are the contents of the L4 Service ports' endpoint files, by file name
	// inside Options.L4Dir.
	L4 map[string][]byte
	// L4Routes are the TCP VIPs and ports that the steered listeners serve
	// (Options.L4Steered), each with its file in L4, and the Views' ports
	// nginx's HTTP and HTTPS listeners serve without listening on them: the
	// routes of package dataplane/steer, which ReloaderConfig.SteerL4 gets.
	L4Routes []L4Route
	// Certificates are the certificates Table holds, as files, for OpenSSL's
	// check (checkWithNginx) before nginx gets them.
	Certificates []CertFile
	// Problems are the parts of the snapshot that were left out, and why.
	Problems []model.Problem

	refusedSeen []string // refused certificate files the snapshot still references
}

// CertFile is one certificate chain and its key, in one PEM file.
type CertFile struct {
	Name string // file name inside Options.CertDir
	PEM  []byte
}

// Template data: every string is already validated or built from validated parts.
type (
	tmplData struct {
		Opt            Options
		FallbackCert   string   // the certificate nginx needs to start TLS, never sent
		DictSize       string   // of the shared dictionary that holds the table
		Listen         []string // HTTP listen addresses with port
		ListenTLS      []string
		StatusListen   string
		LivenessListen []string
		LuaDigest      string // of the Lua module nginx.conf loads
		// AccessLog is the access log's file ("" for none), AccessLogSample the
		// share of requests it logs, as Lua reads it ("0.01", "1").
		AccessLog, AccessLogSample string
		Default                    tmplServer  // the catch-all's table entry ("h:")
		Stream                     *tmplStream // nil: no L4 Service, no stream module
		Checksum                   string
		// WorkerConnections and RlimitNofile: each connection may need two files
		// (client and upstream).
		WorkerConnections int
		RlimitNofile      int
	}
	tmplServer struct {
		Names     []string // server_name tokens; empty for the default server
		Comment   string
		Redirect  string // HTTPS URL prefix, "" for none
		TLSCert   string // PEM file path, "" for no TLS server
		CertID    string // its file name, the certificate's key in the table
		Locations []tmplLocation
		// Return, when non-zero, answers every request with this status instead of
		// Locations: the default server without a catch-all (444 closes the
		// connection, 404 for model.UnmatchedHostNotFound).
		Return int
		// Listener is model.Server.Listener (validated).
		Listener string
	}
	tmplLocation struct {
		Match    string // "= /p" or "/p/"
		Upstream string // "" answers 503
		Status   int    // non-zero: return this status instead of proxying
		Source   string // for a comment, validated
		// Cookie affinity (model.CookieAffinity): the cookie's name, "" for none;
		// its Path attribute (the Ingress path); its Max-Age, "" for a session
		// cookie. All validated.
		Affinity, AffinityPath, AffinityMaxAge string
		// Backends, when set, share the requests by weight (rules.go's
		// backends); Options are the conditions and filters (options).
		Backends, Options string
	}
)

// Render turns the L7 part of a snapshot into an nginx configuration. It is pure: the
// same snapshot and options give the same bytes. Objects that cannot be rendered
// safely are left out and reported in Config.Problems; only invalid options are an
// error.
func Render(snap model.Snapshot, opt Options) (*Config, error) {
	return render(snap, opt, nil, nil)
}

// render is Render that also leaves out the certificate files in refused (file
// name → why nginx refused to load it) and, with a cache, checks only the
// certificates that changed since the last render with it.
func render(snap model.Snapshot, opt Options, refused map[string]string, cache *certCache) (*Config, error) {
	if err := opt.validate(); err != nil {
		return nil, fmt.Errorf("render nginx config: %w", err)
	}
	r := renderer{opt: opt, upstreams: make(map[string]model.Upstream, len(snap.Upstreams)), certs: map[string]certResult{}, refused: refused, cache: cache}
	if cache != nil {
		cache.next = nil // what a render that failed half way kept
	}
	for _, u := range snap.Upstreams {
		r.upstreams[u.Name] = u
	}
	for _, c := range snap.Certificates {
		r.certsIn = append(r.certsIn, c)
	}
	r.opt = r.groupPorts(snap)
	opt = r.opt
	d := tmplData{Opt: opt, Checksum: checksumPlaceholder, LuaDigest: luaDigest, WorkerConnections: opt.WorkerConnections,
		FallbackCert: path.Join(opt.CertDir, fallbackCertFile), DictSize: dictSize}
	if d.WorkerConnections == 0 {
		d.WorkerConnections = 16384
	}
	d.RlimitNofile = 2*d.WorkerConnections + 1024
	d.AccessLog, d.AccessLogSample = accessLog(opt)
	d.Listen, d.ListenTLS, d.LivenessListen = listenAddrs(opt)
	d.StatusListen = netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), opt.StatusPort).String()
	d.Default = tmplServer{Return: 444}
	for _, g := range snap.Groups {
		if g.Name == opt.Group && g.UnmatchedHost == model.UnmatchedHostNotFound {
			d.Default.Return = 404
		}
	}

	t := make(table, len(snap.Servers)+len(snap.Upstreams)+len(snap.Certificates)+1)
	views := r.views(snap, t)
	seen := make(map[string]bool, len(snap.Servers))
	depths := map[string]map[int]bool{} // by view prefix: label counts of the suffixes of "**." hosts
	catchAll := map[string]*model.Server{}
	for i := range snap.Servers {
		s := &snap.Servers[i]
		if opt.Group != "" && s.Group != opt.Group {
			continue
		}
		obj := "Server " + s.Host
		if commentSafe(s.Host) != s.Host {
			obj = "Server " + strconv.Quote(s.Host)
		}
		prefix, ok := views[viewPort{s.View, s.Port}]
		if !ok {
			r.problem(obj, "view", model.ReasonInvalidHost, fmt.Sprintf("view %q port %d is not one of the group's; not served", s.View, s.Port))
			continue
		}
		if s.Host == "" {
			if catchAll[prefix] != nil {
				r.problem(obj, "host", model.ReasonDuplicateHost, "more than one catch-all server; the first is used")
				continue
			}
			catchAll[prefix] = s
			continue
		}
		if err := validateHost(s.Host); err != nil {
			r.problem(obj, "host", model.ReasonInvalidHost, err.Error())
			continue
		}
		if seen[prefix+s.Host] {
			r.problem(obj, "host", model.ReasonDuplicateHost, "host appears in more than one server; the first is used")
			continue
		}
		seen[prefix+s.Host] = true
		t["h:"+prefix+s.Host] = hostValue(r.server(s), opt.HTTPSPort)
		if suffix, ok := strings.CutPrefix(s.Host, "**."); ok {
			if depths[prefix] == nil {
				depths[prefix] = map[int]bool{}
			}
			depths[prefix][strings.Count(suffix, ".")+1] = true
		}
	}
	for prefix, ds := range depths {
		t["w:"+prefix] = depthsValue(ds)
	}
	for _, prefix := range views {
		def := tmplServer{Return: 404} // a Gateway's answer to a host no route takes
		if prefix == "" {
			def = d.Default
		}
		if s := catchAll[prefix]; s != nil {
			def = r.server(s)
		}
		if prefix == "" {
			d.Default = def
		}
		t["h:"+prefix] = hostValue(def, opt.HTTPSPort)
	}

	d.Stream = r.stream(snap)

	for n := range r.usedUpstreams {
		t["u:"+n] = upstreamValue(r.upstreams[n].Endpoints)
	}

	var buf bytes.Buffer
	if err := confTemplate.Execute(&buf, d); err != nil {
		return nil, fmt.Errorf("render nginx config: %w", err)
	}
	sum := sha256.Sum256(bytes.TrimRight(buf.Bytes(), "\n"))
	cfg := &Config{Checksum: hex.EncodeToString(sum[:]), Table: t}
	text := append(bytes.TrimRight(buf.Bytes(), "\n"), '\n')
	cfg.Text = bytes.ReplaceAll(text, []byte(checksumPlaceholder), []byte(cfg.Checksum))
	for _, c := range r.certsIn {
		if res, ok := r.certs[c.Name]; ok && res.err == nil && r.refused[res.file.Name] == "" {
			cfg.Certificates = append(cfg.Certificates, res.file)
			t["c:"+res.file.Name] = certValue(res.file.PEM)
		}
	}
	cfg.Digest = t.digestCached(cache)
	if d.Stream != nil {
		cfg.L4, cfg.L4Routes = d.Stream.Endpoints, d.Stream.Routes
	}
	cfg.L4Routes = append(cfg.L4Routes, r.viewRoutes(snap)...)
	slices.SortFunc(cfg.Certificates, func(a, b CertFile) int { return strings.Compare(a.Name, b.Name) })
	// In one order whatever the order they were found in (cachedLocations).
	slices.SortFunc(r.problems, func(a, b model.Problem) int {
		return cmp.Or(strings.Compare(a.Object, b.Object), strings.Compare(a.Field, b.Field),
			strings.Compare(string(a.Reason), string(b.Reason)), strings.Compare(a.Detail, b.Detail))
	})
	cfg.Problems = r.problems
	cfg.refusedSeen = r.refusedSeen
	cache.keep(r.certs)
	return cfg, nil
}

type renderer struct {
	opt           Options
	upstreams     map[string]model.Upstream
	usedUpstreams map[string]bool // validated upstreams a location uses
	certsIn       []model.Certificate
	certs         map[string]certResult // checked certificates by name
	cache         *certCache            // checks of earlier renders, or nil
	refused       map[string]string     // certificate files nginx refused, and why
	rec           *locationsEntry       // what locations is doing, for the cache
	refusedSeen   []string
	problems      []model.Problem
}

// views gives each port of each View of the rendered group its prefix in the
// table's host keys ("<n>/", n counting from 1 in the Views' and their ports'
// order; a host never holds a "/", so no request's host can name another
// view's), by View name and port, "" and 0 the prefix of the Servers of no
// View; and writes "a:", which maps each View's VIPs (their text and the hex
// of their bytes) and ports to its prefix: the Lua picks a request's view by
// the address and port it came to.
func (r *renderer) views(snap model.Snapshot, t table) map[viewPort]string {
	out := map[viewPort]string{{}: ""}
	var a []string
	for _, v := range snap.Views {
		if r.opt.Group != "" && v.Group != r.opt.Group {
			continue
		}
		for _, port := range v.Ports {
			p := strconv.Itoa(len(out)) + "/"
			out[viewPort{v.Name, port.Port}] = p
			for _, vip := range v.VIPs {
				if nginxIPv4Tail(vip) {
					// nginx's $server_addr writes it otherwise than Go.
					r.problem("Gateway "+v.Name, "addresses", model.ReasonInvalidVIP,
						fmt.Sprintf("VIP %s is an IPv4-compatible or -mapped IPv6 address, which nginx names otherwise; not served", vip))
					continue
				}
				a = append(a, vip.String()+"|"+hex.EncodeToString(vip.AsSlice())+"|"+strconv.Itoa(int(port.Port))+"="+p)
			}
		}
	}
	if len(a) > 0 {
		slices.Sort(a)
		t["a:"] = strings.Join(a, " ")
	}
	return out
}

// viewRoutes are the routes that give the rendered group's Views' ports
// other than nginx's HTTP and HTTPS ports to those listeners (an HTTP port
// served over TLS, or the other way round, too): the steered listeners'
// sk_lookup program takes them, so that a Gateway's listener on a new port
// is a route, never a listen directive and a reload. Without steering
// (Options.L4Steered) they are reported and not served.
func (r *renderer) viewRoutes(snap model.Snapshot) []L4Route {
	var out []L4Route
	for _, v := range snap.Views {
		if r.opt.Group != "" && v.Group != r.opt.Group {
			continue
		}
		for _, p := range v.Ports {
			class, listen := HTTPRoute, r.opt.HTTPPort
			if slices.Contains(v.TLSPorts, p.Port) {
				class, listen = HTTPSRoute, r.opt.HTTPSPort
			}
			if p.Port == listen {
				continue // nginx listens on it
			}
			if r.opt.L4Steered[0] == 0 || listen == 0 {
				r.problem("Gateway "+v.Name, fmt.Sprintf("port %d", p.Port), model.ReasonPortReserved,
					"this edge's nginx serves HTTP and HTTPS on its own ports alone (its agent runs without -l4-steer-port); not served")
				continue
			}
			for _, vip := range v.VIPs {
				out = append(out, L4Route{VIP: netip.AddrPortFrom(vip, p.Port), Class: class, Listen: listen})
			}
		}
	}
	return out
}

// nginxIPv4Tail reports whether nginx writes a as IPv6 with an IPv4 tail
// (ngx_inet6_ntop: "::ffff:1.2.3.4", "::1.2.3.4"), which Go does not: its
// $server_addr would not be the text the table names it by.
func nginxIPv4Tail(a netip.Addr) bool {
	b := a.As16()
	if !a.Is6() || [10]byte(b[:10]) != [10]byte{} {
		return false
	}
	switch {
	case b[10] == 0xff && b[11] == 0xff:
		return true
	case b[10] != 0 || b[11] != 0:
		return false
	case b[12] != 0 || b[13] != 0:
		return true
	}
	return b[14] != 0 && b[15] != 1
}

// viewPort is a View's name and one of its ports.
type viewPort struct {
	view string
	port uint16
}

// groupPorts returns the options with the HTTP and HTTPS ports of the rendered
// group (Options.Group) when its Service names them (model.Group.HTTPPort,
// HTTPSPort). A port that another server of this nginx already uses (the status
// or liveness port) is reported and the option's kept.
func (r *renderer) groupPorts(snap model.Snapshot) Options {
	opt := r.opt
	if opt.Group == "" {
		return opt
	}
	for _, g := range snap.Groups {
		if g.Name != opt.Group {
			continue
		}
		for _, p := range []struct {
			name  string
			port  uint16
			field *uint16
		}{{"http", g.HTTPPort, &opt.HTTPPort}, {"https", g.HTTPSPort, &opt.HTTPSPort}} {
			switch {
			case p.port == 0:
			case p.port == opt.StatusPort || p.port == opt.LivenessPort:
				r.problem("Service "+g.Name, "spec.ports["+p.name+"]", model.ReasonPortConflict,
					fmt.Sprintf("port %d is this node's status or liveness port; serving %s on %d", p.port, p.name, *p.field))
			default:
				*p.field = p.port
			}
		}
		if opt.HTTPPort == opt.HTTPSPort { // one of them conflicted with the other's default
			r.problem("Service "+g.Name, "spec.ports", model.ReasonPortConflict,
				fmt.Sprintf("http and https would share port %d; serving the defaults", opt.HTTPPort))
			opt.HTTPPort, opt.HTTPSPort = r.opt.HTTPPort, r.opt.HTTPSPort
		}
	}
	return opt
}

func (r *renderer) problem(obj, field string, reason model.Reason, detail string) {
	p := model.Problem{Object: obj, Field: field, Reason: reason, Detail: detail}
	if r.rec != nil {
		r.rec.problems = append(r.rec.problems, p)
	}
	if slices.Contains(r.problems, p) {
		return
	}
	r.problems = append(r.problems, p)
}

// server renders one host's server block (without its names).
func (r *renderer) server(s *model.Server) tmplServer {
	var ts tmplServer
	if s.TLSCertificate != "" {
		if file, ok := r.cert(s); ok {
			ts.TLSCert, ts.CertID = path.Join(r.opt.CertDir, file), file
		}
	}
	if s.SSLRedirect && s.TLSCertificate == "" {
		// Nothing would answer on the HTTPS side: serve plain HTTP, and say so.
		r.problem("Server "+hostOrDefault(s.Host), "sslRedirect", model.ReasonRedirectWithoutTLS,
			"HTTPS redirect asked for a host without TLS; serving plain HTTP")
	} else if s.SSLRedirect {
		// The redirect stays even when the TLS server had to be skipped: the Ingress
		// asked for its traffic never to be served in clear text.
		ts.Redirect = "https://$host"
		if r.opt.HTTPSPort != 443 {
			ts.Redirect += ":" + strconv.Itoa(int(r.opt.HTTPSPort))
		}
	}
	ts.Locations = r.cachedLocations(s)
	ts.Listener = s.Listener
	return ts
}

func hostOrDefault(h string) string {
	if h == "" {
		return "(default)"
	}
	return h
}

// accessLog is where the access log goes ("" for nowhere) and the share of
// requests it logs, as a Lua number ("1" for every request).
func accessLog(o Options) (file, sample string) {
	switch o.AccessLog {
	case "":
		return "", ""
	case "stdout":
		file = "/dev/stdout"
	default:
		file = o.AccessLog
	}
	if o.AccessLogSample == 0 || o.AccessLogSample >= 1 {
		return file, "1"
	}
	return file, strconv.FormatFloat(o.AccessLogSample, 'g', 6, 64)
}

// commentSafe returns s when it can go into a comment ("namespace/name" of a
// Kubernetes object), and "" otherwise.
func commentSafe(s string) string {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte("-./ ", c) >= 0 || c >= 'A' && c <= 'Z') {
			return ""
		}
	}
	return s
}
