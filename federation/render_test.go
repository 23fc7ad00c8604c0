package federation

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
)

func fixture() *v1alpha1.FederatedIngress {
	prefix := networkingv1.PathTypePrefix
	return &v1alpha1.FederatedIngress{
		ObjectMeta: metav1.ObjectMeta{Name: "shop", Namespace: "web", Generation: 3},
		Spec: v1alpha1.FederatedIngressSpec{
			Template: v1alpha1.IngressTemplate{
				Metadata: v1alpha1.IngressTemplateMeta{Annotations: map[string]string{"portico.io/affinity": "cookie", "team": "a"}},
				Spec: networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{{
					Host: "shop.example.com",
					IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{Paths: []networkingv1.HTTPIngressPath{{
						Path: "/", PathType: &prefix,
						Backend: networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: "shop", Port: networkingv1.ServiceBackendPort{Number: 80}}},
					}}}},
				}}},
			},
			Placement: v1alpha1.Placement{Clusters: []string{"a", "b", "c"}},
		},
	}
}

func TestMemberIngress(t *testing.T) {
	tests := []struct {
		name      string
		overrides []v1alpha1.ClusterOverride
		policy    v1alpha1.HealthPolicy
		cluster   string
		check     func(t *testing.T, ing *networkingv1.Ingress)
		wantErr   string
	}{
		{
			name: "template only", cluster: "a",
			check: func(t *testing.T, ing *networkingv1.Ingress) {
				want := map[string]string{"portico.io/affinity": "cookie", "team": "a", v1alpha1.AnnotationFederationGeneration: "3"}
				if diff := cmp.Diff(want, ing.Annotations); diff != "" {
					t.Errorf("annotations (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(map[string]string{v1alpha1.LabelFederatedIngress: "shop"}, ing.Labels); diff != "" {
					t.Errorf("labels (-want +got):\n%s", diff)
				}
				if ing.Name != "shop" || ing.Namespace != "web" || ing.Spec.Rules[0].Host != "shop.example.com" {
					t.Errorf("got %s/%s host %s", ing.Namespace, ing.Name, ing.Spec.Rules[0].Host)
				}
			},
		},
		{
			name: "override for this cluster: a host changed, an annotation deleted, a label added", cluster: "c",
			overrides: []v1alpha1.ClusterOverride{
				{Cluster: "b", Patch: json.RawMessage(`{"spec":{"ingressClassName":"other"}}`)},
				{Cluster: "c", Patch: json.RawMessage(`{"metadata":{"annotations":{"team":null},"labels":{"site":"c"}}}`)},
				{Cluster: "c", Patch: json.RawMessage(`{"spec":{"rules":[{"host":"c.shop.example.com","http":{"paths":[{"path":"/","pathType":"Prefix","backend":{"service":{"name":"shop-c","port":{"number":8080}}}}]}}]}}`)},
			},
			check: func(t *testing.T, ing *networkingv1.Ingress) {
				if _, ok := ing.Annotations["team"]; ok {
					t.Errorf("annotation team not deleted: %v", ing.Annotations)
				}
				if ing.Labels["site"] != "c" || ing.Labels[v1alpha1.LabelFederatedIngress] != "shop" {
					t.Errorf("labels %v", ing.Labels)
				}
				if ing.Spec.IngressClassName != nil {
					t.Errorf("cluster b's override reached c")
				}
				b := ing.Spec.Rules[0].HTTP.Paths[0].Backend.Service
				if ing.Spec.Rules[0].Host != "c.shop.example.com" || b.Name != "shop-c" || b.Port.Number != 8080 {
					t.Errorf("rules not overridden: %+v", ing.Spec.Rules)
				}
			},
		},
		{
			name: "the generation annotation cannot be overridden", cluster: "a",
			overrides: []v1alpha1.ClusterOverride{{Cluster: "a", Patch: json.RawMessage(`{"metadata":{"annotations":{"portico.io/federation-generation":"99"}}}`)}},
			check: func(t *testing.T, ing *networkingv1.Ingress) {
				if ing.Annotations[v1alpha1.AnnotationFederationGeneration] != "3" {
					t.Errorf("generation annotation %q", ing.Annotations[v1alpha1.AnnotationFederationGeneration])
				}
			},
		},
		{
			name: "health policy All travels as an annotation", cluster: "a", policy: v1alpha1.HealthAll,
			check: func(t *testing.T, ing *networkingv1.Ingress) {
				if ing.Annotations["portico.io/federation-health"] != "All" {
					t.Errorf("annotations %v", ing.Annotations)
				}
			},
		},
		{
			name: "the policy wins over a template's annotation", cluster: "a",
			overrides: []v1alpha1.ClusterOverride{{Cluster: "a", Patch: json.RawMessage(`{"metadata":{"annotations":{"portico.io/federation-health":"All"}}}`)}},
			check: func(t *testing.T, ing *networkingv1.Ingress) {
				if v, ok := ing.Annotations["portico.io/federation-health"]; ok {
					t.Errorf("policy Any, annotation %q", v)
				}
			},
		},
		{
			name: "misspelled field", cluster: "a",
			overrides: []v1alpha1.ClusterOverride{{Cluster: "a", Patch: json.RawMessage(`{"spec":{"ingresClassName":"x"}}`)}},
			wantErr:   "not an Ingress",
		},
		{
			name: "wrong type", cluster: "a",
			overrides: []v1alpha1.ClusterOverride{{Cluster: "a", Patch: json.RawMessage(`{"spec":{"rules":"all"}}`)}},
			wantErr:   "not an Ingress",
		},
		{
			name: "renames the Ingress", cluster: "a",
			overrides: []v1alpha1.ClusterOverride{{Cluster: "a", Patch: json.RawMessage(`{"metadata":{"name":"other"}}`)}},
			wantErr:   "may not change",
		},
		{
			name: "not JSON", cluster: "a",
			overrides: []v1alpha1.ClusterOverride{{Cluster: "a", Patch: json.RawMessage(`{"spec":`)}},
			wantErr:   "merge patch",
		},
		{
			name: "a bad override of another cluster does not matter", cluster: "b",
			overrides: []v1alpha1.ClusterOverride{{Cluster: "a", Patch: json.RawMessage(`{"metadata":{"name":"other"}}`)}},
			check:     func(t *testing.T, ing *networkingv1.Ingress) {},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fi := fixture()
			fi.Spec.Overrides = tc.overrides
			fi.Spec.Policy.Health = tc.policy
			ing, err := MemberIngress(fi, tc.cluster)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			u, err := applyObject(ing)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := u.Object["status"]; ok {
				t.Error("applied object carries a status")
			}
			if _, ok := u.Object["metadata"].(map[string]any)["creationTimestamp"]; ok {
				t.Error("applied object carries a creationTimestamp")
			}
			tc.check(t, ing)
			again, err := MemberIngress(fi, tc.cluster)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(ing, again); diff != "" {
				t.Errorf("not deterministic (-first +second):\n%s", diff)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name     string
		clusters []string
		override string
		health   v1alpha1.HealthPolicy
		policy   func(*v1alpha1.FederationPolicy)
		wantErr  string
	}{
		{name: "fine", clusters: []string{"a", "b"}},
		{name: "no clusters", wantErr: "empty"},
		{name: "twice", clusters: []string{"a", "a"}, wantErr: "twice"},
		{name: "bad name", clusters: []string{"Site_A"}, wantErr: "Site_A"},
		{name: "override without cluster", clusters: []string{"a"}, override: "-", wantErr: "overrides[0].cluster"},
		{name: "unknown health policy", clusters: []string{"a"}, health: "Most", wantErr: "spec.policy.health"},
		{name: "site policies", clusters: []string{"a", "b"}, policy: func(p *v1alpha1.FederationPolicy) {
			p.AnycastVIP, p.OverflowLimitPercent = "192.0.2.80", 40
			p.Sites = []v1alpha1.SitePolicy{{Cluster: "a", Capacity: 100, OverflowTo: "b"}, {Cluster: "b", Capacity: 100, OverflowTo: "a"}}
		}},
		{name: "bad anycast VIP", clusters: []string{"a"}, policy: func(p *v1alpha1.FederationPolicy) { p.AnycastVIP = "192.0.2" }, wantErr: "anycastVIP"},
		{name: "limit too high", clusters: []string{"a"}, policy: func(p *v1alpha1.FederationPolicy) { p.OverflowLimitPercent = 95 }, wantErr: "overflowLimitPercent"},
		{name: "site not placed", clusters: []string{"a", "b"}, policy: func(p *v1alpha1.FederationPolicy) {
			p.Sites = []v1alpha1.SitePolicy{{Cluster: "c", Capacity: 100, OverflowTo: "b"}}
		}, wantErr: "not placed"},
		{name: "overflow to itself", clusters: []string{"a", "b"}, policy: func(p *v1alpha1.FederationPolicy) {
			p.Sites = []v1alpha1.SitePolicy{{Cluster: "a", Capacity: 100, OverflowTo: "a"}}
		}, wantErr: "overflowTo"},
		{name: "no capacity", clusters: []string{"a", "b"}, policy: func(p *v1alpha1.FederationPolicy) {
			p.Sites = []v1alpha1.SitePolicy{{Cluster: "a", OverflowTo: "b"}}
		}, wantErr: "capacity"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fi := fixture()
			fi.Spec.Placement.Clusters = tc.clusters
			if tc.override != "" {
				fi.Spec.Overrides = []v1alpha1.ClusterOverride{{Patch: json.RawMessage(`{}`)}}
			}
			fi.Spec.Policy.Health = tc.health
			if tc.policy != nil {
				tc.policy(&fi.Spec.Policy)
			}
			err := Validate(fi)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
			}
		})
	}
}
