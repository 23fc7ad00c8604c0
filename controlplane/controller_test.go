package controlplane

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
)

// fakeController is a Controller on a fake clientset whose Events land in a
// FakeRecorder.
func fakeController(t *testing.T, objs ...corev1.Service) (*Controller, *record.FakeRecorder) {
	t.Helper()
	cs := fake.NewSimpleClientset()
	for i := range objs {
		if _, err := cs.CoreV1().Services(objs[i].Namespace).Create(context.Background(), &objs[i], metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	c, err := New(Config{Client: cs, Logger: zaptest.NewLogger(t), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	rec := record.NewFakeRecorder(10)
	c.recorder = rec
	return c, rec
}

func drain(rec *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// TestAnnotateGone: a decision about an object deleted since the cache saw it is
// neither an error nor an Event.
func TestAnnotateGone(t *testing.T) {
	c, rec := fakeController(t, corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "here"}})
	ctx := context.Background()

	applied, err := c.annotate(ctx, "Service", "ns/gone", AnnotationVIP, "192.0.2.1", "VIPAllocated", "VIP 192.0.2.1 from the pools")
	if err != nil || applied {
		t.Fatalf("annotate a deleted Service: applied %v, err %v; want false, nil", applied, err)
	}
	if ev := drain(rec); len(ev) != 0 {
		t.Fatalf("Events for a deleted Service: %q", ev)
	}
	if len(c.written) != 0 {
		t.Fatalf("a write that did not apply is remembered: %v", c.written)
	}

	applied, err = c.annotate(ctx, "Service", "ns/here", AnnotationVIP, "192.0.2.1", "VIPAllocated", "VIP 192.0.2.1 from the pools")
	if err != nil || !applied {
		t.Fatalf("annotate an existing Service: applied %v, err %v; want true, nil", applied, err)
	}
	if ev := drain(rec); len(ev) != 1 || ev[0] != "Normal VIPAllocated VIP 192.0.2.1 from the pools" {
		t.Fatalf("Events: %q, want one VIPAllocated", ev)
	}
	svc, err := c.cfg.Client.CoreV1().Services("ns").Get(ctx, "here", metav1.GetOptions{})
	if err != nil || svc.Annotations[AnnotationVIP] != "192.0.2.1" {
		t.Fatalf("annotation not written: %v %v", svc, err)
	}
}

// TestWithWrittenCopies: the overlay of this leader's writes shows on copies of
// Services and Ingresses; the cached objects and slices stay as they were.
func TestWithWrittenCopies(t *testing.T) {
	c, _ := fakeController(t)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "g"}}
	other := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "h"}}
	ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "i", Annotations: map[string]string{"x": "y"}}}
	st := State{Services: []*corev1.Service{svc, other}, Ingresses: []*networkingv1.Ingress{ing}}
	c.written[writtenKey{"Service", "ns/g", AnnotationVIP}] = written{"192.0.2.1", time.Now()}
	c.written[writtenKey{"Ingress", "ns/i", AnnotationGroup}] = written{"ns/g", time.Now()}

	out := c.withWritten(st)
	if got := out.Services[0].Annotations[AnnotationVIP]; got != "192.0.2.1" {
		t.Errorf("Service overlay: %q", got)
	}
	if out.Services[1] != other {
		t.Errorf("untouched Service copied")
	}
	if got := out.Ingresses[0].Annotations; got[AnnotationGroup] != "ns/g" || got["x"] != "y" {
		t.Errorf("Ingress overlay: %v", got)
	}
	if svc.Annotations != nil || len(ing.Annotations) != 1 || st.Services[0] != svc || st.Ingresses[0] != ing {
		t.Errorf("cached objects changed: %v %v", svc.Annotations, ing.Annotations)
	}
}
