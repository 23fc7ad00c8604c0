package nginx

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/portico-edge/portico/controlplane/model"
)

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

// certCache keeps the checks of the certificates the last render used (parsing a
// certificate and its key is most of the cost of rendering many TLS hosts, and
// endpoint-only changes render too), and its hosts' locations. An entry is reused only when the Secret's
// certificate and key are byte for byte the ones it was made from. Not safe for
// concurrent renders.
type certCache struct {
	entries map[string]certEntry // by Secret name
	// locations are the hosts' locations (cachedLocations), by group and host,
	// of the last render; next those of the render under way.
	locations, next map[string]*locationsEntry
	// hashes are the table's entries' shares of its digest (entryHash), by
	// key, with the value each was computed from: a render hashes only the
	// entries that changed (table.digestCached).
	hashes map[string]hashedEntry
}

type hashedEntry struct {
	v string
	h uint64
}

// keepLocations records a host's locations for the next render.
func (cc *certCache) keepLocations(k string, e *locationsEntry) {
	if cc.next == nil {
		cc.next = map[string]*locationsEntry{}
	}
	cc.next[k] = e
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
	cc.locations, cc.next = cc.next, nil
	for name := range cc.entries {
		if _, ok := used[name]; !ok {
			delete(cc.entries, name)
		}
	}
}

// observeCertificates sets portico_tls_certificate_expiry_timestamp_seconds for
// the Secrets the last render serves (those its hosts use, parsed and accepted
// by OpenSSL), and drops the series of the others. r.applyMu is held.
func (r *Reloader) observeCertificates() {
	served := map[[2]string]bool{}
	for name, e := range r.certCache.entries {
		if e.res.err != nil || e.res.leaf == nil || r.refused[e.res.file.Name] != "" {
			continue
		}
		ns, secret, _ := strings.Cut(name, "/")
		k := [2]string{ns, secret}
		served[k] = true
		r.m.certExpiry.WithLabelValues(ns, secret).Set(float64(e.res.leaf.NotAfter.Unix()))
	}
	for k := range r.certSeries {
		if !served[k] {
			r.m.certExpiry.DeleteLabelValues(k[0], k[1])
		}
	}
	r.certSeries = served
}

type certResult struct {
	file CertFile
	leaf *x509.Certificate
	err  error
}

// cert checks the certificate a server references and returns its file name.
func (r *renderer) cert(s *model.Server) (string, bool) {
	obj := "Secret " + s.TLSCertificate
	res, ok := r.certs[s.TLSCertificate]
	if !ok {
		idx := slices.IndexFunc(r.certsIn, func(c model.Certificate) bool { return c.Name == s.TLSCertificate })
		if idx < 0 {
			r.problem(obj, "", model.ReasonCertificateNotFound, fmt.Sprintf("host %s: TLS server skipped: no such certificate", hostOrDefault(s.Host)))
			return "", false
		}
		res = r.cache.check(r.certsIn[idx])
		r.certs[s.TLSCertificate] = res
	}
	if res.err != nil {
		r.problem(obj, "", model.ReasonInvalidCertificate, fmt.Sprintf("host %s: TLS server skipped: %v", hostOrDefault(s.Host), res.err))
		return "", false
	}
	if why, ok := r.refused[res.file.Name]; ok {
		if !slices.Contains(r.refusedSeen, res.file.Name) {
			r.refusedSeen = append(r.refusedSeen, res.file.Name)
		}
		r.problem(obj, "", model.ReasonInvalidCertificate, fmt.Sprintf("host %s: TLS server skipped: nginx refused the certificate: %s", hostOrDefault(s.Host), why))
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
			r.problem(obj, "", model.ReasonCertificateHostMismatch, fmt.Sprintf("host %s: served with a certificate that does not cover it: %v", s.Host, err))
		}
	}
	return res.file.Name, true
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
	// Only the blocks, encoded anew: text around them (openssl's "subject=" and
	// "Bag Attributes" lines, in any encoding) and block headers never reach
	// nginx, and the table's value is plain base64 (certValue).
	out := pemBlocks(c.CertPEM, func(t string) bool { return t == "CERTIFICATE" }, -1)
	out = append(out, pemBlocks(c.KeyPEM, func(t string) bool { return strings.HasSuffix(t, "PRIVATE KEY") }, 1)...)
	sum := sha256.Sum256(out)
	// Bounded, whatever the Secret's name: the file name is the table's key.
	file := fmt.Sprintf("%s_%.100s-%s.pem", ns, name, hex.EncodeToString(sum[:8]))
	return certResult{file: CertFile{Name: file, PEM: out}, leaf: leaf}
}

// pemBlocks returns the PEM blocks of data whose type keep accepts, at most n
// of them (n < 0: all), encoded without headers.
func pemBlocks(data []byte, keep func(string) bool, n int) []byte {
	var out []byte
	for rest := data; n != 0; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if keep(b.Type) {
			out = append(out, pem.EncodeToMemory(&pem.Block{Type: b.Type, Bytes: b.Bytes})...)
			n--
		}
	}
	return out
}

// checkWithNginx has OpenSSL, through nginx -t on a configuration that loads
// them, check the certificates it has not checked yet. One OpenSSL refuses is
// recorded in r.refused (with nginx's reason) and the return is true: the caller
// renders again without it. Certificates go to nginx through the table, which
// nginx -t never sees, so this is where OpenSSL's rules (a key too small for its
// security level, say) meet them before a handshake would.
func (r *Reloader) checkWithNginx(ctx context.Context, certs []CertFile) (refused bool, err error) {
	var todo []CertFile
	for _, c := range certs {
		if !r.checked[c.Name] {
			todo = append(todo, c)
		}
	}
	if len(todo) > 0 {
		dir := filepath.Join(r.cfg.Dir, "certcheck")
		if err := os.RemoveAll(dir); err != nil {
			return false, fmt.Errorf("check certificates: %w", err)
		}
		defer os.RemoveAll(dir)
		if err := addCertificates(dir, todo); err != nil {
			return false, fmt.Errorf("check certificates: %w", err)
		}
		var conf bytes.Buffer
		fmt.Fprintf(&conf, "pid %s;\nerror_log stderr;\nevents {}\nhttp {\n", filepath.Join(dir, "nginx.pid"))
		for i, c := range todo {
			f := filepath.Join(dir, c.Name)
			fmt.Fprintf(&conf, "    server {\n        listen unix:%s ssl;\n        server_name c%d;\n        ssl_certificate %s;\n        ssl_certificate_key %s;\n    }\n",
				filepath.Join(dir, "check.sock"), i, f, f)
		}
		conf.WriteString("}\n")
		file := filepath.Join(dir, "nginx.conf")
		if err := os.WriteFile(file, conf.Bytes(), 0o600); err != nil {
			return false, fmt.Errorf("check certificates: %w", err)
		}
		if err := r.runner.Test(ctx, r.cfg.Dir, file); err != nil {
			bad := blamedCertificate(&Config{Certificates: todo}, err.Error())
			if bad == "" || r.refused[bad] != "" {
				return false, fmt.Errorf("check certificates: %w", err)
			}
			if r.refused == nil {
				r.refused = map[string]string{}
			}
			r.refused[bad] = nginxReason(err.Error())
			return true, nil
		}
	}
	checked := make(map[string]bool, len(certs))
	for _, c := range certs {
		checked[c.Name] = true
	}
	r.checked = checked
	return false, nil
}
