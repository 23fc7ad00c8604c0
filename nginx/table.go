package nginx

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// table is everything a configuration change touches, by key, as the Lua side
// keeps it (lua/portico.lua): "h:<host>" a host's routes, "u:<name>" an upstream's
// endpoints, "c:<id>" a certificate and its key. Keys and values are built from
// validated parts only.
type table map[string]string

// deltaHeader starts every delta and every table file; the base digest, the new
// one and the stamp follow it. The stamp is when the agent made the delta, in
// microseconds: nginx keeps its table when someone else reloads it with an older
// file.
const deltaHeader = "# portico delta "

// entryHash is one entry's share of a table's digest.
func entryHash(k, v string) uint64 {
	h := sha256.New()
	h.Write([]byte(k))
	h.Write([]byte{0})
	h.Write([]byte(v))
	var sum [sha256.Size]byte
	return binary.BigEndian.Uint64(h.Sum(sum[:0]))
}

// digest identifies the table: the XOR of its entries' hashes, so that a delta
// changes it by the entries it touches alone.
func (t table) digest() string {
	var d uint64
	for k, v := range t {
		d ^= entryHash(k, v)
	}
	return digestString(d)
}

// digestCached is digest, hashing only the entries whose value is not the one
// cc hashed last time (nil cc: every entry), and keeping t's hashes in cc.
func (t table) digestCached(cc *certCache) string {
	if cc == nil {
		return t.digest()
	}
	if cc.hashes == nil {
		cc.hashes = make(map[string]hashedEntry, len(t))
	}
	var d uint64
	for k, v := range t {
		e, ok := cc.hashes[k]
		if !ok || e.v != v {
			e = hashedEntry{v: v, h: entryHash(k, v)}
			cc.hashes[k] = e
		}
		d ^= e.h
	}
	if len(cc.hashes) > len(t) {
		for k := range cc.hashes {
			if _, ok := t[k]; !ok {
				delete(cc.hashes, k)
			}
		}
	}
	return digestString(d)
}

func digestString(d uint64) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], d)
	return hex.EncodeToString(b[:])
}

// sortedKeys returns t's keys in order, for files that read the same every time.
func (t table) sortedKeys() []string {
	keys := make([]string, 0, len(t))
	for k := range t {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// encode is the whole table as a delta from nothing: the file nginx loads at every
// start and reload.
func (t table) encode(digest string, stamp int64) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s %d\n", deltaHeader, digest, stamp)
	for _, k := range t.sortedKeys() {
		writeSet(&b, k, t[k])
	}
	return b.Bytes()
}

func writeSet(b *bytes.Buffer, k, v string) {
	b.WriteString("set ")
	b.WriteString(k)
	if v != "" {
		b.WriteByte(' ')
		b.WriteString(v)
	}
	b.WriteByte('\n')
}

// delta is the change from old (whose digest is base) to t: the keys whose value
// changed and those t no longer has, sorted; n counts them.
func (t table) delta(old table, base, digest string, stamp int64) (text []byte, n int) {
	var set, del []string
	for k, v := range t {
		if o, ok := old[k]; !ok || o != v {
			set = append(set, k)
		}
	}
	for k := range old {
		if _, ok := t[k]; !ok {
			del = append(del, k)
		}
	}
	slices.Sort(set)
	slices.Sort(del)
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s%s %s %d\n", deltaHeader, base, digest, stamp)
	for _, k := range set {
		writeSet(&b, k, t[k])
	}
	for _, k := range del {
		b.WriteString("del " + k + "\n")
	}
	return b.Bytes(), len(set) + len(del)
}

// decodeTable reads a table file (encode's output) back, with its digest; nil
// when it is not one.
func decodeTable(b []byte) (table, string) {
	head, body, ok := strings.Cut(string(b), "\n")
	f := strings.Fields(strings.TrimPrefix(head, deltaHeader))
	if !ok || !strings.HasPrefix(head, deltaHeader+" ") || len(f) != 2 {
		return nil, ""
	}
	t := table{}
	for line := range strings.SplitSeq(body, "\n") {
		if line == "" {
			continue
		}
		rest, ok := strings.CutPrefix(line, "set ")
		if !ok {
			return nil, ""
		}
		k, v, _ := strings.Cut(rest, " ")
		t[k] = v
	}
	if t.digest() != f[0] {
		return nil, ""
	}
	return t, f[0]
}

// upstreamValue is an upstream's endpoints as the table keeps them.
func upstreamValue(eps []netip.AddrPort) string {
	var b strings.Builder
	for i, ep := range eps {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(ep.String())
	}
	return b.String()
}

// hostValue is a host's routes as the table keeps them (see lua/portico.lua):
// its certificate's id (and "~" and its Gateway listener's name, in a view),
// the HTTPS port plain HTTP redirects to, the status that
// answers every request, each "-" for none, then its locations' matches and
// targets (a match given again is the next candidate of its chain), each target
// followed by its options (rules.go) and by "#" and the object that asked for it.
func hostValue(s tmplServer, redirectPort uint16) string {
	var b strings.Builder
	b.WriteString(cmpDash(s.CertID))
	if s.Listener != "" {
		b.WriteString("~" + s.Listener)
	}
	b.WriteByte(' ')
	if s.Redirect != "" {
		b.WriteString(strconv.Itoa(int(redirectPort)))
	} else {
		b.WriteByte('-')
	}
	b.WriteByte(' ')
	if s.Return != 0 {
		b.WriteString(strconv.Itoa(s.Return))
		return b.String()
	}
	b.WriteByte('-')
	for _, l := range s.Locations {
		b.WriteByte(' ')
		b.WriteString(strings.Replace(l.Match, "= ", "=", 1))
		b.WriteByte(' ')
		switch {
		case l.Backends != "":
			b.WriteString(l.Backends)
		case l.Upstream == "":
			b.WriteString("@" + strconv.Itoa(l.Status))
		case l.Affinity != "":
			b.WriteString(l.Upstream + "|" + l.Affinity + "|" + l.AffinityPath + "|" + l.AffinityMaxAge)
		default:
			b.WriteString(l.Upstream)
		}
		b.WriteString(l.Options)
		if tableSource(l.Source) {
			b.WriteByte('#')
			b.WriteString(l.Source)
		}
	}
	return b.String()
}

// depthsValue is "w:" as the table keeps it: the label counts, most first.
func depthsValue(depths map[int]bool) string {
	ds := slices.Sorted(maps.Keys(depths))
	slices.Reverse(ds)
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = strconv.Itoa(d)
	}
	return strings.Join(parts, " ")
}

