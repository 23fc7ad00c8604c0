package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/portico-edge/portico/test/netlab"
	"github.com/portico-edge/portico/test/traffic"
)

// dialer dials from inside ns: the lab's addresses exist only there.
func dialer(ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := netlab.Do(ns, func() (err error) {
			conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}
}

// HTTPClient returns an HTTP client whose connections start in namespace ns (e.g.
// c.Client.NS): the only way to reach the lab's addresses from this process.
func HTTPClient(ns string, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{DialContext: dialer(ns), DisableKeepAlives: true}}
}

// get returns the body of GET url, which must answer 200.
func get(c *http.Client, url string) (string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	return string(body), nil
}

// WaitVIP waits until the VIP takes a TCP connection on port 80 (nginx's HTTP,
// the chart's default) from the client: some edge node owns it and serves. (Not
// the liveness port: a VIP answers only on the ports it serves.)
func (p *Portico) WaitVIP(ctx context.Context, vip netip.Addr, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		c, err := p.Dial(dctx, "tcp", netip.AddrPortFrom(vip, 80).String())
		cancel()
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("VIP %s does not answer after %s: %w", vip, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// ServedEverywhere returns nil once 30 new connections in a row to host+path are
// answered and reach every edge of edges, or the last reason they did not.
func (p *Portico) ServedEverywhere(ctx context.Context, host, path string, edges []*Node, timeout time.Duration) error {
	hc := p.HTTPClient(false, 2*time.Second)
	return until(ctx, time.Now().Add(timeout), func() error {
		seen := map[string]bool{}
		for range 30 {
			r, err := p.Get(ctx, hc, host, path)
			if err != nil {
				return err
			}
			seen[p.EdgeOf(r)] = true
		}
		for _, e := range edges {
			if !seen[e.Name] {
				return fmt.Errorf("no answer through %s in 30 (%v)", e.Name, seen)
			}
		}
		return nil
	})
}

// GetTLS requests https://VIP/ for host (its SNI and Host), trusting certPEM
// alone, and returns the backend's reply and the certificate's names.
func (p *Portico) GetTLS(ctx context.Context, host string, certPEM []byte) (traffic.Reply, []string, error) {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	hc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: p.Dial, DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{ServerName: host, RootCAs: pool}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+GroupVIP.String()+"/", nil)
	if err != nil {
		return traffic.Reply{}, nil, err
	}
	req.Host = host
	resp, err := hc.Do(req)
	if err != nil {
		return traffic.Reply{}, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 512))
	if err != nil {
		return traffic.Reply{}, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return traffic.Reply{}, nil, fmt.Errorf("https://%s/: %s", host, resp.Status)
	}
	r, err := traffic.ParseReply(string(body))
	return r, resp.TLS.PeerCertificates[0].DNSNames, err
}
