package controlplane

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/portico-edge/portico/api/agentstatus"
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
		loads     map[string]GroupLoad
		want      map[string]string
		reasons   map[string]string // a part of the Event's message, by Ingress
	}{
		{
			name: "fewest bound, ties by name, counting this pass",
			ingresses: []*networkingv1.Ingress{
				ingress("app", "bound", 0, "", nil, v1alpha1.AnnotationGroup, "e/g-a"),
				sel("s1", 1, "tier=edge"), sel("s2", 2, "tier=edge"), sel("s3", 3, "tier=edge"), sel("s4", 4, "tier=edge"),
			},
			want:    map[string]string{"app/s1": "e/g-b", "app/s2": "e/g-c", "app/s3": "e/g-a", "app/s4": "e/g-b"},
			reasons: map[string]string{"app/s1": "no load reported), and the fewest bound Ingresses among the matches (0 against 0)"},
		},
		{
			// g-a is busiest by CPU though it has no Ingress; g-b and g-c are
			// equal by CPU (within a step), and g-c serves fewer requests.
			name: "most headroom first, Ingress counts only as the tie-break",
			ingresses: []*networkingv1.Ingress{
				ingress("app", "bound1", 0, "", nil, v1alpha1.AnnotationGroup, "e/g-c"),
				ingress("app", "bound2", 0, "", nil, v1alpha1.AnnotationGroup, "e/g-c"),
				sel("s1", 1, "tier=edge"),
			},
			loads: map[string]GroupLoad{
				"e/g-a": {Edges: 2, Load: agentstatus.Load{NginxCPU: 2, Cores: 4, Requests: 100}},
				"e/g-b": {Edges: 2, Load: agentstatus.Load{NginxCPU: 0.1, Cores: 4, Requests: 900}},
				"e/g-c": {Edges: 2, Load: agentstatus.Load{NginxCPU: 0.12, Cores: 4, Requests: 20}},
			},
			want:    map[string]string{"app/s1": "e/g-c"},
			reasons: map[string]string{"app/s1": "the most headroom among the matches (nginx CPU 3% of 4 cores, 10 requests/s, 0 KiB/s and 0 new connections/s per edge (2 edges); next, group e/g-b: nginx CPU 2% of 4 cores, 450 requests/s"},
		},
		{
			name:      "a group without a measurement after the measured ones",
			ingresses: []*networkingv1.Ingress{sel("s1", 1, "tier=edge")},
			loads:     map[string]GroupLoad{"e/g-c": {Edges: 1, Load: agentstatus.Load{NginxCPU: 0.9, Cores: 1}}},
			want:      map[string]string{"app/s1": "e/g-c"},
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
			got := map[string]string{}
			for _, s := range Schedule(tc.ingresses, bindings, groups, tc.loads) {
				got[s.Ingress] = s.Group
				if want, ok := tc.reasons[s.Ingress]; ok && !strings.Contains(s.Reason, want) {
					t.Errorf("%s: reason %q, want it to say %q", s.Ingress, s.Reason, want)
				}
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("bindings (-want +got):\n%s", d)
			}
		})
	}
}
