// Package traffic is the labs' clients: requests, long-lived connections, streams of
// new connections and bounded loads sent from a client network namespace to a VIP,
// and the backends' answers parsed. test/lab and test/cluster share it.
package traffic

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/portico-edge/portico/test/netlab"
)

// Target is where a lab's client traffic goes: the client's network namespace and the
// VIP (port 80 for HTTP), IPv4 or IPv6.
type Target struct {
	NS  string     // the client's network namespace
	VIP netip.Addr // the address requests go to
	// Port is where long-lived connections go (OpenKeepConn): 0 is 80, nginx's
	// HTTP; an L4 Service's port reaches its backends through the stream proxy.
	Port uint16
}

// keepAddr is the address OpenKeepConn connects to.
func (l Target) keepAddr() string {
	port := l.Port
	if port == 0 {
		port = 80
	}
	return net.JoinHostPort(l.VIP.String(), fmt.Sprint(port))
}

// httpAddr is the VIP's HTTP port, nginx's.
func (l Target) httpAddr() string { return net.JoinHostPort(l.VIP.String(), "80") }

// Dial opens a TCP connection from the client namespace.
func (l Target) Dial(ctx context.Context, network, addr string) (c net.Conn, err error) {
	var d net.Dialer
	err = netlab.Do(l.NS, func() error {
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// HTTPClient sends requests from the client namespace, one connection each
// unless keepAlive.
func (l Target) HTTPClient(keepAlive bool, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		DisableKeepAlives: !keepAlive, DialContext: l.Dial, MaxIdleConnsPerHost: 1000,
	}}
}

// Reply is a parsed backend answer: an HTTP one names the pod, the edge nginx
// connected from, the client, the host and the path; a TCP or UDP one names
// the pod, the peer it saw and the client.
type Reply struct{ Pod, Edge, Peer, Client, Host, Path string }

// ParseReply parses a backend pod's HTTP answer, "pod=<name> edge=<address> ...".
func ParseReply(body string) (Reply, error) {
	r := parseFields(body)
	if r.Pod == "" || r.Edge == "" {
		return r, fmt.Errorf("not a backend reply: %q", body)
	}
	return r, nil
}

// ParseL4Reply parses a backend pod's TCP or UDP answer, "pod=<name>
// peer=<address> client=<address>".
func ParseL4Reply(body string) (Reply, error) {
	r := parseFields(body)
	if r.Pod == "" {
		return r, fmt.Errorf("not a backend reply: %q", body)
	}
	return r, nil
}

// parseFields reads the key=value fields of a backend's answer.
func parseFields(body string) Reply {
	var r Reply
	for _, f := range strings.Fields(body) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "pod":
			r.Pod = v
		case "edge":
			r.Edge = v
		case "peer":
			r.Peer = v
		case "client":
			r.Client = v
		case "host":
			r.Host = v
		case "path":
			r.Path = v
		}
	}
	return r
}

// Get requests http://VIP<path> with the given Host and parses the reply.
func (l Target) Get(ctx context.Context, c *http.Client, host, path string) (Reply, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+l.httpAddr()+path, nil)
	if err != nil {
		return Reply{}, err
	}
	req.Host = host
	resp, err := c.Do(req)
	if err != nil {
		return Reply{}, err
	}
	defer resp.Body.Close()
	buf := make([]byte, 512)
	n, _ := resp.Body.Read(buf)
	if resp.StatusCode != http.StatusOK {
		return Reply{}, fmt.Errorf("%s%s: %s: %q", host, path, resp.Status, buf[:n])
	}
	return ParseReply(string(buf[:n]))
}

// portKey carries a *uint16 in a request's context: the client port its
// connection came from.
type portKey struct{}

// Load is a bounded client load: workers sending one request per new connection
// until stopped, at most 20,000 requests each and 60 s.
type Load struct {
	stop         chan struct{}
	wg           sync.WaitGroup
	ok, failed   atomic.Int64
	firstFailure atomic.Value

	mu       sync.Mutex
	failures []LoadFailure // the first 50
}

// LoadFailure is one failed request of a Load: when it started, from which
// client port (0 if no connection was made) and why.
type LoadFailure struct {
	Start time.Time
	Port  uint16
	Err   error
}

// StartLoad starts workers requesting host through the VIP.
func (l Target) StartLoad(ctx context.Context, host string, workers int) *Load {
	ld := &Load{stop: make(chan struct{})}
	// Each connection comes from a port of its own (10000-29999, below the
	// ephemeral range), so a failed one can be found in the edges' flow tables.
	var next atomic.Int32
	c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (conn net.Conn, err error) {
			var d net.Dialer
			if n := next.Add(1); n < 20000 {
				p := uint16(10000 + n)
				d.LocalAddr = &net.TCPAddr{Port: int(p)}
				if ptr, ok := ctx.Value(portKey{}).(*uint16); ok {
					*ptr = p
				}
			}
			err = netlab.Do(l.NS, func() error {
				conn, err = d.DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		}}}
	for range workers {
		ld.wg.Add(1)
		go func() {
			defer ld.wg.Done()
			deadline := time.Now().Add(60 * time.Second)
			for i := 0; i < 20000 && time.Now().Before(deadline); i++ {
				select {
				case <-ld.stop:
					return
				default:
				}
				start := time.Now()
				var port uint16
				tctx := context.WithValue(ctx, portKey{}, &port)
				if _, err := l.Get(tctx, c, host, "/load"); err != nil {
					ld.failed.Add(1)
					ld.firstFailure.CompareAndSwap(nil, err.Error())
					ld.mu.Lock()
					if len(ld.failures) < 50 {
						ld.failures = append(ld.failures, LoadFailure{Start: start, Port: port, Err: err})
					}
					ld.mu.Unlock()
				} else {
					ld.ok.Add(1)
				}
			}
		}()
	}
	return ld
}

// Failures returns the first 50 failed requests (call after Stop).
func (ld *Load) Failures() []LoadFailure {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return slices.Clone(ld.failures)
}

// Stop ends the load and returns its counts and first failure.
func (ld *Load) Stop() (ok, failed int64, first any) {
	close(ld.stop)
	ld.wg.Wait()
	return ld.ok.Load(), ld.failed.Load(), ld.firstFailure.Load()
}
