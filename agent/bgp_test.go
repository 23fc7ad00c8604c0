package agent

import (
	"context"
	"encoding/json"
	"net/netip"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/portico-edge/portico/api/agentstatus"
	"github.com/portico-edge/portico/bgp"
	"github.com/portico-edge/portico/controlplane/model"
)

// recordedRoutes is a routes that keeps the last announcement (bgp's own tests
// run the real speaker against FRR; this one checks the sink's decisions).
type recordedRoutes struct {
	prefixes []netip.Prefix
	pref     bgp.Preference
	calls    int
}

func (r *recordedRoutes) Announce(p []netip.Prefix, pref bgp.Preference) error {
	r.prefixes, r.pref = p, pref
	r.calls++
	return nil
}

func (r *recordedRoutes) Status() bgp.Status { return bgp.Status{} }

// TestBGPSinkPreference: what a node announces follows its own state: unhealthy
// at start (de-preferenced), healthy (normal), its replica draining
// (de-preferenced), unhealthy (de-preferenced, then withdrawn after
// withdrawAfter), stopping (de-preferenced).
func TestBGPSinkPreference(t *testing.T) {
	vip := netip.MustParseAddr("192.0.2.80")
	self := netip.MustParseAddr("10.0.0.11")
	clock := time.Unix(1000, 0)
	r := &recordedRoutes{}
	var lo []netip.Addr
	b := &bgpSink{group: "edge/web", log: zap.NewNop(), speaker: r, withdrawAfter: 10 * time.Second,
		now:        func() time.Time { return clock },
		setLoVIPs:  func(want, _ []netip.Addr) error { lo = want; return nil },
		localAddrs: func() (func(netip.Addr) bool, error) { return func(a netip.Addr) bool { return a == self }, nil }}
	snap := func(state model.ReplicaState) model.Snapshot {
		return model.Snapshot{Groups: []model.Group{{Name: "edge/web", VIPs: []netip.Addr{vip},
			Replicas: []model.Replica{{Addr: self, State: state}, {Addr: netip.MustParseAddr("10.0.0.12")}}}}}
	}
	ctx := context.Background()
	step := func(name string, want bgp.Preference) {
		t.Helper()
		if r.pref != want || len(r.prefixes) != 1 || r.prefixes[0] != netip.MustParsePrefix("192.0.2.80/32") {
			t.Errorf("%s: announced %v %v, want %v of 192.0.2.80/32", name, r.prefixes, r.pref, want)
		}
	}
	if err := b.Apply(ctx, snap(model.Ready)); err != nil {
		t.Fatal(err)
	}
	if len(lo) != 1 || lo[0] != vip {
		t.Errorf("lo holds %v, want the VIP", lo)
	}
	step("before the first health report", bgp.Depreferenced)
	b.setHealthy(ctx, true)
	step("healthy", bgp.Normal)
	calls := r.calls
	if err := b.Apply(ctx, snap(model.Ready)); err != nil {
		t.Fatal(err)
	}
	if r.calls != calls {
		t.Errorf("the same snapshot announced again")
	}
	if err := b.Apply(ctx, snap(model.Draining)); err != nil {
		t.Fatal(err)
	}
	step("own replica draining", bgp.Depreferenced)
	if err := b.Apply(ctx, snap(model.Ready)); err != nil {
		t.Fatal(err)
	}
	step("drain undone", bgp.Normal)
	b.setHealthy(ctx, false)
	step("unhealthy", bgp.Depreferenced)
	clock = clock.Add(9 * time.Second)
	b.setHealthy(ctx, false) // the health loop repeats itself: the clock keeps running
	b.mu.Lock()
	_ = b.announceLocked()
	b.mu.Unlock()
	step("unhealthy for 9 s", bgp.Depreferenced)
	clock = clock.Add(time.Second)
	b.mu.Lock()
	_ = b.announceLocked()
	b.mu.Unlock()
	step("unhealthy for 10 s", bgp.Withdrawn)
	b.setHealthy(ctx, true)
	step("healthy again", bgp.Normal)
	b.stop()
	step("stopping", bgp.Depreferenced)
}

// siteSink is a bgpSink for the site tests, on a clock the test moves: tick
// moves it and re-evaluates the announcement, as the sink's loop does.
type siteSink struct {
	*bgpSink
	clock time.Time
}

