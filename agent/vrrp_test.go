package agent

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.uber.org/zap"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/vrrp"
)

// fakeAnnouncer stands in for a vrrp.Announcer: it records its config, the
// priorities it is given and whether it has stopped.
type fakeAnnouncer struct {
	cfg vrrp.Config

	mu         sync.Mutex
	stopped    bool
	priorities map[string]uint8
	vips       map[string][]netip.Addr // by SetVIPs
	failVIPs   error                   // SetVIPs fails
	peers      map[string][]netip.Addr // by SetPeers
}

func (f *fakeAnnouncer) SetPeers(_ context.Context, instance string, peers []netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.peers == nil {
		f.peers = map[string][]netip.Addr{}
	}
	f.peers[instance] = peers
	return nil
}

func (f *fakeAnnouncer) SetVIPs(_ context.Context, instance string, vips []netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failVIPs != nil {
		return f.failVIPs
	}
	if f.vips == nil {
		f.vips = map[string][]netip.Addr{}
	}
	f.vips[instance] = vips
	return nil
}

func (f *fakeAnnouncer) Run(ctx context.Context) error {
	<-ctx.Done()
	f.mu.Lock()
	f.stopped = true
	f.mu.Unlock()
	return nil
}

func (f *fakeAnnouncer) SetPriority(_ context.Context, instance string, p uint8) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.priorities[instance] = p
	return nil
}

func (f *fakeAnnouncer) States() map[string]vrrp.State {
	out := map[string]vrrp.State{}
	for _, in := range f.cfg.Instances {
		out[in.Name] = vrrp.StateBackup
	}
	return out
}

func (f *fakeAnnouncer) hasStopped() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stopped
}

// fakeVRRP is a vrrpSink whose announcers are fakes and whose lo writes are
// recorded.
type fakeVRRP struct {
	*vrrpSink
	started []*fakeAnnouncer
	failNew error    // the next announcer fails to start
	lo      []loCall // every setLoVIPs call
	loErr   error    // the next setLoVIPs fails
}

type loCall struct{ Want, Managed []netip.Addr }

// newFakeVRRP makes a sink; managed are the VIPs an earlier agent recorded.
func newFakeVRRP(t *testing.T, managed ...netip.Addr) *fakeVRRP {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f := &fakeVRRP{}
	f.vrrpSink = &vrrpSink{base: ctx, iface: "eth0", group: "edge/web", priority: 100, degraded: 10,
		interval: 100 * time.Millisecond, version: 3, log: zap.NewNop(), managed: managed,
		newAnnouncer: func(cfg vrrp.Config) (announcer, error) {
			if err := f.failNew; err != nil {
				f.failNew = nil
				return nil, err
			}
			a := &fakeAnnouncer{cfg: cfg, priorities: map[string]uint8{}}
			f.started = append(f.started, a)
			return a, nil
		},
		setLoVIPs: func(want, managed []netip.Addr) error {
			f.lo = append(f.lo, loCall{want, managed})
			err := f.loErr
			f.loErr = nil
			return err
		}}
	t.Cleanup(func() { f.stop(); cancel() })
	return f
}

var (
	vip4a = netip.MustParseAddr("192.0.2.10")
	vip4b = netip.MustParseAddr("192.0.2.11")
	vip6a = netip.MustParseAddr("2001:db8::10")
)

func snapWith(g model.Group) model.Snapshot {
	g.Name = "edge/web"
	return model.Snapshot{Groups: []model.Group{g, {Name: "edge/other", VRID: 9, VIPs: []netip.Addr{vip4b}}}}
}

func TestVRRPInstancesFor(t *testing.T) {
	v := newFakeVRRP(t)
	v.version = 2
	g := model.Group{Name: "edge/web", VRID: 7, VIPs: []netip.Addr{vip4a, vip6a, vip4b}}
	want := []vrrp.InstanceConfig{
		{Name: "edge/web/v4", VRID: 7, Version: 2, Priority: 10, AdvertInterval: vrrp.Duration{Duration: 100 * time.Millisecond}, VIPs: []netip.Addr{vip4a, vip4b}},
		{Name: "edge/web/v6", VRID: 7, Version: 3, Priority: 10, AdvertInterval: vrrp.Duration{Duration: 100 * time.Millisecond}, VIPs: []netip.Addr{vip6a}},
	}
	if diff := cmp.Diff(want, v.instancesFor(g), cmpopts.EquateComparable(netip.Addr{})); diff != "" {
		t.Errorf("instances while unhealthy (-want +got):\n%s", diff)
	}
	v.healthy = true
	for i := range want {
		want[i].Priority = 100
	}
	if diff := cmp.Diff(want, v.instancesFor(g), cmpopts.EquateComparable(netip.Addr{})); diff != "" {
		t.Errorf("instances while healthy (-want +got):\n%s", diff)
	}
	if got := v.instancesFor(model.Group{Name: "edge/web", VRID: 7, VIPs: []netip.Addr{vip6a}}); len(got) != 1 || got[0].Name != "edge/web/v6" {
		t.Errorf("an IPv6-only group gave %+v, want one v6 instance", got)
	}
}

