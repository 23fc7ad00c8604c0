package nginx

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"text/template"

	"github.com/portico-edge/portico/controlplane/model"
)

//go:embed templates/nginx.conf.tmpl templates/endpoints.lua
var templateFS embed.FS

// endpointsLua is the Lua code nginx.conf embeds (init_by_lua_block): it keeps the
// endpoint table and balances requests over it.
var endpointsLua = func() string {
	b, err := templateFS.ReadFile("templates/endpoints.lua")
	if err != nil {
		panic(err)
	}
	return strings.TrimRight(string(b), "\n")
}()

var confTemplate = template.Must(template.New("nginx.conf.tmpl").ParseFS(templateFS, "templates/nginx.conf.tmpl"))

// checksumPlaceholder stands for the configuration's checksum while it is computed.
// It contains '%', which no validated value can contain.
const checksumPlaceholder = "%PORTICO-CHECKSUM%"

// Problem reasons this package reports (model.Problem.Reason, a metric label).
const (
	ReasonInvalidHost         = "InvalidHost"
	ReasonDuplicateHost       = "DuplicateHost"
	ReasonInvalidPath         = "InvalidPath"
	ReasonInvalidPathType     = "InvalidPathType"
	ReasonPathConflict        = "PathConflict"
	ReasonUpstreamNotFound    = "UpstreamNotFound"
	ReasonInvalidUpstream     = "InvalidUpstream"
	ReasonInvalidEndpoint     = "InvalidEndpoint"
	ReasonCertificateNotFound = "CertificateNotFound"
	ReasonInvalidCertificate  = "InvalidCertificate"
	ReasonCertificateHost     = "CertificateHostMismatch"
	ReasonRedirectWithoutTLS  = "RedirectWithoutTLS"
)

// Options are the deployment-specific parts of a rendered configuration: where nginx
// listens and where it keeps its files. Relative paths are relative to nginx's prefix
// (the -p flag), which the Reloader sets to the directory holding the configuration,
// so the same renderer produces production configurations and test configurations in
// a temporary directory.
type Options struct {
	// Group selects the model.Servers to render (model.Server.Group). Empty renders
	// every server.
	Group string

	// ListenAddrs are the addresses the HTTP and HTTPS servers listen on. Empty means
	// the IPv4 wildcard, plus the IPv6 wildcard when ListenIPv6 is set (nginx does
	// not start when IPv6 is disabled on the node and ListenIPv6 is set).
	ListenAddrs []netip.Addr
	ListenIPv6  bool
	HTTPPort    uint16
	HTTPSPort   uint16
	// StatusPort serves /healthz and /nginx_status (stub_status) on 127.0.0.1 only.
	StatusPort uint16

	PIDFile   string // nginx's pid file
	ErrorLog  string // a file or "stderr"
	AccessLog string // a file, "" for none
	TempDir   string // parent of nginx's body and proxy temporary directories
	CertDir   string // where WriteCertificates puts the TLS files

	// ModulesDir holds Debian's dynamic modules: the Lua module
	// (libnginx-mod-http-lua) and the development kit it needs.
	ModulesDir string
	// EndpointsFile is the endpoint table (Config.Endpoints) that nginx loads at
	// every start and reload.
	EndpointsFile string
	// ControlSocket is the unix socket nginx takes endpoint tables on. Its
	// directory must be private: whoever can connect can reroute traffic. A
	// relative path is relative to the prefix (Exec runs nginx there).
	ControlSocket string

	User              string // worker user; "" keeps nginx's default
	WorkerProcesses   int    // 0 means one per core ("auto")
	WorkerConnections int    // 0 means 16384
}

// DefaultOptions are the production options: standard ports on every address (IPv6
// too when the node has it), files under dir (for example /run/portico/nginx, so
// private keys stay on tmpfs).
func DefaultOptions(dir string) Options {
	return Options{
		ListenIPv6: ipv6Available(),
		HTTPPort:   80,
		HTTPSPort:  443,
		StatusPort: 10246,
		PIDFile:    path.Join(dir, "nginx.pid"),
		ErrorLog:   "stderr",
		TempDir:    path.Join(dir, "tmp"),
		CertDir:    path.Join(dir, "certs"),

		ModulesDir:    "/usr/lib/nginx/modules",
		EndpointsFile: path.Join(dir, "endpoints.txt"),
		ControlSocket: path.Join(dir, "control", "nginx.sock"),
	}
}

