package vrrp

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// claimMaster is an instance that is Master from t0, its takeover burst begun,
// with announcements counted instead of sent. send, if set, also sees each one.
func claimMaster(t *testing.T, a *Announcer, name string, primary netip.Addr, sent *int, send func()) *instance {
	t.Helper()
	ic := InstanceConfig{Name: name, VRID: 1, Version: 3, Priority: PriorityOwner, AdvertInterval: Duration{time.Second},
		VIPs: []netip.Addr{a4("10.0.0.100")}, GARPCount: 3, GARPSpacing: Duration{50 * time.Millisecond}, GARPRefresh: Duration{10 * time.Second}}
	in := newInstance(a, ic, true, primary)
	in.garp = func(netip.Addr, func(string)) error {
		*sent++
		if send != nil {
			send()
		}
		return nil
	}
	in.m.Start(t0)
	if in.m.State() != StateMaster {
		t.Fatalf("setup: state = %v", in.m.State())
	}
	in.state.Store(uint32(StateMaster))
	in.startBurst(t0)
	return in
}

// step is what the instance goroutine does at now: the pending claim, then any
// announcement due.
func step(in *instance, now time.Time) {
	select {
	case c := <-in.claims:
		in.reannounce(c, now)
	default:
	}
	in.garpDue(now)
}

func claimAnnouncer(t *testing.T) (*Announcer, *observer.ObservedLogs) {
	t.Helper()
	met, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	return &Announcer{cfg: Config{Interface: "eth0"}, log: zap.New(core), met: met}, logs
}

// TestClaimFloodIsBounded: ten claims a millisecond for a second, on the fake
// clock, yield about one announcement per GARPSpacing, not one per claim; every
// claim is counted, one is logged; and a lone claim after a quiet spell is still
// answered at once.
func TestClaimFloodIsBounded(t *testing.T) {
	a, logs := claimAnnouncer(t)
	sent := 0
	in := claimMaster(t, a, "flood", a4("10.0.0.1"), &sent, nil)
	c := claim{vip: a4("10.0.0.100"), mac: net.HardwareAddr{2, 0, 0, 0, 0, 0x99}}
	const claims = 10
	for ms := range 1000 {
		now := at(time.Duration(ms) * time.Millisecond)
		for range claims {
			in.claimed(c, now)
		}
		step(in, now)
	}
	// One round per 50ms GARPSpacing over 1s: 20, plus one for rounding.
	if sent > 21 || sent < 15 {
		t.Errorf("%d announcements for a 1s flood of claims, want about 20 (one per GARPSpacing)", sent)
	}
	if got := counterValue(t, a.met.conflicts, "flood"); got != 1000*claims {
		t.Errorf("conflicts = %v, want %d (every claim)", got, 1000*claims)
	}
	if n := logs.FilterMessage("vip claimed by another station").Len(); n != 1 {
		t.Errorf("%d log lines for the flood, want 1 (rate-limited)", n)
	}

	// Quiet, then one claim: answered at once.
	before := sent
	for ms := 1000; ms < 20000; ms++ {
		step(in, at(time.Duration(ms)*time.Millisecond))
	}
	refresh := sent - before // periodic refresh rounds meanwhile
	now := at(20 * time.Second)
	in.claimed(c, now)
	step(in, now)
	if got := sent - before - refresh; got != 1 {
		t.Errorf("a lone claim after a quiet spell: %d announcements at once, want 1", got)
	}
	if n := logs.FilterMessage("vip claimed by another station").Len(); n != 2 {
		t.Errorf("%d log lines after the quiet claim, want 2", n)
	}

	// A Backup neither counts nor answers claims.
	in.state.Store(uint32(StateBackup))
	in.claimed(c, now.Add(time.Second))
	if got := counterValue(t, a.met.conflicts, "flood"); got != 1000*claims+1 {
		t.Errorf("conflicts = %v after a claim in Backup, want %d", got, 1000*claims+1)
	}
}

// TestSplitBrainClaimsDoNotStorm: two Masters, each announcement (a request and
// a reply) a pair of claims for the other, arriving a millisecond later. The
// announcements stay at about one round per GARPSpacing each, not doubling.
func TestSplitBrainClaimsDoNotStorm(t *testing.T) {
	a, _ := claimAnnouncer(t)
	c := claim{vip: a4("10.0.0.100"), mac: net.HardwareAddr{2, 0, 0, 0, 0, 0x99}}
	var sentA, sentB, toA, toB int
	x := claimMaster(t, a, "a", a4("10.0.0.1"), &sentA, func() { toB += 2 })
	y := claimMaster(t, a, "b", a4("10.0.0.2"), &sentB, func() { toA += 2 })
	for ms := range 1000 {
		now := at(time.Duration(ms) * time.Millisecond)
		na, nb := toA, toB
		toA, toB = 0, 0
		for range na {
			x.claimed(c, now)
		}
		for range nb {
			y.claimed(c, now)
		}
		step(x, now)
		step(y, now)
	}
	if sentA > 21 || sentB > 21 {
		t.Errorf("announcements in 1s of split brain: a %d, b %d; want at most 21 each (one per GARPSpacing)", sentA, sentB)
	}
}