func newSiteSink(r *recordedRoutes) *siteSink {
	s := &siteSink{clock: time.Unix(1000, 0)}
	s.bgpSink = &bgpSink{group: "edge/web", log: zap.NewNop(), speaker: r, withdrawAfter: 10 * time.Second, siteUpAfter: 3 * time.Second,
		now:        func() time.Time { return s.clock },
		setLoVIPs:  func(_, _ []netip.Addr) error { return nil },
		localAddrs: func() (func(netip.Addr) bool, error) { return func(netip.Addr) bool { return false }, nil }}
	return s
}

func (s *siteSink) tick(d time.Duration) {
	s.clock = s.clock.Add(d)
	s.mu.Lock()
	_ = s.announceLocked()
	s.mu.Unlock()
}

// TestBGPSinkSiteHealth: in a federation, a healthy node announces its group's VIPs
// by the site's own health: normal while a federated Ingress of the group has a
// ready backend here; de-preferenced when none has, withdrawn after withdrawAfter;
// de-preferenced for siteUpAfter once one has again, then normal. A group without
// federated Ingresses is never judged by them.
func TestBGPSinkSiteHealth(t *testing.T) {
	vip := netip.MustParseAddr("192.0.2.80")
	r := &recordedRoutes{}
	b := newSiteSink(r)
	ctx := context.Background()
	apply := func(federated map[string]bool) {
		t.Helper()
		snap := model.Snapshot{Groups: []model.Group{{Name: "edge/web", VIPs: []netip.Addr{vip}, Federated: federated}}}
		if err := b.Apply(ctx, snap); err != nil {
			t.Fatal(err)
		}
	}
	step := func(name string, want bgp.Preference) {
		t.Helper()
		if r.pref != want {
			t.Errorf("%s: announced %v, want %v", name, r.pref, want)
		}
	}
	b.setHealthy(ctx, true)
	apply(nil)
	step("no federated ingress", bgp.Normal)
	apply(map[string]bool{"web/shop": true, "web/blog": false})
	step("one of two with a ready backend", bgp.Normal)
	apply(map[string]bool{"web/shop": false, "web/blog": false})
	step("none with a ready backend", bgp.Depreferenced)
	b.tick(9 * time.Second)
	apply(map[string]bool{"web/shop": false, "web/blog": false}) // a resync: the clock keeps running
	step("down for 9 s", bgp.Depreferenced)
	b.tick(time.Second)
	step("down for 10 s", bgp.Withdrawn)
	apply(map[string]bool{"web/shop": true, "web/blog": false})
	step("a backend ready again", bgp.Depreferenced)
	b.tick(2 * time.Second)
	step("up for 2 s", bgp.Depreferenced)
	apply(map[string]bool{"web/shop": false, "web/blog": false})
	step("down again before it counted as up", bgp.Depreferenced)
	b.tick(10 * time.Second)
	step("down for 10 s again", bgp.Withdrawn)
	apply(map[string]bool{"web/shop": true, "web/blog": true})
	b.tick(3 * time.Second)
	step("up for 3 s", bgp.Normal)
	b.setHealthy(ctx, false)
	step("the node unhealthy outranks a healthy site", bgp.Depreferenced)
	b.setHealthy(ctx, true)
	apply(map[string]bool{"web/shop": false})
	b.tick(6 * time.Second)
	b.setHealthy(ctx, false)
	b.tick(4 * time.Second)
	step("site down 10 s, node unhealthy 4 s: one ladder from the earlier cause", bgp.Withdrawn)
}

// TestBGPSinkHandover: a site hand-over is kept up while the site is down and
// renewed as it is announced normally again, before the announcement; node
// health alone never starts one (the site's own replicas have those flows).
func TestBGPSinkHandover(t *testing.T) {
	vip := netip.MustParseAddr("192.0.2.80")
	r := &recordedRoutes{}
	var calls []bgp.Preference // what was announced when the hand-over was renewed
	b := newSiteSink(r)
	b.handover = func() { calls = append(calls, r.pref) }
	ctx := context.Background()
	apply := func(ready bool) {
		t.Helper()
		snap := model.Snapshot{Groups: []model.Group{{Name: "edge/web", VIPs: []netip.Addr{vip}, Federated: map[string]bool{"web/shop": ready}}}}
		if err := b.Apply(ctx, snap); err != nil {
			t.Fatal(err)
		}
	}
	b.setHealthy(ctx, true)
	apply(true)
	b.setHealthy(ctx, false)
	b.tick(time.Second)
	b.setHealthy(ctx, true)
	if len(calls) != 0 {
		t.Fatalf("node health alone renewed a hand-over %d times", len(calls))
	}
	apply(false)
	b.tick(11 * time.Second)
	if r.pref != bgp.Withdrawn || len(calls) < 2 {
		t.Fatalf("site down 11 s: announced %v, hand-over renewed %d times; want withdrawn, renewed while away", r.pref, len(calls))
	}
	apply(true)
	b.tick(3 * time.Second)
	if r.pref != bgp.Normal {
		t.Fatalf("site up 3 s: announced %v", r.pref)
	}
	if last := calls[len(calls)-1]; last == bgp.Normal {
		t.Errorf("the last renewal came after the normal announcement")
	}
	n := len(calls)
	b.tick(time.Second)
	if len(calls) != n {
		t.Errorf("the hand-over was renewed after the site was back")
	}
}

