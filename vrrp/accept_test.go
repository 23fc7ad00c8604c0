package vrrp

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// counterValue reads one series of a counter vector.
func counterValue(t *testing.T, c *prometheus.CounterVec, labels ...string) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.WithLabelValues(labels...).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestAcceptCountsEveryRejection drives the receive path without sockets: each
// bad advert is skipped, counted under its reason and logged.
func TestAcceptCountsEveryRejection(t *testing.T) {
	met, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	a := &Announcer{cfg: Config{Interface: "eth0"}, log: zap.New(core), met: met,
		byVRID: map[vridKey]*instance{}, rejectLog: newLimiter(time.Nanosecond)}
	vip := a4("10.0.0.100")
	for _, ic := range []InstanceConfig{
		{Name: "open", VRID: 1, Version: 3, Priority: 100, AdvertInterval: Duration{time.Second}, VIPs: []netip.Addr{vip}},
		{Name: "peers", VRID: 2, Version: 3, Priority: 100, AdvertInterval: Duration{time.Second}, VIPs: []netip.Addr{vip}, Peers: []netip.Addr{a4("10.0.0.3")}},
		{Name: "legacy", VRID: 3, Version: 2, Priority: 100, AdvertInterval: Duration{time.Second}, VIPs: []netip.Addr{vip}},
	} {
		a.byVRID[vridKey{true, ic.VRID}] = newInstance(a, ic, true, a4("10.0.0.1"))
	}
	src := a4("10.0.0.2")
	pkt := func(adv Advert, from netip.Addr, ttl int) received {
		if adv.Addrs == nil {
			adv.Addrs = []netip.Addr{vip}
		}
		b, err := Encode(adv, from, GroupIPv4)
		if err != nil {
			t.Fatal(err)
		}
		return received{payload: b, src: from, dst: GroupIPv4, hopLimit: ttl}
	}
	v3 := func(vrid uint8) Advert {
		return Advert{Version: 3, VRID: vrid, Priority: 50, Interval: time.Second}
	}
	cases := []struct {
		name string
		r    received
		want Reason // "" for accepted
	}{
		{"good", pkt(v3(1), src, 255), ""},
		{"ttl", pkt(v3(1), src, 64), ReasonTTL},
		{"garbage", received{payload: []byte{1, 2, 3}, src: src, dst: GroupIPv4, hopLimit: 255}, ReasonShort},
		{"unknown vrid", pkt(v3(9), src, 255), ReasonVRID},
		{"not a peer", pkt(v3(2), src, 255), ReasonPeer},
		{"a peer", pkt(v3(2), a4("10.0.0.3"), 255), ""},
		{"version differs", pkt(Advert{Version: 2, VRID: 1, Priority: 50, Interval: time.Second}, src, 255), ReasonMismatch},
		{"v2 interval differs", pkt(Advert{Version: 2, VRID: 3, Priority: 50, Interval: 2 * time.Second}, src, 255), ReasonMismatch},
		{"other vips", pkt(Advert{Version: 3, VRID: 1, Priority: 50, Interval: time.Second, Addrs: []netip.Addr{a4("10.0.0.200")}}, src, 255), ReasonAddrs},
		// Our router while its addresses change: accepted, counted as a mismatch.
		{"vips changing", pkt(Advert{Version: 3, VRID: 1, Priority: 50, Interval: time.Second, Addrs: []netip.Addr{a4("10.0.0.101"), vip}}, src, 255), ""},
		{"v2 vips changing", pkt(Advert{Version: 2, VRID: 3, Priority: 50, Interval: time.Second, Addrs: []netip.Addr{a4("10.0.0.101"), vip}}, src, 255), ReasonAddrs},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := map[Reason]float64{}
			for _, r := range Reasons {
				before[r] = counterValue(t, met.advertsRejected, string(r))
			}
			logsBefore := logs.Len()
			in, ev, ok := a.accept(tc.r, true)
			if tc.want == "" {
				if !ok || in == nil || ev.src != tc.r.src {
					t.Fatalf("accept = %v, %+v, %v; want accepted", in, ev, ok)
				}
				return
			}
			if ok {
				t.Fatalf("accepted, want rejected for %s", tc.want)
			}
			for _, r := range Reasons {
				got := counterValue(t, met.advertsRejected, string(r)) - before[r]
				want := 0.0
				if r == tc.want {
					want = 1
				}
				if got != want {
					t.Errorf("rejected{reason=%q} grew by %v, want %v", r, got, want)
				}
			}
			if logs.Len() != logsBefore+1 {
				t.Errorf("%d log lines for the rejection, want 1", logs.Len()-logsBefore)
			}
		})
	}
	if got := counterValue(t, met.advertsReceived, "open"); got != 2 {
		t.Errorf("received{open} = %v, want 2", got)
	}
	if got := counterValue(t, met.addressMismatch, "open"); got != 1 {
		t.Errorf("address_mismatch{open} = %v, want 1", got)
	}
}

