package traffic

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"time"
)

// KeepConn is one long-lived HTTP/1.1 connection from the client to the VIP.
type KeepConn struct {
	c    net.Conn
	br   *bufio.Reader
	Edge string // the edge node whose nginx holds the connection
}

// OpenKeepConn connects to the VIP's port (80 unless Port says otherwise) and
// sends a first request, which tells which edge node holds the connection (the
// address the backend saw the request come from).
func (l Target) OpenKeepConn(ctx context.Context, host string) (*KeepConn, error) {
	c, err := l.Dial(ctx, "tcp", l.keepAddr())
	if err != nil {
		return nil, err
	}
	k := NewKeepConn(c)
	r, err := k.Do(host, "/", 3*time.Second)
	if err != nil {
		c.Close()
		return nil, err
	}
	k.Edge = r.Edge
	return k, nil
}

// NewKeepConn wraps a connection to the VIP's port 80 that has sent nothing yet.
func NewKeepConn(c net.Conn) *KeepConn { return &KeepConn{c: c, br: bufio.NewReader(c)} }

// Do sends one request on the connection and reads the reply.
func (k *KeepConn) Do(host, path string, timeout time.Duration) (Reply, error) {
	k.c.SetDeadline(time.Now().Add(timeout))
	if _, err := fmt.Fprintf(k.c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, host); err != nil {
		return Reply{}, err
	}
	return k.read()
}

// ReadLate reads the reply of a request whose Do timed out before any of the
// reply came, waiting at most timeout more; it fails at once if part of the
// reply had come.
func (k *KeepConn) ReadLate(timeout time.Duration) (Reply, error) {
	if k.br.Buffered() > 0 {
		return Reply{}, fmt.Errorf("part of the reply came in time")
	}
	k.c.SetDeadline(time.Now().Add(timeout))
	return k.read()
}

func (k *KeepConn) read() (Reply, error) {
	resp, err := http.ReadResponse(k.br, nil)
	if err != nil {
		return Reply{}, err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 512))
	resp.Body.Close()
	if err != nil {
		return Reply{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return Reply{}, fmt.Errorf("%s", resp.Status)
	}
	return ParseReply(string(body))
}

// Close closes the connection.
func (k *KeepConn) Close() error { return k.c.Close() }

// LocalPort is the connection's source port (what a router's L4 ECMP hashes).
func (k *KeepConn) LocalPort() uint16 {
	if a, ok := k.c.LocalAddr().(*net.TCPAddr); ok {
		return uint16(a.Port)
	}
	return 0
}

// OpenKeepConns opens n long-lived connections (see OpenKeepConn); on error it
// closes the ones it opened.
func (l Target) OpenKeepConns(ctx context.Context, host string, n int) (KeepConns, error) {
	var conns KeepConns
	for range n {
		k, err := l.OpenKeepConn(ctx, host)
		if err != nil {
			conns.Close()
			return nil, err
		}
		conns = append(conns, k)
	}
	return conns, nil
}

// KeepConns is a set of long-lived connections.
type KeepConns []*KeepConn

// Close closes every connection.
func (ks KeepConns) Close() {
	for _, k := range ks {
		k.Close()
	}
}

// Ends are the connection's client and server addresses, as a trace names them.
func (k *KeepConn) Ends() (client, server netip.AddrPort) {
	if a, ok := k.c.LocalAddr().(*net.TCPAddr); ok {
		client = a.AddrPort()
	}
	if a, ok := k.c.RemoteAddr().(*net.TCPAddr); ok {
		server = a.AddrPort()
	}
	return netip.AddrPortFrom(client.Addr().Unmap(), client.Port()), netip.AddrPortFrom(server.Addr().Unmap(), server.Port())
}
