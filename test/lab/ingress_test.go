package lab

import (
	"context"
	"fmt"

	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/test/testenv"
)

// TestIngressPropagation: a new host is served within 2 s of its Ingress being
// created; a bad Ingress gets an Event and everything else is still served.
func TestIngressPropagation(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	c := l.HTTPClient(false, 2*time.Second)
	start := time.Now()
	if err := l.Ingress(ctx, "fresh", "fresh.lab", "echo"); err != nil {
		t.Fatal(err)
	}
	if err := l.waitServed(ctx, 10*time.Second, "fresh.lab", "/", nil); err != nil {
		t.Fatal(err)
	}
	// Includes the 30 checking requests (tens of milliseconds).
	took := time.Since(start)
	t.Logf("fresh.lab served through every edge %v after its Ingress was created", took.Round(time.Millisecond))
	if took > 2*time.Second {
		t.Errorf("propagation took %v, want < 2s", took)
	}

	bad := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Namespace: AppNamespace, Name: "bad",
		Annotations: map[string]string{"portico.io/group": GroupNamespace + "/" + GroupName, "portico.io/ssl-redirect": "perhaps"}},
		Spec: networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{{Host: "bad.lab", IngressRuleValue: networkingv1.IngressRuleValue{
			HTTP: &networkingv1.HTTPIngressRuleValue{Paths: []networkingv1.HTTPIngressPath{{Path: "/x;return", PathType: ptr(networkingv1.PathTypePrefix),
				Backend: networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: "echo", Port: networkingv1.ServiceBackendPort{Name: "http"}}}}}}}}}}}
	if _, err := l.Kube.NetworkingV1().Ingresses(AppNamespace).Create(ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Poll(ctx, 10*time.Second, 100*time.Millisecond, func() error {
		evs, err := l.Kube.CoreV1().Events(AppNamespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=bad"})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Type == corev1.EventTypeWarning {
				t.Logf("event on the bad Ingress: %s: %s", e.Reason, e.Message)
				return nil
			}
		}
		return fmt.Errorf("no warning event on the bad Ingress (%d events)", len(evs.Items))
	}); err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"echo.lab", "fresh.lab"} {
		if _, err := l.Get(ctx, c, host, "/still"); err != nil {
			t.Errorf("%s after the bad Ingress: %v", host, err)
		}
	}
}

// TestIngressAddressAfterServing: a new Ingress gets its address in status only
// once every edge's nginx serves it, so a client that waits for the address (as
// kubectl wait, CD pipelines and conformance runners do) never sees a request
// fail: 100 new connections right after the address appears, spread over every
// replica, all answered.
func TestIngressAddressAfterServing(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	c := l.HTTPClient(false, 2*time.Second)
	created := time.Now()
	if err := l.Ingress(ctx, "fresh", "fresh.lab", "echo"); err != nil {
		t.Fatal(err)
	}
	// First answer through the VIP, polled beside the status.
	firstServed := make(chan time.Duration, 1)
	pollCtx, stopPoll := context.WithTimeout(ctx, 30*time.Second)
	defer stopPoll()
	go func() {
		for pollCtx.Err() == nil {
			if _, err := l.Get(pollCtx, c, "fresh.lab", "/probe"); err == nil {
				firstServed <- time.Since(created)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	var status time.Duration
	if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error {
		ing, err := l.Kube.NetworkingV1().Ingresses(AppNamespace).Get(ctx, "fresh", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if lb := ing.Status.LoadBalancer.Ingress; len(lb) != 1 || lb[0].IP != VIP.String() {
			return fmt.Errorf("status %+v, want %s", lb, VIP)
		}
		status = time.Since(created)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	failed, replicas := 0, map[string]int{}
	var first error
	for range 100 {
		r, err := l.Get(ctx, c, "fresh.lab", "/after-status")
		if err != nil {
			failed++
			if first == nil {
				first = err
			}
			continue
		}
		replicas[r.Edge]++
	}
	var served time.Duration
	select {
	case served = <-firstServed:
	case <-time.After(5 * time.Second):
		t.Error("the poller never got an answer")
	}
	t.Logf("Ingress created: first answer through the VIP after %v, address in status after %v; then %d of 100 requests failed (per replica %v)",
		served.Round(time.Millisecond), status.Round(time.Millisecond), failed, replicas)
	if failed > 0 {
		t.Errorf("%d of 100 requests failed after the address appeared (first: %v)", failed, first)
	}
	if len(replicas) != len(l.Edges) {
		t.Errorf("requests reached replicas %v, want all %d: the test proves less than it says", replicas, len(l.Edges))
	}
}