// fileNameChar reports whether c may appear in a path written into the configuration.
func fileNameChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-._/", c) >= 0
}

func validateFilePath(name, p string, optional bool) error {
	if p == "" {
		if optional {
			return nil
		}
		return fmt.Errorf("option %s is empty", name)
	}
	for i := 0; i < len(p); i++ {
		if !fileNameChar(p[i]) {
			return fmt.Errorf("option %s %q has character %q outside [A-Za-z0-9-._/]", name, p, p[i])
		}
	}
	return nil
}

func (o Options) validate() error {
	var errs []error
	for _, f := range []struct {
		name, val string
		optional  bool
	}{
		{"PIDFile", o.PIDFile, false},
		{"ErrorLog", o.ErrorLog, false},
		{"AccessLog", o.AccessLog, true},
		{"TempDir", o.TempDir, false},
		{"CertDir", o.CertDir, false},
		{"ModulesDir", o.ModulesDir, false},
		{"EndpointsFile", o.EndpointsFile, false},
		{"ControlSocket", o.ControlSocket, false},
	} {
		errs = append(errs, validateFilePath(f.name, f.val, f.optional))
	}
	if o.HTTPPort == 0 || o.HTTPSPort == 0 || o.StatusPort == 0 {
		errs = append(errs, errors.New("options HTTPPort, HTTPSPort and StatusPort must be set"))
	}
	if o.HTTPPort == o.HTTPSPort || o.HTTPPort == o.StatusPort || o.HTTPSPort == o.StatusPort {
		errs = append(errs, errors.New("options HTTPPort, HTTPSPort and StatusPort must differ"))
	}
	if o.User != "" {
		if err := validateLabel(o.User); err != nil {
			errs = append(errs, fmt.Errorf("option User: %w", err))
		}
	}
	for _, a := range o.ListenAddrs {
		if !a.IsValid() || a.Zone() != "" {
			errs = append(errs, fmt.Errorf("option ListenAddrs: %q is not an address without zone", a))
		}
	}
	if o.WorkerProcesses < 0 || o.WorkerConnections < 0 {
		errs = append(errs, errors.New("options WorkerProcesses and WorkerConnections must not be negative"))
	}
	return errors.Join(errs...)
}

// Config is one rendered configuration and what it needs on disk.
type Config struct {
	// Text is the nginx.conf. It holds no endpoint addresses: two snapshots that
	// differ only in endpoints render the same Text.
	Text []byte
	// Checksum identifies Text; the status port's /healthz answers with it, so a
	// client can tell which configuration the serving workers run.
	Checksum string
	// Endpoints is the endpoint table of every upstream Text uses (the contents
	// of Options.EndpointsFile), and EndpointsVersion its version, which the
	// control socket answers with once nginx uses it.
	Endpoints        []byte
	EndpointsVersion string
	// Certificates are the TLS files Text references, to be written with
	// WriteCertificates before nginx reads Text.
	Certificates []CertFile
	// Problems are the parts of the snapshot that were left out, and why.
	Problems []model.Problem

	refusedSeen []string      // refused certificate files the snapshot still references
	table       endpointTable // Endpoints, decoded
}

// CertFile is one certificate chain and its key, in one PEM file.
type CertFile struct {
	Name string // file name inside Options.CertDir
	PEM  []byte
}

// blamedCertificate returns the file of cfg.Certificates that an nginx error names
// ("cannot load certificate .../certs/<file>" and the like), or "".
func blamedCertificate(cfg *Config, nginxErr string) string {
	for _, c := range cfg.Certificates {
		if strings.Contains(nginxErr, "/"+c.Name+"\"") || strings.Contains(nginxErr, "\""+c.Name+"\"") {
			return c.Name
		}
	}
	return ""
}

