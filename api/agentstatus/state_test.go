package agentstatus

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
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

// XDPAttachMode is optional on the wire: a report without it (an older agent)
// reads as empty, and an empty one is left out, so older readers see the
// same JSON as before.
func TestXDPAttachModeOptional(t *testing.T) {
	var st State
	if err := json.Unmarshal([]byte(`{"node":"a","group":"edge/web","healthy":true,"vrrp":{},"vips":[]}`), &st); err != nil {
		t.Fatal(err)
	}
	if st.XDPAttachMode != "" {
		t.Errorf("mode %q from a report without one", st.XDPAttachMode)
	}
	b, err := json.Marshal(State{Node: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "xdpAttachMode") {
		t.Errorf("a state without a mode is written with one: %s", b)
	}
	b, err = json.Marshal(State{Node: "a", XDPAttachMode: "generic"})
	if err != nil {
		t.Fatal(err)
	}
	var back State
	if err := json.Unmarshal(b, &back); err != nil || back.XDPAttachMode != "generic" || !strings.Contains(string(b), `"xdpAttachMode":"generic"`) {
		t.Errorf("written %s, read back mode %q (%v)", b, back.XDPAttachMode, err)
	}
}
