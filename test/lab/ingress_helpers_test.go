package lab

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

// waitServed waits until host+path is served through every edge node: 30
// consecutive new connections succeed, pass check, and reach all edges.
func (l *Lab) waitServed(ctx context.Context, d time.Duration, host, path string, check func(traffic.Reply) error) error {
	c := l.HTTPClient(false, 2*time.Second)
	_, err := testenv.Poll(ctx, d, 100*time.Millisecond, func() error {
		edges := map[string]bool{}
		for range 30 {
			r, err := l.Get(ctx, c, host, path)
			if err == nil && check != nil {
				err = check(r)
			}
			if err != nil {
				return err
			}
			edges[r.Edge] = true
		}
		if len(edges) != len(l.Edges) {
			return fmt.Errorf("%s%s served through %d edges", host, path, len(edges))
		}
		return nil
	})
	return err
}

// waitIngressAddrs waits until Ingress name's status lists want, in order.
func (l *Lab) waitIngressAddrs(ctx context.Context, d time.Duration, name string, want ...netip.Addr) error {
	_, err := testenv.Poll(ctx, d, 100*time.Millisecond, func() error {
		ing, err := l.Kube.NetworkingV1().Ingresses(AppNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var got []netip.Addr
		for _, e := range ing.Status.LoadBalancer.Ingress {
			a, _ := netip.ParseAddr(e.IP)
			got = append(got, a)
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("Ingress %s's status lists %v, want %v", name, got, want)
		}
		return nil
	})
	return err
}

// annotateIngress sets an annotation on Ingress name.
func (l *Lab) annotateIngress(ctx context.Context, name, key, value string) error {
	c := l.Kube.NetworkingV1().Ingresses(AppNamespace)
	ing, err := c.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	ing.Annotations[key] = value
	_, err = c.Update(ctx, ing, metav1.UpdateOptions{})
	return err
}
