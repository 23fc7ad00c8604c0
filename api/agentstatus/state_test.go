package agentstatus

import (
	"net/netip"
	"slices"
	"testing"
)

func TestOwners(t *testing.T) {
	states := []State{
		{Node: "a", Group: "edge/web", VRRP: map[string]string{"edge/web/v4": "master", "edge/web/v6": "backup"}},
		{Node: "b", Group: "edge/web", VRRP: map[string]string{"edge/web/v4": "backup", "edge/web/v6": "master"}},
		{Node: "c", Group: "edge/api", VRRP: map[string]string{"edge/api/v4": "master"}},
		{Node: "d", Group: "edge/web", VRRP: map[string]string{"edge/web/v4": "master"}},
	}
	for _, tc := range []struct {
		group, vip string
		want       []string
	}{
		{"edge/web", "192.0.2.10", []string{"a", "d"}},
		{"edge/web", "2001:db8::10", []string{"b"}},
		{"edge/api", "192.0.2.20", []string{"c"}},
		{"edge/api", "2001:db8::20", nil},
	} {
		if got := Owners(states, tc.group, netip.MustParseAddr(tc.vip)); !slices.Equal(got, tc.want) {
			t.Errorf("owners of %s in %s = %v, want %v", tc.vip, tc.group, got, tc.want)
		}
	}
}
