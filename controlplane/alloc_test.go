package controlplane

import (
	"net/netip"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
)

func TestParsePool(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    Pool
		wantErr bool
	}{
		{"plain", "192.0.2.0/24", Pool{CIDR: netip.MustParsePrefix("192.0.2.0/24")}, false},
		{"masked", "192.0.2.7/24", Pool{CIDR: netip.MustParsePrefix("192.0.2.0/24")}, false},
		{"exclusions", "2001:db8::/120!2001:db8::1, 2001:db8::80/121", Pool{CIDR: netip.MustParsePrefix("2001:db8::/120"),
			Exclude: []netip.Prefix{netip.MustParsePrefix("2001:db8::1/128"), netip.MustParsePrefix("2001:db8::80/121")}}, false},
		{"bad cidr", "192.0.2.0", Pool{}, true},
		{"bad exclusion", "192.0.2.0/24!nope", Pool{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParsePool(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if err == nil {
				if d := cmp.Diff(tc.want, got, cmpAddrs); d != "" {
					t.Errorf("(-want +got):\n%s", d)
				}
				// String gives what the agent's -vip-pool reads back as the same pool.
				again, err := ParsePool(got.String())
				if err != nil {
					t.Fatalf("ParsePool(%q): %v", got.String(), err)
				}
				if d := cmp.Diff(got, again, cmpAddrs); d != "" {
					t.Errorf("ParsePool(%q) (-parsed +reparsed):\n%s", got.String(), d)
				}
			}
		})
	}
}

