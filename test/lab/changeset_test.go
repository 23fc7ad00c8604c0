package lab

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/test/testcert"
	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

// changeSet makes TestConfigChangesKeepConnections's changes, each unrelated
// to the held connections, and remembers what they made.
type changeSet struct {
	l     *Lab
	hosts []*changed // Ingresses of one host with a route of /base, and added paths
	tls   []*changed // Ingresses with TLS from a Secret of their own
	svcs  []*changed // Ingresses of a backend Service of their own
	l4    int        // L4 Services made
}

// changed is an object of a changeSet.
type changed struct {
	name, host string
	// touched is the number of the change that last wrote it.
	touched int
	paths   int  // hosts: paths added
	pod     int  // svcs: its endpoint, a pod's index
	alt     bool // svcs: its Service has the port "alt"
}

// change is one configuration change: what it writes, and a probe that
// answers nil once its effect is served through the VIP.
type change struct {
	kind, what string
	write      func(context.Context) error
	probe      func(context.Context) error
}

// changeResult is what became of a change.
type changeResult struct {
	change
	written time.Time
	served  time.Duration // from written to the probe's first success
	err     error         // why it was not served
}

// changePattern is the order of the kinds of change, repeated. A change that
// needs an earlier object that is not settled (see settled) makes a new
// Ingress instead.
var changePattern = []string{
	"ingress", "tls", "service", "path", "ingress", "endpoints", "rotate", "delete", "ingress", "service-port",
	"path", "l4", "ingress", "tls", "service", "path", "ingress", "endpoints", "rotate", "delete",
}

// run makes n changes, one every every, probing each one's effect for up to 10
// s beside the changes that follow. The order and the objects depend only on n.
func (cs *changeSet) run(ctx context.Context, t *testing.T, n int, every time.Duration) []changeResult {
	t.Helper()
	results := make([]changeResult, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(i) * every)))
		c := cs.next(i)
		r := &results[i]
		r.change, r.written = c, time.Now()
		if err := c.write(ctx); err != nil {
			r.err = fmt.Errorf("write: %w", err)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, r.err = testenv.Poll(ctx, 10*time.Second, 100*time.Millisecond, func() error { return c.probe(ctx) })
			r.served = time.Since(r.written)
		}()
	}
	wg.Wait()
	return results
}

// settled picks, of objs, the one written longest ago whose last change's
// probe has ended for sure (6 changes ago, at 1.8 s each, is more than its 10
// s), among those ok accepts.
func settled(objs []*changed, i int, ok func(*changed) bool) *changed {
	var pick *changed
	for _, o := range objs {
		if o.touched <= i-6 && (ok == nil || ok(o)) && (pick == nil || o.touched < pick.touched) {
			pick = o
		}
	}
	return pick
}