// Template data: every string is already validated or built from validated parts.
type (
	tmplData struct {
		Opt            Options
		Listen         []string // HTTP listen addresses with port
		ListenTLS      []string
		StatusListen   string
		HashBucketSize int
		HashMaxSize    int
		Lua            string
		Servers        []tmplServer
		Default        tmplServer
		Checksum       string
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
		Locations []tmplLocation
		Close     bool // return 444 (the default server with no catch-all)
	}
	tmplLocation struct {
		Match    string // "= /p" or "/p/"
		Upstream string // "" answers 503
		Status   int    // non-zero: return this status instead of proxying
		Source   string // for a comment, validated
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
	r := renderer{opt: opt, upstreams: map[string]model.Upstream{}, certs: map[string]certResult{}, refused: refused, cache: cache}
	for _, u := range snap.Upstreams {
		r.upstreams[u.Name] = u
	}
	for _, c := range snap.Certificates {
		r.certsIn = append(r.certsIn, c)
	}
	d := tmplData{Opt: opt, Checksum: checksumPlaceholder, Lua: endpointsLua, WorkerConnections: opt.WorkerConnections}
	if d.WorkerConnections == 0 {
		d.WorkerConnections = 16384
	}
	d.RlimitNofile = 2*d.WorkerConnections + 1024
	d.Listen, d.ListenTLS = listenAddrs(opt)
	d.StatusListen = netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), opt.StatusPort).String()
	d.Default = tmplServer{Close: true}

	seen := map[string]bool{}
	longest := 0
	var catchAll *model.Server
	for i := range snap.Servers {
		s := &snap.Servers[i]
		if opt.Group != "" && s.Group != opt.Group {
			continue
		}
		obj := "Server " + s.Host
		if commentSafe(s.Host) != s.Host {
			obj = "Server " + strconv.Quote(s.Host)
		}
		if s.Host == "" {
			if catchAll != nil {
				r.problem(obj, "host", ReasonDuplicateHost, "more than one catch-all server; the first is used")
				continue
			}
			catchAll = s
			continue
		}
		if err := validateHost(s.Host); err != nil {
			r.problem(obj, "host", ReasonInvalidHost, err.Error())
			continue
		}
		if seen[s.Host] {
			r.problem(obj, "host", ReasonDuplicateHost, "host appears in more than one server; the first is used")
			continue
		}
		seen[s.Host] = true
		ts := r.server(s)
		ts.Names = []string{serverName(s.Host)}
		ts.Comment = s.Host
		if !strings.HasPrefix(s.Host, "*.") {
			longest = max(longest, len(s.Host))
		}
		d.Servers = append(d.Servers, ts)
	}
	if catchAll != nil {
		d.Default = r.server(catchAll)
	}

	table := endpointTable{}
	for n := range r.usedUpstreams {
		table[n] = r.upstreams[n].Endpoints
	}
	d.HashBucketSize, d.HashMaxSize = serverNamesHash(len(d.Servers), longest)

	var buf bytes.Buffer
	if err := confTemplate.Execute(&buf, d); err != nil {
		return nil, fmt.Errorf("render nginx config: %w", err)
	}
	sum := sha256.Sum256(bytes.TrimRight(buf.Bytes(), "\n"))
	cfg := &Config{Checksum: hex.EncodeToString(sum[:]), table: table}
	cfg.Endpoints, cfg.EndpointsVersion = table.encode()
	text := append(bytes.TrimRight(buf.Bytes(), "\n"), '\n')
	cfg.Text = bytes.ReplaceAll(text, []byte(checksumPlaceholder), []byte(cfg.Checksum))
	for _, c := range r.certsIn {
		if res, ok := r.certs[c.Name]; ok && res.err == nil {
			cfg.Certificates = append(cfg.Certificates, res.file)
		}
	}
	slices.SortFunc(cfg.Certificates, func(a, b CertFile) int { return strings.Compare(a.Name, b.Name) })
	cfg.Problems = r.problems
	cfg.refusedSeen = r.refusedSeen
	cache.keep(r.certs)
	return cfg, nil
}

// certCache keeps the checks of the certificates the last render used (parsing a
// certificate and its key is most of the cost of rendering many TLS hosts, and
// endpoint-only changes render too). An entry is reused only when the Secret's
// certificate and key are byte for byte the ones it was made from. Not safe for
// concurrent renders.
type certCache struct {
	entries map[string]certEntry // by Secret name
}

type certEntry struct {
	cert, key []byte // copies of model.Certificate's CertPEM and KeyPEM
	res       certResult
}