func mustPool(t *testing.T, s string) Pool {
	t.Helper()
	p, err := ParsePool(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAllocateVIPs(t *testing.T) {
	tests := []struct {
		name     string
		services []*corev1.Service
		nodes    []*corev1.Node
		pools    []string
		want     map[string][]netip.Addr
		problems []model.Problem
	}{
		{
			name:     "lowest free, oldest first, skipping network, broadcast, exclusions and manual VIPs",
			services: []*corev1.Service{groupSvc("e", "c", 3), groupSvc("e", "b", 2), groupSvc("e", "manual", 1, v1alpha1.AnnotationVIP, "192.0.2.2"), groupSvc("e", "d", 4)},
			pools:    []string{"192.0.2.0/29!192.0.2.1"},
			want:     map[string][]netip.Addr{"e/b": addrs("192.0.2.3"), "e/c": addrs("192.0.2.4"), "e/d": addrs("192.0.2.5")},
		},
		{
			name:     "pool exhausted: reported, the next family still served",
			services: []*corev1.Service{groupSvc("e", "a", 1), groupSvc("e", "b", 2)},
			pools:    []string{"192.0.2.0/30", "2001:db8::/127"},
			want:     map[string][]netip.Addr{"e/a": addrs("192.0.2.1", "2001:db8::1"), "e/b": addrs("192.0.2.2")},
			problems: []model.Problem{{Object: "Service e/b", Field: "metadata.annotations[portico.io/vip]", Reason: model.ReasonVIPPoolExhausted}},
		},
		{
			name:     "second pool of a family when the first is full; /31, /32 and /128 use every address",
			services: []*corev1.Service{groupSvc("e", "a", 1), groupSvc("e", "b", 2), groupSvc("e", "c", 3)},
			pools:    []string{"192.0.2.8/31", "198.51.100.7/32", "2001:db8::7/128"},
			want: map[string][]netip.Addr{"e/a": addrs("192.0.2.8", "2001:db8::7"), "e/b": addrs("192.0.2.9"),
				"e/c": addrs("198.51.100.7")},
			problems: []model.Problem{
				{Object: "Service e/b", Field: "metadata.annotations[portico.io/vip]", Reason: model.ReasonVIPPoolExhausted},
				{Object: "Service e/c", Field: "metadata.annotations[portico.io/vip]", Reason: model.ReasonVIPPoolExhausted},
			},
		},
		{
			name: "groups with any VIP annotation (even invalid, or the ingress-vip alias) and non-groups are left alone",
			services: []*corev1.Service{groupSvc("e", "bad", 1, v1alpha1.AnnotationVIP, "nope"), groupSvc("e", "alias", 2, v1alpha1.AnnotationVIPAlias, "192.0.2.1"),
				backendSvc("e", "plain", sport("http", 80)), groupSvc("e", "new", 3)},
			pools: []string{"192.0.2.0/29"},
			want:  map[string][]netip.Addr{"e/new": addrs("192.0.2.2")},
		},
		{
			name: "L4 Services are allocated like groups, oldest first; other LoadBalancer classes are not",
			services: func() []*corev1.Service {
				lb := func(name string, age int, class string) *corev1.Service {
					s := backendSvc("app", name, sport("x", 53))
					s.ObjectMeta = meta("app", name, age)
					s.Spec.Type = corev1.ServiceTypeLoadBalancer
					s.Spec.LoadBalancerClass = ptr(class)
					return s
				}
				return []*corev1.Service{lb("dns", 2, v1alpha1.LoadBalancerClass), groupSvc("e", "g", 1), lb("other", 3, "example.com/lb")}
			}(),
			pools: []string{"192.0.2.0/29"},
			want:  map[string][]netip.Addr{"e/g": addrs("192.0.2.1"), "app/dns": addrs("192.0.2.2")},
		},
		{
			name:     "a node's address is never handed out",
			services: []*corev1.Service{groupSvc("e", "a", 1)},
			nodes: []*corev1.Node{{ObjectMeta: meta("", "n1", 0), Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: "192.0.2.1"}, {Type: corev1.NodeHostName, Address: "n1"}}}}},
			pools: []string{"192.0.2.0/29"},
			want:  map[string][]netip.Addr{"e/a": addrs("192.0.2.2")},
		},
		{
			name:     "no pools: nothing allocated, nothing reported",
			services: []*corev1.Service{groupSvc("e", "a", 1)},
			want:     map[string][]netip.Addr{},
		},
		{
			name:     "large IPv6 exclusion is skipped at once",
			services: []*corev1.Service{groupSvc("e", "a", 1)},
			pools:    []string{"2001:db8::/64!2001:db8::/65"},
			want:     map[string][]netip.Addr{"e/a": addrs("2001:db8::8000:0:0:0")},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var pools []Pool
			for _, p := range tc.pools {
				pools = append(pools, mustPool(t, p))
			}
			got, problems := AllocateVIPs(tc.services, tc.nodes, Pools{List: pools})
			if d := cmp.Diff(tc.want, got, cmpAddrs); d != "" {
				t.Errorf("allocations (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.problems, problems, ignoreDetail, cmpopts.EquateEmpty()); d != "" {
				t.Errorf("problems (-want +got):\n%s", d)
			}
		})
	}
}

func TestAllocateVRIDs(t *testing.T) {
	full := make([]*corev1.Service, 0, 256)
	for i := 1; i <= 255; i++ {
		full = append(full, groupSvc("e", "g"+string(rune('a'+i%26))+strconv.Itoa(i), i, v1alpha1.AnnotationVRID, strconv.Itoa(i)))
	}
	full = append(full, groupSvc("e", "late", 300))
	tests := []struct {
		name     string
		services []*corev1.Service
		want     map[string]uint8
		problems []model.Problem
	}{
		{
			name:     "lowest free, oldest first, manual ids kept, invalid ones not replaced",
			services: []*corev1.Service{groupSvc("e", "b", 2), groupSvc("e", "a", 1), groupSvc("e", "m", 0, v1alpha1.AnnotationVRID, "1"), groupSvc("e", "bad", 0, v1alpha1.AnnotationVRID, "300")},
			want:     map[string]uint8{"e/a": 2, "e/b": 3},
		},
		{
			name:     "exhausted",
			services: full,
			want:     map[string]uint8{},
			problems: []model.Problem{{Object: "Service e/late", Field: "metadata.annotations[portico.io/vrid]", Reason: model.ReasonVRIDExhausted}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, problems := AllocateVRIDs(tc.services)
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("allocations (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.problems, problems, ignoreDetail, cmpopts.EquateEmpty()); d != "" {
				t.Errorf("problems (-want +got):\n%s", d)
			}
		})
	}
}