// tableSource reports whether a location's source can name it in the table
// (and in the telemetry's ingress label): "namespace/name", each of
// [a-z0-9][a-z0-9.-]*, which is every Ingress's.
func tableSource(s string) bool {
	ns, name, ok := strings.Cut(s, "/")
	return ok && tableName(ns) && tableName(name)
}

func tableName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || i > 0 && (c == '-' || c == '.')) {
			return false
		}
	}
	return true
}

func cmpDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// certValue is a certificate file's PEM as the table keeps it: one line, "!" for
// each newline (PEM has no "!").
func certValue(pem []byte) string {
	return strings.ReplaceAll(strings.TrimRight(strings.ReplaceAll(string(pem), "\r", ""), "\n"), "\n", "!")
}

// controlClient talks HTTP to nginx's control socket.
func controlClient(socket string) *http.Client {
	return &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unix", socket)
			},
		},
	}
}

// tableURL is the table's location on the control socket (the host is ignored by
// the unix dialer).
const tableURL = "http://portico-control/table"

// errStaleBase: nginx's table is not the one a delta was made from.
var errStaleBase = errors.New("nginx's table is not the delta's base")

// pushDelta sends a delta to nginx's control socket. Once it returns, every worker
// uses the new table for its next request (or handshake).
func pushDelta(ctx context.Context, c *http.Client, text []byte, digest string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, tableURL, bytes.NewReader(text))
	if err != nil {
		return fmt.Errorf("push table: %w", err)
	}
	req.ContentLength = int64(len(text))
	got, err := controlDo(c, req)
	if errors.Is(err, errConflict) {
		return fmt.Errorf("push table: %w", errStaleBase)
	}
	if err != nil {
		return fmt.Errorf("push table: %w", err)
	}
	if got != digest {
		return fmt.Errorf("push table: nginx has table %q, want %q", got, digest)
	}
	return nil
}

// tableDigest asks nginx for the digest of the table its workers use.
func tableDigest(ctx context.Context, c *http.Client) (string, error) {
	d, _, err := tableState(ctx, c)
	return d, err
}

// tableState asks nginx for the digest of the table its workers use and its
// stamp (when the agent made it).
func tableState(ctx context.Context, c *http.Client) (digest string, stamp int64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, tableURL, nil)
	if err != nil {
		return "", 0, err
	}
	s, err := controlDo(c, req)
	if err != nil {
		return "", 0, err
	}
	digest, st, _ := strings.Cut(s, " ")
	stamp, _ = strconv.ParseInt(st, 10, 64)
	return digest, stamp, nil
}

var errConflict = errors.New("status 409")

func controlDo(c *http.Client, req *http.Request) (string, error) {
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if err != nil {
		return "", fmt.Errorf("read answer: %w", err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return strings.TrimSpace(string(body)), nil
	case http.StatusConflict:
		return "", fmt.Errorf("%w: %s", errConflict, strings.TrimSpace(string(body)))
	}
	return "", fmt.Errorf("status %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
}

// verdictsURL is where the control socket takes the liveness verdicts.
const verdictsURL = "http://portico-control/verdicts"

// PushVerdicts tells nginx which replicas this node's agent calls down; its
// liveness server answers them to every director's probe (package liveness:
// a replica the others call down learns it from their answers).
func (r *Reloader) PushVerdicts(ctx context.Context, down []netip.Addr) error {
	var b bytes.Buffer
	for _, a := range down {
		fmt.Fprintf(&b, "down %s\n", a.Unmap())
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, verdictsURL, bytes.NewReader(b.Bytes()))
	if err != nil {
		return fmt.Errorf("push liveness verdicts: %w", err)
	}
	req.ContentLength = int64(b.Len())
	if _, err := controlDo(r.ctl, req); err != nil {
		return fmt.Errorf("push liveness verdicts: %w", err)
	}
	return nil
}