// check returns checkCertificate(c), from the cache when c is unchanged.
func (cc *certCache) check(c model.Certificate) certResult {
	if cc == nil {
		return checkCertificate(c)
	}
	if e, ok := cc.entries[c.Name]; ok && bytes.Equal(e.cert, c.CertPEM) && bytes.Equal(e.key, c.KeyPEM) {
		return e.res
	}
	res := checkCertificate(c)
	if cc.entries == nil {
		cc.entries = map[string]certEntry{}
	}
	cc.entries[c.Name] = certEntry{cert: bytes.Clone(c.CertPEM), key: bytes.Clone(c.KeyPEM), res: res}
	return res
}

// keep drops the entries of certificates a render did not use (used: the names it
// checked), so the cache holds no more than the current configuration needs.
func (cc *certCache) keep(used map[string]certResult) {
	if cc == nil {
		return
	}
	for name := range cc.entries {
		if _, ok := used[name]; !ok {
			delete(cc.entries, name)
		}
	}
}

type certResult struct {
	file CertFile
	leaf *x509.Certificate
	err  error
}

type renderer struct {
	opt           Options
	upstreams     map[string]model.Upstream
	usedUpstreams map[string]bool // validated upstreams a location uses
	certsIn       []model.Certificate
	certs         map[string]certResult // checked certificates by name
	cache         *certCache            // checks of earlier renders, or nil
	refused       map[string]string     // certificate files nginx refused, and why
	refusedSeen   []string
	problems      []model.Problem
}

func (r *renderer) problem(obj, field, reason, detail string) {
	p := model.Problem{Object: obj, Field: field, Reason: reason, Detail: detail}
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
			ts.TLSCert = path.Join(r.opt.CertDir, file)
		}
	}
	if s.SSLRedirect && s.TLSCertificate == "" {
		// Nothing would answer on the HTTPS side: serve plain HTTP, and say so.
		r.problem("Server "+hostOrDefault(s.Host), "sslRedirect", ReasonRedirectWithoutTLS,
			"HTTPS redirect asked for a host without TLS; serving plain HTTP")
	} else if s.SSLRedirect {
		// The redirect stays even when the TLS server had to be skipped: the Ingress
		// asked for its traffic never to be served in clear text.
		ts.Redirect = "https://$host"
		if r.opt.HTTPSPort != 443 {
			ts.Redirect += ":" + strconv.Itoa(int(r.opt.HTTPSPort))
		}
	}
	ts.Locations = r.locations(s)
	return ts
}

// cert checks the certificate a server references and returns its file name.
func (r *renderer) cert(s *model.Server) (string, bool) {
	obj := "Secret " + s.TLSCertificate
	res, ok := r.certs[s.TLSCertificate]
	if !ok {
		idx := slices.IndexFunc(r.certsIn, func(c model.Certificate) bool { return c.Name == s.TLSCertificate })
		if idx < 0 {
			r.problem(obj, "", ReasonCertificateNotFound, fmt.Sprintf("host %s: TLS server skipped: no such certificate", hostOrDefault(s.Host)))
			return "", false
		}
		res = r.cache.check(r.certsIn[idx])
		r.certs[s.TLSCertificate] = res
	}
	if res.err != nil {
		r.problem(obj, "", ReasonInvalidCertificate, fmt.Sprintf("host %s: TLS server skipped: %v", hostOrDefault(s.Host), res.err))
		return "", false
	}
	if why, ok := r.refused[res.file.Name]; ok {
		if !slices.Contains(r.refusedSeen, res.file.Name) {
			r.refusedSeen = append(r.refusedSeen, res.file.Name)
		}
		r.problem(obj, "", ReasonInvalidCertificate, fmt.Sprintf("host %s: TLS server skipped: nginx refused the certificate: %s", hostOrDefault(s.Host), why))
		return "", false
	}
	if s.Host != "" {
		probe := s.Host
		if strings.HasPrefix(probe, "*.") {
			probe = "wildcard-probe" + probe[1:]
		}
		if err := res.leaf.VerifyHostname(probe); err != nil {
			// Served anyway: clients decide, and a mismatch is often a deliberate
			// catch-all certificate.
			r.problem(obj, "", ReasonCertificateHost, fmt.Sprintf("host %s: served with a certificate that does not cover it: %v", s.Host, err))
		}
	}
	return res.file.Name, true
}

func hostOrDefault(h string) string {
	if h == "" {
		return "(default)"
	}
	return h
}

