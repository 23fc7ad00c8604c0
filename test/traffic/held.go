package traffic

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Held connections of two more kinds than KeepConn's requests, as backends that
// speak the lab's line protocol serve them (test/lab's pods): an upgraded
// (WebSocket-style) connection, on which the backend echoes every line with its
// answer and, every 20 s, sends a heartbeat line starting "ping " (as a
// WebSocket server's pings keep nginx's proxy_read_timeout from closing an idle
// one); and a streaming response, a line every 500 ms. Every line the backend
// sends is a backend answer (ParseReply) with a sequence number.

// Upgraded is a held upgraded connection through the VIP.
type Upgraded struct {
	c  net.Conn
	br *bufio.Reader
	// First is the backend's answer to the first line: the pod and the edge
	// the connection lives on.
	First Reply
}

// OpenUpgraded connects to the VIP's port 80, asks host+path for an upgrade to
// websocket, which must be answered 101, and exchanges a first line.
func (l Target) OpenUpgraded(ctx context.Context, host, path string, timeout time.Duration) (*Upgraded, error) {
	c, err := l.request(ctx, host, path, "Connection: Upgrade\r\nUpgrade: websocket\r\n", timeout)
	if err != nil {
		return nil, err
	}
	u := &Upgraded{c: c, br: bufio.NewReader(c)}
	resp, err := http.ReadResponse(u.br, nil)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("upgrade %s%s: %w", host, path, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
		c.Close()
		return nil, fmt.Errorf("upgrade %s%s: %s: %q", host, path, resp.Status, body)
	}
	if u.First, err = u.Exchange(timeout); err != nil {
		c.Close()
		return nil, fmt.Errorf("upgrade %s%s: first line: %w", host, path, err)
	}
	return u, nil
}

// Exchange sends a line and returns the backend's answer to it, after any
// heartbeats that came first.
func (u *Upgraded) Exchange(timeout time.Duration) (Reply, error) {
	u.c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(u.c, "hello\n"); err != nil {
		return Reply{}, err
	}
	// Heartbeats queue while the connection is idle: 3 a minute.
	for range 100 {
		line, err := u.br.ReadString('\n')
		if err != nil {
			return Reply{}, err
		}
		if !strings.HasPrefix(line, "ping ") {
			return ParseReply(line)
		}
	}
	return Reply{}, errors.New("100 heartbeats and no answer")
}

// Close closes the connection.
func (u *Upgraded) Close() error { return u.c.Close() }

// Feed is a held streaming response through the VIP, read as it comes.
type Feed struct {
	c net.Conn
	// First is the first line: the pod and the edge the response comes from.
	First Reply
	done  chan struct{}

	mu    sync.Mutex
	lines int
	last  time.Time
	err   error // why the response ended
}

// OpenFeed requests host+path through the VIP's port 80, which must answer 200
// with a line at a time, reads the first line and keeps reading in the
// background until the response ends or Close.
func (l Target) OpenFeed(ctx context.Context, host, path string, timeout time.Duration) (*Feed, error) {
	c, err := l.request(ctx, host, path, "", timeout)
	if err != nil {
		return nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("feed %s%s: %w", host, path, err)
	}
	body := bufio.NewReader(resp.Body)
	first, err := body.ReadString('\n')
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: %q", resp.Status, first)
	}
	f := &Feed{c: c, done: make(chan struct{}), lines: 1, last: time.Now()}
	if err == nil {
		f.First, err = ParseReply(first)
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("feed %s%s: %w", host, path, err)
	}
	go f.read(body)
	return f, nil
}

// read takes the response's lines until it ends; a line from another pod ends
// it too. The backend sends at most 1,200.
func (f *Feed) read(body *bufio.Reader) {
	defer close(f.done)
	for range 2000 {
		f.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		line, err := body.ReadString('\n')
		var r Reply
		if err == nil {
			r, err = ParseReply(line)
		}
		if err == nil && r.Pod != f.First.Pod {
			err = fmt.Errorf("a line from %s, the response came from %s", r.Pod, f.First.Pod)
		}
		f.mu.Lock()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = fmt.Errorf("the response ended after %d lines", f.lines)
			}
			f.err = err
			f.mu.Unlock()
			return
		}
		f.lines++
		f.last = time.Now()
		f.mu.Unlock()
	}
}

// Check reports whether the response still delivers: a line came within the
// last within, and it has not ended.
func (f *Feed) Check(within time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	if since := time.Since(f.last); since > within {
		return fmt.Errorf("no line for %v (after %d)", since.Round(time.Millisecond), f.lines)
	}
	return nil
}

// Lines is how many lines have come.
func (f *Feed) Lines() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lines
}

// Close closes the connection and waits for the reader.
func (f *Feed) Close() error {
	err := f.c.Close()
	<-f.done
	return err
}

// request connects to the VIP's port 80 and sends a GET of host+path with the
// extra header lines (each ending in CRLF); the connection's deadline is timeout
// from now.
func (l Target) request(ctx context.Context, host, path, extra string, timeout time.Duration) (net.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := l.Dial(dctx, "tcp", l.httpAddr())
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n%s\r\n", path, host, extra); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}
