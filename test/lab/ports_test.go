package lab

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/test/testcert"
	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

// TestCustomPorts: the group Service's ports named http and https move the
// group's public ports to 8080 and 8443. Every edge's nginx serves HTTP and
// HTTPS there (new connections spread over all three replicas), the HTTPS
// redirect names the new port, and port 80, no longer a port of the group, is
// no longer served.
func TestCustomPorts(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	cert, key, err := testcert.ECDSA("secure.lab")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.TLSSecret(ctx, "secure-tls", cert, key); err != nil {
		t.Fatal(err)
	}
	if err := l.IngressRoutes(ctx, "secure", "secure.lab", "secure-tls", Route{Path: "/", Service: "echo"}); err != nil {
		t.Fatal(err)
	}
	if err := l.annotateIngress(ctx, "secure", "portico.io/ssl-redirect", "true"); err != nil {
		t.Fatal(err)
	}
	svc, err := l.Kube.CoreV1().Services(GroupNamespace).Get(ctx, GroupName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Spec.Ports = []corev1.ServicePort{
		{Name: "http", Port: 8080, Protocol: corev1.ProtocolTCP},
		{Name: "https", Port: 8443, Protocol: corev1.ProtocolTCP},
	}
	if _, err := l.Kube.CoreV1().Services(GroupNamespace).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	plain := netip.AddrPortFrom(VIP, 8080).String()
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: l.Dial, DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(host, path string) (*http.Response, traffic.Reply, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+plain+path, nil)
		req.Host = host
		resp, err := c.Do(req)
		if err != nil {
			return nil, traffic.Reply{}, err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return resp, traffic.Reply{}, nil
		}
		r, err := traffic.ParseReply(string(body))
		return resp, r, err
	}
	// Every edge reloads on its own: wait until 30 requests in a row (new
	// connections, so spread over the edges) are answered on 8080.
	t0 := time.Now()
	if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error {
		for range 30 {
			if _, _, err := get("echo.lab", "/wait"); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("HTTP on 8080: %v", err)
	}
	t.Logf("HTTP served on 8080 by every edge %.1f s after the Service changed", time.Since(t0).Seconds())

	edges := map[string]int{}
	for range 150 {
		_, r, err := get("echo.lab", "/custom")
		if err != nil {
			t.Fatal(err)
		}
		edges[r.Edge]++
	}
	t.Logf("150 requests on 8080, per replica %v", edges)
	if len(edges) != len(l.Edges) {
		t.Errorf("requests on 8080 reached replicas %v, want all %d", edges, len(l.Edges))
	}

	resp, _, err := get("secure.lab", "/x?y=1")
	if err != nil {
		t.Fatal(err)
	}
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusPermanentRedirect || loc != "https://secure.lab:8443/x?y=1" {
		t.Errorf("secure.lab on 8080 answered %d, Location %q; want 308 to https://secure.lab:8443/x?y=1", resp.StatusCode, loc)
	}

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cert)
	tc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: l.Dial, DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{ServerName: "secure.lab", RootCAs: pool}}}
	tlsEdges := map[string]int{}
	for range 60 {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+netip.AddrPortFrom(VIP, 8443).String()+"/tls", nil)
		req.Host = "secure.lab"
		resp, err := tc.Do(req)
		if err != nil {
			t.Fatalf("HTTPS on 8443: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		r, err := traffic.ParseReply(string(body))
		if err != nil {
			t.Fatal(err)
		}
		tlsEdges[r.Edge]++
	}
	t.Logf("60 HTTPS requests on 8443, per replica %v", tlsEdges)
	if len(tlsEdges) != len(l.Edges) {
		t.Errorf("HTTPS on 8443 reached replicas %v, want all %d", tlsEdges, len(l.Edges))
	}

	// Port 80 is no longer the group's: no edge steers it and no nginx listens.
	dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if conn, err := l.Dial(dctx, "tcp", netip.AddrPortFrom(VIP, 80).String()); err == nil {
		conn.Close()
		t.Error("port 80 still accepts connections")
	} else {
		t.Logf("port 80: %v", err)
	}
}