// x509KeyPair is tls.X509KeyPair; tests count its calls.
var x509KeyPair = tls.X509KeyPair

// checkCertificate parses a certificate and key pair and names its file after the
// Secret and a digest of the content, so a changed certificate changes the
// configuration text and forces a reload.
func checkCertificate(c model.Certificate) certResult {
	ns, name, ok := strings.Cut(c.Name, "/")
	if !ok || validateLabel(ns) != nil || validateHost(name) != nil {
		return certResult{err: fmt.Errorf("certificate name %q is not namespace/name", c.Name)}
	}
	pair, err := x509KeyPair(c.CertPEM, c.KeyPEM)
	if err != nil {
		return certResult{err: fmt.Errorf("parse certificate and key: %w", err)}
	}
	leaf := pair.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return certResult{err: fmt.Errorf("parse leaf certificate: %w", err)}
		}
	}
	var pem bytes.Buffer
	pem.Write(bytes.TrimSpace(c.CertPEM))
	pem.WriteString("\n")
	pem.Write(bytes.TrimSpace(c.KeyPEM))
	pem.WriteString("\n")
	sum := sha256.Sum256(pem.Bytes())
	file := fmt.Sprintf("%s_%s-%s.pem", ns, name, hex.EncodeToString(sum[:8]))
	return certResult{file: CertFile{Name: file, PEM: pem.Bytes()}, leaf: leaf}
}

// pathRank orders path types for the same rendered location: Exact owns it over
// Prefix, and Prefix over ImplementationSpecific.
func pathRank(t model.PathType) int {
	switch t {
	case model.PathExact:
		return 0
	case model.PathPrefix:
		return 1
	default:
		return 2
	}
}