// TestBGPSinkSiteDrain: a site that drains (a planned drain in a federation) is
// de-preferenced, never withdrawn for it, and comes back with a hand-over.
func TestBGPSinkSiteDrain(t *testing.T) {
	vip := netip.MustParseAddr("192.0.2.80")
	r := &recordedRoutes{}
	drain, calls := false, 0
	b := newSiteSink(r)
	b.handover = func() { calls++ }
	withdraw := false
	b.siteDrain = func(time.Time) (bool, bool) { return drain, drain && withdraw }
	ctx := context.Background()
	b.setHealthy(ctx, true)
	if err := b.Apply(ctx, model.Snapshot{Groups: []model.Group{{Name: "edge/web", VIPs: []netip.Addr{vip}}}}); err != nil {
		t.Fatal(err)
	}
	drain = true
	b.tick(time.Second)
	b.tick(30 * time.Second)
	if r.pref != bgp.Depreferenced {
		t.Errorf("draining 31 s: announced %v, want de-preferenced", r.pref)
	}
	withdraw = true
	b.tick(time.Second)
	if r.pref != bgp.Withdrawn {
		t.Errorf("drain grace over: announced %v, want withdrawn", r.pref)
	}
	n := calls
	drain, withdraw = false, false
	b.tick(time.Second)
	if r.pref != bgp.Normal || calls != n+1 {
		t.Errorf("drain over: announced %v, hand-over renewed %d times; want normal, once", r.pref, calls-n)
	}
}

// TestBGPStateWire: the BGP state a node publishes (api/agentstatus) reads as the
// speaker's own status with the node's preference beside it, field for field, so
// readers of the status Lease see what the speaker reports.
func TestBGPStateWire(t *testing.T) {
	up := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name string
		pref bgp.Preference
		st   bgp.Status
	}{
		{"none", bgp.Withdrawn, bgp.Status{}},
		{"sessions and announcements", bgp.Depreferenced, bgp.Status{
			Peers: []bgp.PeerStatus{
				{Addr: netip.MustParseAddr("10.0.0.1"), ASN: 64512, State: "established", EstablishedAt: up, UptimeSeconds: 42, BFD: "up", Received: 3, Accepted: 2},
				{Addr: netip.MustParseAddr("fd00::1"), ASN: 64513, State: "idle"},
			},
			Announced: []bgp.Announcement{
				{Prefix: netip.MustParsePrefix("192.0.2.10/32"), Preference: bgp.Normal},
				{Prefix: netip.MustParsePrefix("2001:db8::10/128"), Preference: bgp.Depreferenced},
			}}},
		{"empty lists", bgp.Normal, bgp.Status{Peers: []bgp.PeerStatus{}, Announced: []bgp.Announcement{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, err := json.Marshal(struct {
				Preference string `json:"preference"`
				bgp.Status
			}{tc.pref.String(), tc.st})
			if err != nil {
				t.Fatal(err)
			}
			got, err := json.Marshal(bgpState(tc.pref, tc.st))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Errorf("published\n%s\nwant\n%s", got, want)
			}
		})
	}
}

// TestBGPPreferenceNames: the speaker's preferences are published by the names
// readers of the status Lease compare with (api/agentstatus).
func TestBGPPreferenceNames(t *testing.T) {
	for p, want := range map[bgp.Preference]string{
		bgp.Withdrawn:     agentstatus.PreferenceWithdrawn,
		bgp.Normal:        agentstatus.PreferenceNormal,
		bgp.Depreferenced: agentstatus.PreferenceDepreferenced,
	} {
		if p.String() != want {
			t.Errorf("preference %d is published as %q, readers look for %q", int(p), p.String(), want)
		}
	}
}