// next is change i.
func (cs *changeSet) next(i int) change {
	l := cs.l
	switch kind := changePattern[i%len(changePattern)]; kind {
	case "path":
		if o := settled(cs.hosts, i, nil); o != nil {
			o.touched, o.paths = i, o.paths+1
			path := fmt.Sprintf("/p%d", o.paths)
			return change{kind, fmt.Sprintf("Ingress %s gains %s", o.name, path),
				func(ctx context.Context) error { return l.SetRoute(ctx, o.name, Route{Path: path, Service: "echo"}) },
				func(ctx context.Context) error { return l.answers(ctx, o.host, path, nil) }}
		}
	case "delete":
		if o := settled(cs.hosts, i, nil); o != nil {
			cs.hosts = slices.DeleteFunc(cs.hosts, func(x *changed) bool { return x == o })
			return change{kind, "Ingress " + o.name + " deleted",
				func(ctx context.Context) error {
					return l.Kube.NetworkingV1().Ingresses(AppNamespace).Delete(ctx, o.name, metav1.DeleteOptions{})
				},
				func(ctx context.Context) error { return l.refused(ctx, o.host) }}
		}
	case "tls":
		o := &changed{name: fmt.Sprintf("tls-%d", i), host: fmt.Sprintf("tls-%d.changes.lab", i), touched: i}
		cs.tls = append(cs.tls, o)
		var cert []byte
		return change{kind, "TLS Secret and Ingress " + o.name,
			func(ctx context.Context) error {
				c, key, err := testcert.ECDSA(o.host)
				if err != nil {
					return err
				}
				cert = c
				if err := l.TLSSecret(ctx, o.name, cert, key); err != nil {
					return err
				}
				return l.IngressRoutes(ctx, o.name, o.host, o.name, Route{Path: "/base", Service: "echo"})
			},
			func(ctx context.Context) error { return l.answersTLS(ctx, o.host, cert) }}
	case "rotate":
		if o := settled(cs.tls, i, nil); o != nil {
			o.touched = i
			var cert []byte
			return change{kind, "TLS Secret " + o.name + " rotated",
				func(ctx context.Context) error {
					c, key, err := testcert.ECDSA(o.host)
					if err != nil {
						return err
					}
					cert = c
					return l.updateTLSSecret(ctx, o.name, c, key)
				},
				func(ctx context.Context) error { return l.answersTLS(ctx, o.host, cert) }}
		}
	case "service":
		o := &changed{name: fmt.Sprintf("svc-%d", i), host: fmt.Sprintf("svc-%d.changes.lab", i), touched: i}
		cs.svcs = append(cs.svcs, o)
		return change{kind, "Service, EndpointSlice and Ingress " + o.name,
			func(ctx context.Context) error {
				if err := l.twoPortBackend(ctx, o.name, l.Pods[0]); err != nil {
					return err
				}
				return l.IngressRoutes(ctx, o.name, o.host, "", Route{Path: "/", Service: o.name}, Route{Path: "/alt", Service: o.name, Port: "alt"})
			},
			func(ctx context.Context) error { return l.answers(ctx, o.host, "/", l.Pods[:1]) }}
	case "endpoints":
		if o := settled(cs.svcs, i, nil); o != nil {
			o.touched, o.pod = i, (o.pod+1)%len(l.Pods)
			pod := l.Pods[o.pod]
			return change{kind, fmt.Sprintf("EndpointSlice of %s to %s", o.name, pod.Name),
				func(ctx context.Context) error { return l.setSlice(ctx, AppNamespace, o.name, pod) },
				func(ctx context.Context) error { return l.answers(ctx, o.host, "/", []*Node{pod}) }}
		}
	case "service-port":
		if o := settled(cs.svcs, i, func(o *changed) bool { return !o.alt }); o != nil {
			o.touched, o.alt = i, true
			return change{kind, "Service " + o.name + " gains the port alt",
				func(ctx context.Context) error { return l.addServicePort(ctx, o.name, "alt", 81) },
				func(ctx context.Context) error { return l.answers(ctx, o.host, "/alt", nil) }}
		}
	case "l4":
		cs.l4++
		addr := netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(100 + cs.l4)}), uint16(7100+cs.l4))
		name := fmt.Sprintf("l4-%d", i)
		if cs.l4%2 == 1 {
			// A UDP port is a listening socket of its own: a reload. Its
			// sessions idle out in 1 s, so that the lab's agents, whose
			// graceful stop waits for them, stop in time at the end.
			return change{"l4-udp", fmt.Sprintf("UDP L4 Service %s on %s", name, addr),
				func(ctx context.Context) error {
					return l.l4Service(ctx, name, addr.Addr(), corev1.ProtocolUDP, int32(addr.Port()), l4UDPPort,
						"portico.io/udp-idle-timeout", "1s")
				},
				func(ctx context.Context) error {
					_, err := l.udpQuery(addr.String())
					return err
				}}
		}
		// A TCP port is a route to nginx's steered listeners: no reload.
		return change{"l4-tcp", fmt.Sprintf("TCP L4 Service %s on %s", name, addr),
			func(ctx context.Context) error {
				return l.l4Service(ctx, name, addr.Addr(), corev1.ProtocolTCP, int32(addr.Port()), l4TCPPort)
			},
			func(ctx context.Context) error {
				c, _, _, err := l.tcpLine(ctx, addr.String())
				if err == nil {
					c.Close()
				}
				return err
			}}
	}
	// "ingress", and any change with nothing settled to change.
	o := &changed{name: fmt.Sprintf("host-%d", i), host: fmt.Sprintf("host-%d.changes.lab", i), touched: i}
	cs.hosts = append(cs.hosts, o)
	return change{"ingress", "Ingress " + o.name,
		func(ctx context.Context) error {
			return l.IngressRoutes(ctx, o.name, o.host, "", Route{Path: "/base", Service: "echo"})
		},
		func(ctx context.Context) error { return l.answers(ctx, o.host, "/base", nil) }}
}