// TestVRRPApply: the announcer is rebuilt only when the group's VRID or its VIPs'
// families change, or it refuses new VIPs; VIPs of its families are given to it
// in place, and other changes leave it alone.
func TestVRRPApply(t *testing.T) {
	ctx := context.Background()
	v := newFakeVRRP(t)
	replicas := []model.Replica{{Addr: netip.MustParseAddr("10.0.0.1")}}

	// No VRID yet: nothing announces.
	if err := v.Apply(ctx, snapWith(model.Group{VIPs: []netip.Addr{vip4a}})); err != nil {
		t.Fatal(err)
	}
	if len(v.started) != 0 {
		t.Fatalf("%d announcers started for a group without a VRID", len(v.started))
	}

	g := model.Group{VRID: 7, VIPs: []netip.Addr{vip4a}, Replicas: replicas}
	if err := v.Apply(ctx, snapWith(g)); err != nil {
		t.Fatal(err)
	}
	if len(v.started) != 1 {
		t.Fatalf("%d announcers started, want 1", len(v.started))
	}
	first := v.started[0]
	if first.cfg.Interface != "eth0" || len(first.cfg.Instances) != 1 || first.cfg.Instances[0].VRID != 7 {
		t.Errorf("announcer config %+v", first.cfg)
	}

	// Unchanged group, and a change that is not the VRID or VIPs: same announcer.
	g.Replicas = append(g.Replicas, model.Replica{Addr: netip.MustParseAddr("10.0.0.2")})
	for _, s := range []model.Snapshot{snapWith(g), snapWith(g)} {
		if err := v.Apply(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if len(v.started) != 1 || first.hasStopped() {
		t.Errorf("unchanged VRID and VIPs: %d announcers started, first stopped %v", len(v.started), first.hasStopped())
	}

	// A new VIP of a family the announcer runs: given to it in place.
	g.VIPs = []netip.Addr{vip4a, vip4b}
	if err := v.Apply(ctx, snapWith(g)); err != nil {
		t.Fatal(err)
	}
	if len(v.started) != 1 || first.hasStopped() {
		t.Fatalf("after a VIP of the same family: %d announcers started, first stopped %v", len(v.started), first.hasStopped())
	}
	if diff := cmp.Diff(map[string][]netip.Addr{"edge/web/v4": {vip4a, vip4b}}, first.vips, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
		t.Errorf("VIPs given in place (-want +got):\n%s", diff)
	}
	// One that the announcer refuses: rebuilt.
	first.failVIPs = errors.New("refused")
	g.VIPs = []netip.Addr{vip4a}
	if err := v.Apply(ctx, snapWith(g)); err != nil {
		t.Fatal(err)
	}
	if len(v.started) != 2 || !first.hasStopped() {
		t.Fatalf("after a refused VIP change: %d announcers started, first stopped %v", len(v.started), first.hasStopped())
	}
	first = v.started[1]

	// A VIP of a new family: the old announcer is stopped and a new one started.
	g.VIPs = []netip.Addr{vip4a, vip6a}
	if err := v.Apply(ctx, snapWith(g)); err != nil {
		t.Fatal(err)
	}
	if len(v.started) != 3 || !first.hasStopped() {
		t.Fatalf("after a VIP change: %d announcers started, first stopped %v", len(v.started), first.hasStopped())
	}
	if got := v.states(); len(got) != 2 {
		t.Errorf("states %v, want one per family", got)
	}

	// Health moves every instance's priority, once per change.
	v.setHealthy(ctx, true)
	v.setHealthy(ctx, true)
	if diff := cmp.Diff(map[string]uint8{"edge/web/v4": 100, "edge/web/v6": 100}, v.started[2].priorities); diff != "" {
		t.Errorf("priorities when healthy (-want +got):\n%s", diff)
	}
	v.setHealthy(ctx, false)
	if diff := cmp.Diff(map[string]uint8{"edge/web/v4": 10, "edge/web/v6": 10}, v.started[2].priorities); diff != "" {
		t.Errorf("priorities when unhealthy (-want +got):\n%s", diff)
	}

	// The group gone: announcing stops.
	if err := v.Apply(ctx, model.Snapshot{}); err != nil {
		t.Fatal(err)
	}
	if !v.started[2].hasStopped() || v.states() != nil {
		t.Errorf("a removed group still announces")
	}
}

// TestVRRPApplyRetries: an announcer that fails to start is tried again with
// the next snapshot, even an identical one.
func TestVRRPApplyRetries(t *testing.T) {
	ctx := context.Background()
	v := newFakeVRRP(t)
	v.failNew = errors.New("no such interface")
	s := snapWith(model.Group{VRID: 7, VIPs: []netip.Addr{vip4a}})
	if err := v.Apply(ctx, s); err == nil {
		t.Fatal("Apply succeeded although the announcer did not start")
	}
	if err := v.Apply(ctx, s); err != nil {
		t.Fatal(err)
	}
	if len(v.started) != 1 {
		t.Errorf("%d announcers started, want 1", len(v.started))
	}
}

// TestVRRPLoVIPs: the VIPs on lo are written once after start, even when an
// earlier agent recorded the same ones, then only when they change; a failed
// write is tried again with the next snapshot, even an identical one.
func TestVRRPLoVIPs(t *testing.T) {
	ctx := context.Background()
	v := newFakeVRRP(t, vip4a)
	replica := func(a string) []model.Replica { return []model.Replica{{Addr: netip.MustParseAddr(a)}} }
	both := []netip.Addr{vip4a, vip6a}
	var want []loCall
	for _, step := range []struct {
		name  string
		group model.Group
		fail  bool
		write *loCall // the write this snapshot makes, if any
	}{
		{name: "first snapshot", group: model.Group{VRID: 7, VIPs: []netip.Addr{vip4a}, Replicas: replica("10.0.0.1")},
			write: &loCall{[]netip.Addr{vip4a}, []netip.Addr{vip4a}}},
		{name: "unchanged", group: model.Group{VRID: 7, VIPs: []netip.Addr{vip4a}, Replicas: replica("10.0.0.1")}},
		{name: "other replicas", group: model.Group{VRID: 7, VIPs: []netip.Addr{vip4a}, Replicas: replica("10.0.0.2")}},
		{name: "new VRID", group: model.Group{VRID: 8, VIPs: []netip.Addr{vip4a}}},
		{name: "VIP added", group: model.Group{VRID: 8, VIPs: both},
			write: &loCall{both, []netip.Addr{vip4a}}},
		{name: "VIP removed, write fails", group: model.Group{VRID: 8, VIPs: []netip.Addr{vip6a}}, fail: true,
			write: &loCall{[]netip.Addr{vip6a}, both}},
		{name: "same snapshot again", group: model.Group{VRID: 8, VIPs: []netip.Addr{vip6a}},
			write: &loCall{[]netip.Addr{vip6a}, both}},
		{name: "back to both after a good write", group: model.Group{VRID: 8, VIPs: both},
			write: &loCall{both, []netip.Addr{vip6a}}},
		{name: "unchanged again", group: model.Group{VRID: 8, VIPs: both}},
	} {
		if step.fail {
			v.loErr = errors.New("netlink: operation not permitted")
		}
		err := v.Apply(ctx, snapWith(step.group))
		if step.fail != (err != nil) {
			t.Fatalf("%s: Apply error %v, want failure %v", step.name, err, step.fail)
		}
		if step.write != nil {
			want = append(want, *step.write)
		}
		if diff := cmp.Diff(want, v.lo, cmpopts.EquateComparable(netip.Addr{}), cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("%s: lo writes (-want +got):\n%s", step.name, diff)
		}
	}
	if err := v.Apply(ctx, model.Snapshot{}); err != nil {
		t.Fatal(err)
	}
	if last := v.lo[len(v.lo)-1]; len(last.Want) != 0 || len(last.Managed) != 2 {
		t.Errorf("group gone: lo write %+v, want none kept and both removed", last)
	}
}
