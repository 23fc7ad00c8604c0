package nginx

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/portico-edge/portico/controlplane/model"
)

// endpointTable is the endpoints of every upstream a configuration uses, by upstream
// name. Names and endpoints are validated by the renderer.
type endpointTable map[string][]netip.AddrPort

// endpointsHeader starts every encoded table; the version follows it.
const endpointsHeader = "# portico endpoints "

// encode renders the table as the Lua side reads it: the header with the version (a
// digest of the rest), then one line per upstream, sorted by name: the name and its
// endpoints, separated by spaces. An upstream without endpoints is a line with only
// its name.
func (t endpointTable) encode() (text []byte, version string) {
	names := make([]string, 0, len(t))
	for n := range t {
		names = append(names, n)
	}
	slices.Sort(names)
	var body bytes.Buffer
	for _, n := range names {
		body.WriteString(n)
		for _, ep := range t[n] {
			body.WriteByte(' ')
			body.WriteString(ep.String())
		}
		body.WriteByte('\n')
	}
	sum := sha256.Sum256(body.Bytes())
	version = hex.EncodeToString(sum[:8])
	text = make([]byte, 0, len(endpointsHeader)+len(version)+1+body.Len())
	text = append(text, endpointsHeader...)
	text = append(text, version...)
	text = append(text, '\n')
	return append(text, body.Bytes()...), version
}

// with returns t plus the upstreams of old that t does not have. A reload loads the
// table into the dictionary that the old workers share with the new ones, and old
// workers accept requests for a moment after the reload: an upstream only the old
// configuration uses must keep its endpoints until they stop.
func (t endpointTable) with(old endpointTable) endpointTable {
	out := make(endpointTable, len(t)+len(old))
	for n, eps := range old {
		out[n] = eps
	}
	for n, eps := range t {
		out[n] = eps
	}
	return out
}

// refresh returns t's upstreams with the endpoints s gives them now (the valid ones;
// none for an upstream s no longer has): the table of a configuration that keeps
// running while nginx -t refuses the one s renders.
func (t endpointTable) refresh(s model.Snapshot) endpointTable {
	out := make(endpointTable, len(t))
	for n := range t {
		out[n] = nil
	}
	for _, u := range s.Upstreams { // the last of a name wins, as in render
		if _, ok := out[u.Name]; ok {
			out[u.Name] = validEndpoints(u.Endpoints, nil)
		}
	}
	return out
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

// controlURL is the endpoint table's location on the control socket (the host is
// ignored by the unix dialer).
const controlURL = "http://portico-control/endpoints"

// pushEndpoints sends a table to nginx's control socket. Once it returns, every
// worker uses the table for its next request.
func pushEndpoints(ctx context.Context, c *http.Client, text []byte, version string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, controlURL, bytes.NewReader(text))
	if err != nil {
		return fmt.Errorf("push endpoint table: %w", err)
	}
	req.ContentLength = int64(len(text))
	got, err := controlDo(c, req)
	if err != nil {
		return fmt.Errorf("push endpoint table: %w", err)
	}
	if got != version {
		return fmt.Errorf("push endpoint table: nginx took version %q, want %q", got, version)
	}
	return nil
}

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
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("status %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return strings.TrimSpace(string(body)), nil
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
