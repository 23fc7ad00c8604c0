package nginx

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// maxHostLen is the longest DNS name (RFC 1123).
const maxHostLen = 253

// maxPathLen bounds an Ingress path; longer ones are rejected rather than rendered.
const maxPathLen = 1024

// validateHost checks a lower-case RFC 1123 DNS name, or "*." or "**." (a wildcard
// of any number of labels, model.Server) followed by one.
func validateHost(h string) error {
	name := strings.TrimPrefix(h, "*.")
	if n, ok := strings.CutPrefix(h, "**."); ok {
		name = n
	}
	if name == "" {
		return errors.New("empty host")
	}
	if len(h) > maxHostLen {
		return fmt.Errorf("host is %d characters, longer than %d", len(h), maxHostLen)
	}
	for label := range strings.SplitSeq(name, ".") {
		if err := validateLabel(label); err != nil {
			return err
		}
	}
	return nil
}

// validateLabel checks one DNS label: 1 to 63 characters of [a-z0-9-], not starting or
// ending with '-'.
func validateLabel(l string) error {
	if l == "" {
		return errors.New("empty label")
	}
	if len(l) > 63 {
		return fmt.Errorf("label %.20q... is longer than 63 characters", l)
	}
	if l[0] == '-' || l[len(l)-1] == '-' {
		return fmt.Errorf("label %q starts or ends with '-'", l)
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("label %q has character %q outside [a-z0-9-]", l, c)
		}
	}
	return nil
}

// pathChar reports whether c may appear in a rendered path. The set is the RFC 3986
// path characters without those nginx's parser or URI normalisation treat specially:
// no spaces, quotes, braces, semicolons, '#', '$', '\', '%' (nginx matches decoded
// URIs) or '?' (never part of a path).
func pathChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("-._~/!&*+,=:@", c) >= 0
}

// validatePath checks an Ingress path: absolute, within the strict character set, and
// already in the form nginx matches against (no empty, "." or ".." segments, which
// nginx's URI normalisation would never let a request reach).
func validatePath(p string) error {
	if p == "" || p[0] != '/' {
		return errors.New("path must start with '/'")
	}
	if len(p) > maxPathLen {
		return fmt.Errorf("path is %d characters, longer than %d", len(p), maxPathLen)
	}
	for i := 0; i < len(p); i++ {
		if !pathChar(p[i]) {
			return fmt.Errorf("path has character %q outside [A-Za-z0-9-._~/!&*+,=:@]", p[i])
		}
	}
	segs := strings.Split(p[1:], "/")
	for i, s := range segs {
		last := i == len(segs)-1
		switch {
		case s == "" && !last:
			return errors.New("path has an empty segment (\"//\")")
		case s == "." || s == "..":
			return fmt.Errorf("path has a %q segment", s)
		}
	}
	return nil
}

// validateUpstreamName checks the name of a model.Upstream, which becomes an nginx
// upstream name: [a-z0-9.-], 1 to 200 characters, starting with a letter or digit.
func validateUpstreamName(n string) error {
	if n == "" || len(n) > 200 {
		return fmt.Errorf("upstream name must be 1 to 200 characters, is %d", len(n))
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || (i > 0 && (c == '-' || c == '.'))) {
			return fmt.Errorf("upstream name %q has character %q outside [a-z0-9.-]", n, c)
		}
	}
	return nil
}

// validateEndpoint checks a backend address: a unicast IP without zone and a non-zero
// port.
func validateEndpoint(ap netip.AddrPort) error {
	a := ap.Addr()
	switch {
	case !a.IsValid():
		return errors.New("invalid address")
	case a.Zone() != "":
		return fmt.Errorf("address %s has a zone", a)
	case a.IsUnspecified() || a.IsMulticast():
		return fmt.Errorf("address %s is not unicast", a)
	case ap.Port() == 0:
		return fmt.Errorf("endpoint %s has port 0", ap)
	}
	return nil
}
