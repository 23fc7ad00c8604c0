package controlplane

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
)

func TestSchedule(t *testing.T) {
	edge := func(name string, age int, tier string) *corev1.Service {
		s := groupSvc("e", name, age)
		s.Labels["tier"] = tier
		return s
	}
	sel := func(name string, age int, s string) *networkingv1.Ingress {
		return ingress("app", name, age, "", nil, v1alpha1.AnnotationGroupSelector, s)
	}
	groups := []*corev1.Service{edge("g-c", 1, "edge"), edge("g-a", 2, "edge"), edge("g-b", 3, "edge"), edge("g-x", 4, "internal")}
	tests := []struct {
		name      string
		ingresses []*networkingv1.Ingress
		classes   []*networkingv1.IngressClass
		want      map[string]string
	}{
		{
			name: "fewest bound, ties by name, counting this pass",
			ingresses: []*networkingv1.Ingress{
				ingress("app", "bound", 0, "", nil, v1alpha1.AnnotationGroup, "e/g-a"),
				sel("s1", 1, "tier=edge"), sel("s2", 2, "tier=edge"), sel("s3", 3, "tier=edge"), sel("s4", 4, "tier=edge"),
			},
			want: map[string]string{"app/s1": "e/g-b", "app/s2": "e/g-c", "app/s3": "e/g-a", "app/s4": "e/g-b"},
		},
		{
			name:      "selector matching one group; none matching; bad selector",
			ingresses: []*networkingv1.Ingress{sel("x", 1, "tier=internal"), sel("none", 2, "tier=gold"), sel("bad", 3, "a in (")},
			want:      map[string]string{"app/x": "e/g-x"},
		},
		{
			name: "selector from the IngressClass",
			classes: []*networkingv1.IngressClass{{ObjectMeta: meta("", "sched", 0, v1alpha1.AnnotationGroupSelector, "tier=internal"),
				Spec: networkingv1.IngressClassSpec{Controller: v1alpha1.ControllerName}}},
			ingresses: []*networkingv1.Ingress{func() *networkingv1.Ingress {
				i := ingress("app", "c", 1, "", nil)
				i.Spec.IngressClassName = ptr("sched")
				return i
			}()},
			want: map[string]string{"app/c": "e/g-x"},
		},
		{
			name: "already bound (sticky), even to a group that no longer matches or exists",
			ingresses: []*networkingv1.Ingress{
				ingress("app", "a", 1, "", nil, v1alpha1.AnnotationGroup, "e/g-x", v1alpha1.AnnotationGroupSelector, "tier=edge"),
				ingress("app", "b", 2, "", nil, v1alpha1.AnnotationGroup, "e/gone", v1alpha1.AnnotationGroupSelector, "tier=edge"),
			},
			want: map[string]string{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := State{Ingresses: tc.ingresses, IngressClasses: tc.classes, Services: groups}
			_, bindings, _ := Build(st, Options{})
			got := Schedule(tc.ingresses, bindings, groups)
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("bindings (-want +got):\n%s", d)
			}
		})
	}
}