// answers gets host+path through the VIP (a new connection): it must be
// answered by that route, and by one of pods unless pods is nil.
func (l *Lab) answers(ctx context.Context, host, path string, pods []*Node) error {
	r, err := l.Get(ctx, l.HTTPClient(false, time.Second), host, path)
	if err != nil {
		return err
	}
	if r.Host != host || r.Path != path {
		return fmt.Errorf("%s%s answered for %s%s", host, path, r.Host, r.Path)
	}
	if pods != nil && !slices.Contains(names(pods), r.Pod) {
		return fmt.Errorf("%s%s answered by %s, want %v", host, path, r.Pod, names(pods))
	}
	return nil
}

// answersTLS gets https://host/base through the VIP, trusting only cert, which
// the server must present.
func (l *Lab) answersTLS(ctx context.Context, host string, cert []byte) error {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(cert) {
		return errors.New("no certificate")
	}
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{DialContext: l.Dial, DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{ServerName: host, RootCAs: pool}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+VIP.String()+"/base", nil)
	if err != nil {
		return err
	}
	req.Host = host
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("https://%s/base: %s", host, resp.Status)
	}
	r, err := traffic.ParseReply(string(body))
	if err == nil && r.Host != host {
		err = fmt.Errorf("https://%s/base answered for %s", host, r.Host)
	}
	return err
}

// refused sends a request for host through the VIP: nginx must close the
// connection without an answer, as it does for a host no Ingress has.
func (l *Lab) refused(ctx context.Context, host string) error {
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	c, err := l.Dial(dctx, "tcp", net.JoinHostPort(VIP.String(), "80"))
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := fmt.Fprintf(c, "GET /base HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host); err != nil {
		return err
	}
	b, err := io.ReadAll(io.LimitReader(c, 512))
	var ne net.Error
	switch {
	case len(b) > 0:
		first, _, _ := strings.Cut(string(b), "\r\n")
		return fmt.Errorf("%s still answered: %s", host, first)
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("%s: no answer, and the connection not closed", host)
	}
	return nil
}

// twoPortBackend creates Service name with the port "http" (80) and its
// EndpointSlice, which has both "http" and "alt" to the pod's BackendPort: the
// port alt is served once the Service has it too (addServicePort).
func (l *Lab) twoPortBackend(ctx context.Context, name string, pod *Node) error {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: AppNamespace, Name: name},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
	if _, err := l.Kube.CoreV1().Services(AppNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create service %s: %w", name, err)
	}
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: AppNamespace, Name: name + "-lab", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr("http"), Port: ptr(int32(BackendPort)), Protocol: ptr(corev1.ProtocolTCP)},
			{Name: ptr("alt"), Port: ptr(int32(BackendPort)), Protocol: ptr(corev1.ProtocolTCP)},
		},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{pod.Addr.Addr().String()}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}}},
	}
	if _, err := l.Kube.DiscoveryV1().EndpointSlices(AppNamespace).Create(ctx, es, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create endpoints of %s: %w", name, err)
	}
	return nil
}

// addServicePort adds a TCP port to Service name.
func (l *Lab) addServicePort(ctx context.Context, name, port string, number int32) error {
	c := l.Kube.CoreV1().Services(AppNamespace)
	svc, err := c.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: port, Port: number, Protocol: corev1.ProtocolTCP})
	_, err = c.Update(ctx, svc, metav1.UpdateOptions{})
	return err
}

// updateTLSSecret replaces the certificate and key of Secret name.
func (l *Lab) updateTLSSecret(ctx context.Context, name string, certPEM, keyPEM []byte) error {
	c := l.Kube.CoreV1().Secrets(AppNamespace)
	sec, err := c.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	sec.Data = map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}
	_, err = c.Update(ctx, sec, metav1.UpdateOptions{})
	return err
}