// TestAdvertDestinations: a peer list shared by every node names this node too;
// adverts go to the other peers only. Without peers, to the group.
func TestAdvertDestinations(t *testing.T) {
	met, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	a := &Announcer{cfg: Config{Interface: "eth0"}, log: zap.NewNop(), met: met}
	ic := InstanceConfig{Name: "x", VRID: 1, Version: 3, Priority: 100, AdvertInterval: Duration{time.Second}, VIPs: []netip.Addr{a4("10.0.0.100")}}
	if got := newInstance(a, ic, true, a4("10.0.0.1")).dsts; !slices.Equal(got, []netip.Addr{GroupIPv4}) {
		t.Errorf("destinations without peers = %v, want the group", got)
	}
	ic.Peers = []netip.Addr{a4("10.0.0.3"), a4("10.0.0.1"), a4("10.0.0.2")}
	if got, want := newInstance(a, ic, true, a4("10.0.0.1")).dsts, []netip.Addr{a4("10.0.0.3"), a4("10.0.0.2")}; !slices.Equal(got, want) {
		t.Errorf("destinations = %v, want %v (the peers but our own address)", got, want)
	}
	ic6 := InstanceConfig{Name: "y", VRID: 1, Version: 3, Priority: 100, AdvertInterval: Duration{time.Second}, VIPs: []netip.Addr{a4("2001:db8::100")}}
	if got := newInstance(a, ic6, false, a4("fe80::1")).dsts; !slices.Equal(got, []netip.Addr{GroupIPv6}) {
		t.Errorf("IPv6 destinations without peers = %v, want the group", got)
	}
}

func TestSameAddrs(t *testing.T) {
	sorted := []netip.Addr{a4("10.0.0.100"), a4("10.0.0.101")}
	for _, tc := range []struct {
		got  []netip.Addr
		want bool
	}{
		{[]netip.Addr{a4("10.0.0.101"), a4("10.0.0.100")}, true},
		{[]netip.Addr{a4("10.0.0.100"), a4("10.0.0.101")}, true},
		{[]netip.Addr{a4("10.0.0.100"), a4("10.0.0.100")}, false},
		{[]netip.Addr{a4("10.0.0.100")}, false},
		{[]netip.Addr{a4("10.0.0.100"), a4("10.0.0.102")}, false},
	} {
		if got := sameAddrs(slices.Clone(tc.got), sorted); got != tc.want {
			t.Errorf("sameAddrs(%v, %v) = %v, want %v", tc.got, sorted, got, tc.want)
		}
	}
}

// TestSetPeersInPlace: a router's peers change while it runs (an edge joins or
// leaves the group): adverts go to the new peers, only they are accepted, and
// no peers at all is multicast from anyone; the state machine is untouched.
func TestSetPeersInPlace(t *testing.T) {
	met, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	a := &Announcer{cfg: Config{Interface: "eth0"}, log: zap.NewNop(), met: met, byVRID: map[vridKey]*instance{}, rejectLog: newLimiter(time.Second)}
	vip := a4("10.0.0.100")
	ic := InstanceConfig{Name: "x", VRID: 1, Version: 3, Priority: 100, AdvertInterval: Duration{time.Second},
		VIPs: []netip.Addr{vip}, Peers: []netip.Addr{a4("10.0.0.1"), a4("10.0.0.2")}}
	a.cfg.Instances = []InstanceConfig{ic}
	a.cfg.SetDefaults()
	ic = a.cfg.Instances[0]
	in := newInstance(a, ic, true, a4("10.0.0.1"))
	a.insts, a.byVRID[vridKey{true, 1}] = []*instance{in}, in
	accepted := func(from string) bool {
		b, err := Encode(Advert{Version: 3, VRID: 1, Priority: 50, Interval: time.Second, Addrs: []netip.Addr{vip}}, a4(from), GroupIPv4)
		if err != nil {
			t.Fatal(err)
		}
		_, _, ok := a.accept(received{payload: b, src: a4(from), dst: GroupIPv4, hopLimit: 255}, true)
		return ok
	}
	state := in.m.State()
	set := func(peers ...netip.Addr) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- a.SetPeers(t.Context(), "x", peers) }()
		select {
		case ev := <-in.events:
			in.handle(ev) // the run goroutine's part
		case err := <-done:
			t.Fatalf("SetPeers(%v): %v", peers, err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if !accepted("10.0.0.2") || accepted("10.0.0.3") {
		t.Fatal("before: want 10.0.0.2 accepted and 10.0.0.3 refused")
	}
	set(a4("10.0.0.1"), a4("10.0.0.3"))
	if accepted("10.0.0.2") || !accepted("10.0.0.3") {
		t.Error("after SetPeers(.1, .3): want 10.0.0.2 refused and 10.0.0.3 accepted")
	}
	if want := []netip.Addr{a4("10.0.0.3")}; !slices.Equal(in.dsts, want) {
		t.Errorf("destinations %v, want %v", in.dsts, want)
	}
	set()
	if !accepted("10.0.0.9") || !slices.Equal(in.dsts, []netip.Addr{GroupIPv4}) {
		t.Errorf("without peers: destinations %v, want the group, and any source accepted", in.dsts)
	}
	if in.m.State() != state {
		t.Errorf("state %v after SetPeers, want %v unchanged", in.m.State(), state)
	}
	if err := a.SetPeers(t.Context(), "x", []netip.Addr{a4("2001:db8::1")}); err == nil {
		t.Error("SetPeers accepted a global IPv6 peer for an IPv4 router")
	}
}