// locations renders a server's paths. Each Ingress path becomes one or two nginx
// locations; when two paths want the same location, the stronger type wins (Exact,
// Prefix, ImplementationSpecific), then the first in model order.
func (r *renderer) locations(s *model.Server) []tmplLocation {
	type cand struct {
		loc  tmplLocation
		rank int
		src  string
	}
	byMatch := map[string]cand{}
	var order []string
	add := func(match string, rank int, l model.Location, obj string) {
		tl := tmplLocation{Match: match, Source: commentSafe(l.Source)}
		tl.Upstream, tl.Status = r.upstream(l.Upstream, obj)
		c, ok := byMatch[match]
		if ok {
			// Exact over Prefix is the Ingress rule, not a conflict; two paths of the
			// same kind (or Prefix against ImplementationSpecific) are.
			conflict := c.rank == rank || (c.rank != 0 && rank != 0)
			winner, loser := c.src, obj
			if rank < c.rank {
				winner, loser = obj, c.src
			}
			if conflict {
				r.problem(loser, "path", ReasonPathConflict, fmt.Sprintf("location %q of host %s is taken by %s", match, hostOrDefault(s.Host), winner))
			}
			if rank >= c.rank {
				return
			}
		} else {
			order = append(order, match)
		}
		byMatch[match] = cand{loc: tl, rank: rank, src: obj}
	}
	for _, l := range s.Locations {
		obj := l.Source
		if obj == "" {
			obj = "Server " + hostOrDefault(s.Host)
		}
		if err := validatePath(l.Path); err != nil {
			r.problem(obj, "path", ReasonInvalidPath, fmt.Sprintf("host %s path %q: %v", hostOrDefault(s.Host), l.Path, err))
			continue
		}
		rank := pathRank(l.Type)
		switch l.Type {
		case model.PathExact:
			add("= "+l.Path, rank, l, obj)
		case model.PathPrefix, model.PathImplementationSpecific:
			p := strings.TrimRight(l.Path, "/")
			if p == "" {
				add("/", rank, l, obj)
				continue
			}
			add("= "+p, rank, l, obj)
			add(p+"/", rank, l, obj)
		default:
			r.problem(obj, "pathType", ReasonInvalidPathType, fmt.Sprintf("host %s path %q: unknown path type %q", hostOrDefault(s.Host), l.Path, l.Type))
		}
	}
	if _, ok := byMatch["/"]; !ok {
		// Paths no rule matches go to the default backend, or get a 404 (never to
		// nginx's own document root).
		tl := tmplLocation{Match: "/", Status: 404}
		if s.DefaultUpstream != "" {
			tl.Upstream, tl.Status = r.upstream(s.DefaultUpstream, "Server "+hostOrDefault(s.Host))
		}
		byMatch["/"] = cand{loc: tl}
		order = append(order, "/")
	}
	// Sorted by the path, then exact before prefix, for a stable and readable file.
	slices.SortFunc(order, func(a, b string) int {
		pa, pb := strings.TrimPrefix(a, "= "), strings.TrimPrefix(b, "= ")
		if c := strings.Compare(pa, pb); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	out := make([]tmplLocation, 0, len(order))
	for _, m := range order {
		out = append(out, byMatch[m].loc)
	}
	return out
}

// upstream resolves an upstream reference: its name, or a status to return instead
// (503 when it does not exist or has an invalid name). An upstream without usable
// endpoints is proxied to all the same: nginx answers 503 until the endpoint table
// gives it some, which needs no reload.
func (r *renderer) upstream(name, obj string) (string, int) {
	u, ok := r.upstreams[name]
	if !ok {
		r.problem(obj, "backend", ReasonUpstreamNotFound, fmt.Sprintf("upstream %q does not exist; answering 503", name))
		return "", 503
	}
	if err := validateUpstreamName(name); err != nil {
		r.problem("Upstream "+strconv.Quote(name), "name", ReasonInvalidUpstream, err.Error()+"; answering 503")
		return "", 503
	}
	if r.usedUpstreams == nil {
		r.usedUpstreams = map[string]bool{}
	}
	if !r.usedUpstreams[name] {
		valid := validEndpoints(u.Endpoints, func(err error) {
			r.problem("Upstream "+name, "endpoints", ReasonInvalidEndpoint, err.Error())
		})
		r.upstreams[name] = model.Upstream{Name: name, Endpoints: valid}
		r.usedUpstreams[name] = true
	}
	return name, 0
}

// validEndpoints returns the endpoints that pass validateEndpoint, and reports each
// other one to bad (unless nil).
func validEndpoints(eps []netip.AddrPort, bad func(error)) []netip.AddrPort {
	var valid []netip.AddrPort
	for _, ep := range eps {
		if err := validateEndpoint(ep); err != nil {
			if bad != nil {
				bad(err)
			}
			continue
		}
		valid = append(valid, ep)
	}
	return valid
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

// serverName renders a host as an nginx server_name. An Ingress wildcard matches one
// label exactly, so "*.example.com" becomes a regular expression; nginx's own
// "*.example.com" would also match "a.b.example.com".
func serverName(host string) string {
	if suffix, ok := strings.CutPrefix(host, "*."); ok {
		return `"~^[^.]+\.` + strings.ReplaceAll(suffix, ".", `\.`) + `$"`
	}
	return host
}

// serverNamesHash sizes nginx's server-name hash for n exact names of at most
// longest bytes, so that large configurations build it on the first tries and
// without warnings.
func serverNamesHash(n, longest int) (bucket, maxSize int) {
	// An entry takes a pointer plus the name and two bytes, aligned to 8; a bucket
	// ends with a pointer. Room for a few entries keeps collisions cheap.
	need := 8 + (longest+2+7)&^7 + 8
	bucket = 128
	for bucket < need {
		bucket *= 2
	}
	maxSize = 1024
	for maxSize < 4*n {
		maxSize *= 2
	}
	return bucket, maxSize
}

func listenAddrs(o Options) (plain, secure []string) {
	addrs := func(port uint16) []string {
		if len(o.ListenAddrs) == 0 {
			l := []string{strconv.Itoa(int(port))}
			if o.ListenIPv6 {
				l = append(l, "[::]:"+strconv.Itoa(int(port)))
			}
			return l
		}
		var l []string
		for _, a := range o.ListenAddrs {
			l = append(l, netip.AddrPortFrom(a, port).String())
		}
		return l
	}
	return addrs(o.HTTPPort), addrs(o.HTTPSPort)
}

// ipv6Available reports whether the node has IPv6 (an interface address in
// /proc/net/if_inet6, which is empty or missing when IPv6 is off).
func ipv6Available() bool {
	b, err := os.ReadFile("/proc/net/if_inet6")
	return err == nil && len(bytes.TrimSpace(b)) > 0
}
