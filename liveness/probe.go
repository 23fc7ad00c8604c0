package liveness

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"syscall"
	"time"
)

// Result is what one probe found, a closed list (it is a metric label).
type Result string

const (
	OK          Result = "ok"          // nginx answered 200
	Timeout     Result = "timeout"     // no answer in time: link cut, host down, nginx stopped or wedged
	Refused     Result = "refused"     // nothing listens: nginx is not running
	Reset       Result = "reset"       // the connection broke before an answer
	Unreachable Result = "unreachable" // no route or no neighbour for the replica
	BadAnswer   Result = "bad_answer"  // an answer that is not nginx's 200
	Fault       Result = "fault"       // the checker's own failure (sockets, file descriptors): says nothing of the replica
)

// Results lists every Result, for metrics.
var Results = []Result{OK, Timeout, Refused, Reset, Unreachable, BadAnswer, Fault}

// Path is what a replica's nginx answers on its liveness port.
const Path = "/live"

// request is the probe: HTTP/1.1 on a kept-alive connection, so a probe is one
// small write and one small read.
var request = []byte("GET " + Path + " HTTP/1.1\r\nHost: portico-liveness\r\nUser-Agent: portico-liveness\r\n\r\n")

// prober asks one replica's nginx whether it serves, over one kept-alive
// connection that it re-dials when it breaks.
type prober struct {
	addr string
	dial func(ctx context.Context, network, addr string) (net.Conn, error)

	conn net.Conn
	br   *bufio.Reader
	// report is what the last good answer said the replica's node calls
	// down (its "down <addr>" lines), nil when it said nothing.
	report []netip.Addr

	// grace is Timing.ReloadGrace; hold is called when the prober starts
	// waiting on a replica that ended its last connection itself (the
	// checker releases it with the probe's result); ended is when it did
	// (zero once it answers again).
	grace time.Duration
	hold  func()
	ended time.Time
}

// maxAnswer bounds what a probe reads of an answer's body: "live" and the
// verdicts of a group of a thousand replicas fit.
const maxAnswer = 64 << 10

// probe sends one request and waits for its answer until the deadline. A
// connection that nginx closed since the last answer (a reload ends kept-alive
// connections; so does keepalive_requests) is re-dialled once at once, so only
// a replica that does not answer on a fresh connection fails.
//
// After such a close, a new connection that the replica's kernel accepts is
// waited on until grace after the close, and hold keeps the replica's verdict
// meanwhile: its nginx still listens (the master keeps the socket across a
// reload) and its new workers answer what queued there as soon as they run,
// which on a loaded node takes longer than DeadAfter. Whatever else fails —
// a refused connection (nothing listens), no handshake (node or link down),
// no close (a wedged nginx keeps its connections) — is judged as before.
func (p *prober) probe(ctx context.Context, deadline time.Time) (Result, error) {
	reused := p.conn != nil
	res, err := p.try(ctx, deadline)
	if reused && (res == Reset || res == BadAnswer) {
		res, err = p.try(ctx, deadline)
	}
	return res, err
}

func (p *prober) try(ctx context.Context, deadline time.Time) (Result, error) {
	if p.conn == nil {
		dctx, cancel := context.WithDeadline(ctx, deadline)
		c, err := p.dial(dctx, "tcp", p.addr)
		cancel()
		if err != nil {
			p.ended = time.Time{}
			return classify(err), err
		}
		p.conn, p.br = c, bufio.NewReaderSize(c, 512)
		if until := p.ended.Add(p.grace); !p.ended.IsZero() && until.After(deadline) {
			deadline = until
			p.hold() // until the result is recorded
		}
	}
	ended := p.ended
	p.ended = time.Time{}
	res, err := p.exchange(deadline)
	switch {
	case res == Reset && !ended.IsZero():
		p.ended = ended // a new connection that ended too: the grace still runs from the first close
	case res == Reset:
		p.ended = time.Now() // the replica ended the connection: see probe
	}
	if res != OK {
		p.close()
	}
	return res, err
}

func (p *prober) exchange(deadline time.Time) (Result, error) {
	if err := p.conn.SetDeadline(deadline); err != nil {
		return Fault, err
	}
	if _, err := p.conn.Write(request); err != nil {
		return classify(err), err
	}
	resp, err := http.ReadResponse(p.br, nil)
	if err != nil {
		return classifyRead(err), err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body) // beyond the limit: read, not kept
	}
	resp.Body.Close()
	if err != nil {
		return classify(err), err
	}
	if resp.StatusCode != http.StatusOK {
		return BadAnswer, fmt.Errorf("status %d", resp.StatusCode)
	}
	p.report = parseReport(body)
	if resp.Close {
		// The replica ends the connection after this answer (an nginx
		// shutting its workers down for a reload answers what it has in
		// hand this way): the next connection may wait on its new workers.
		p.close()
		p.ended = time.Now()
	}
	return OK, nil
}

// parseReport reads the verdicts in a liveness answer: the address of every
// "down <addr>" line. Other lines ("live") and lines it cannot read are
// skipped: an nginx of another version says what it says, and calls nobody
// down.
func parseReport(body []byte) []netip.Addr {
	var out []netip.Addr
	for len(body) > 0 {
		line := body
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i], body[i+1:]
		} else {
			body = nil
		}
		rest, ok := bytes.CutPrefix(line, []byte("down "))
		if !ok {
			continue
		}
		if a, err := netip.ParseAddr(string(rest)); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

func (p *prober) close() {
	if p.conn != nil {
		p.conn.Close()
		p.conn, p.br = nil, nil
	}
}

// classify names a socket error: what it says of the replica, or Fault when it
// says only that the checker could not do its job (out of sockets or memory, a
// vanished interface), which must never take a replica out.
func classify(err error) Result {
	var ne net.Error
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout():
		return Timeout
	case errors.Is(err, syscall.ECONNREFUSED):
		return Refused
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ECONNABORTED),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return Reset
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EHOSTDOWN),
		errors.Is(err, syscall.ENETDOWN):
		return Unreachable
	}
	return Fault
}

// classifyRead names an error from reading an answer: the connection's own
// errors as classify does, anything else (http.ReadResponse's parse errors are
// plain strings) as an answer that is not HTTP.
func classifyRead(err error) Result {
	var oe *net.OpError
	if errors.As(err, &oe) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, os.ErrDeadlineExceeded) {
		return classify(err)
	}
	return BadAnswer
}

// dialer returns how to reach a replica. A remote replica is dialled through
// the edge interface (SO_BINDTODEVICE), so a probe takes the L2 path the
// steered frames take; this node's own replica through the local stack.
func dialer(iface string, local bool) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{}
	if iface != "" && !local {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptString(int(fd), syscall.SOL_SOCKET, syscall.SO_BINDTODEVICE, iface)
			}); err != nil {
				return err
			}
			return serr
		}
	}
	return d.DialContext
}

// target is a replica's address and port as a dial string.
func target(a netip.Addr, port uint16) string {
	return netip.AddrPortFrom(a.Unmap(), port).String()
}
