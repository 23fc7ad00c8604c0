package main

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/portico-edge/portico/dataplane"
)

func TestPrintTrace(t *testing.T) {
	be := func(a string, id uint32) dataplane.TraceBackend {
		return dataplane.TraceBackend{ID: id, Addr: netip.MustParseAddr(a)}
	}
	down := be("10.0.0.13", 3)
	down.Down = true
	tr := dataplane.Trace{
		Flow: dataplane.Flow{Src: netip.MustParseAddr("10.0.0.100"), SPort: 40000, Dst: netip.MustParseAddr("10.0.0.200"), DPort: 80, Protocol: 6},
		VIP:  true, VIPID: 0, Hash: 0xabc, Slot: 7, Moved: true, Transition: 90 * time.Second,
		Rings: []dataplane.TraceRing{{Ring: "previous", Backend: down}, {Ring: "current", Backend: be("10.0.0.12", 2)}, {Ring: "mid 1", Backend: dataplane.TraceBackend{ID: 9, Removed: true}},
			{Ring: "mid 2", Backend: dataplane.TraceBackend{ID: 4, Addr: netip.MustParseAddr("10.0.0.14"), Removed: true}}},
		Pinned: &dataplane.TracePin{Backend: be("10.0.0.12", 2), Hop: dataplane.PinGuess, Seen: time.Second},
	}
	var b strings.Builder
	if err := printTrace(&b, tr); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"tcp 10.0.0.100:40000 -> 10.0.0.200:80", "slot 7, moved: yes", "1m30s more",
		"previous  10.0.0.13", "down", "current   10.0.0.12", "serving", "id 9 (gone)", "mid 2     10.0.0.14    removed (id 4)", "a director's guess", "new_pins  (none)"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	b.Reset()
	if err := printTrace(&b, dataplane.Trace{Flow: tr.Flow}); err != nil || !strings.Contains(b.String(), "not a VIP") {
		t.Errorf("a flow to no VIP: %q, %v", b.String(), err)
	}
}
