package vrrp

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

func advert(prio uint8, interval time.Duration) Advert {
	return Advert{Version: 3, VRID: 1, Priority: prio, Interval: interval, Addrs: []netip.Addr{a4("10.0.0.100")}}
}

func machine(prio uint8, edit ...func(*MachineConfig)) *Machine {
	cfg := MachineConfig{Version: 3, Priority: prio, Interval: time.Second, Preempt: true, Primary: a4("10.0.0.2")}
	for _, e := range edit {
		e(&cfg)
	}
	return NewMachine(cfg)
}

func deadline(t *testing.T, m *Machine) time.Time {
	t.Helper()
	d, ok := m.Deadline()
	if !ok {
		t.Fatalf("no deadline in state %v", m.State())
	}
	return d
}

func wantOut(t *testing.T, what string, got, want Output) {
	t.Helper()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("%s (-want +got):\n%s", what, diff)
	}
}

func TestStartBackupArmsMasterDown(t *testing.T) {
	m := machine(100)
	wantOut(t, "Start", m.Start(t0), Output{Transition: &Transition{StateInit, StateBackup, "starting"}})
	// Skew_Time = (256-100)*1s/256 = 609.375ms; Master_Down_Interval = 3s + skew.
	if got, want := m.SkewTime(), 609375*time.Microsecond; got != want {
		t.Errorf("SkewTime = %v, want %v", got, want)
	}
	if got, want := deadline(t, m), at(3*time.Second+609375*time.Microsecond); !got.Equal(want) {
		t.Errorf("deadline = %v, want %v", got.Sub(t0), want.Sub(t0))
	}
	wantOut(t, "Tick before the deadline", m.Tick(at(3600*time.Millisecond)), Output{})
	wantOut(t, "Tick at the deadline", m.Tick(at(3609375*time.Microsecond)),
		Output{Send: true, SendPriority: 100, Transition: &Transition{StateBackup, StateMaster, "master down timer expired"}})
	if got, want := deadline(t, m), at(4609375*time.Microsecond); !got.Equal(want) {
		t.Errorf("advert timer = %v, want %v", got.Sub(t0), want.Sub(t0))
	}
}

func TestOwnerStartsAsMaster(t *testing.T) {
	m := machine(PriorityOwner)
	wantOut(t, "Start", m.Start(t0), Output{Send: true, SendPriority: 255, Transition: &Transition{StateInit, StateMaster, "address owner starting"}})
	// An owner never yields to anyone of lower priority, however high.
	wantOut(t, "advert 254", m.Advert(at(time.Second), advert(254, time.Second), a4("10.0.0.9")), Output{})
	if m.State() != StateMaster {
		t.Errorf("state = %v, want master", m.State())
	}
}

func TestMasterSendsEveryInterval(t *testing.T) {
	m := machine(PriorityOwner)
	m.Start(t0)
	for i := 1; i <= 3; i++ {
		now := at(time.Duration(i) * time.Second)
		wantOut(t, fmt.Sprintf("Tick %d", i), m.Tick(now), Output{Send: true, SendPriority: 255})
		if got := deadline(t, m); !got.Equal(now.Add(time.Second)) {
			t.Errorf("deadline after tick %d = %v", i, got.Sub(t0))
		}
	}
	wantOut(t, "early Tick", m.Tick(at(3500*time.Millisecond)), Output{})
}

func TestBackupAdverts(t *testing.T) {
	cases := []struct {
		name         string
		local        uint8
		edit         func(*MachineConfig)
		adv          Advert
		wantDeadline time.Duration // from the advert's arrival at 1s
	}{
		{"higher priority resets the timer", 100, nil, advert(200, time.Second), 3*time.Second + 609375*time.Microsecond},
		{"equal priority resets the timer", 100, nil, advert(100, time.Second), 3*time.Second + 609375*time.Microsecond},
		{"v3 adopts the master's interval", 100, nil, advert(200, 2*time.Second), 6*time.Second + 1218750*time.Microsecond},
		{"lower priority is ignored with preemption", 100, nil, advert(50, time.Second), 2*time.Second + 609375*time.Microsecond},
		{"lower priority resets the timer without preemption", 100, func(c *MachineConfig) { c.Preempt = false }, advert(50, time.Second), 3*time.Second + 609375*time.Microsecond},
		{"lower priority resets the timer during the preempt delay", 100, func(c *MachineConfig) { c.PreemptDelay = 5 * time.Second }, advert(50, time.Second), 3*time.Second + 609375*time.Microsecond},
		{"priority 0 arms the skew time", 100, nil, advert(0, time.Second), 609375 * time.Microsecond},
		{"v2 skew is in seconds, interval not adopted", 100, func(c *MachineConfig) { c.Version = 2; c.Interval = 2 * time.Second }, Advert{Version: 2, VRID: 1, Priority: 200, Interval: 5 * time.Second}, 6*time.Second + 609375*time.Microsecond},
		{"v2 priority 0", 200, func(c *MachineConfig) { c.Version = 2; c.Interval = 2 * time.Second }, Advert{Version: 2, VRID: 1, Priority: 0, Interval: 2 * time.Second}, 218750 * time.Microsecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var edits []func(*MachineConfig)
			if tc.edit != nil {
				edits = append(edits, tc.edit)
			}
			m := machine(tc.local, edits...)
			m.Start(t0)
			wantOut(t, "Advert", m.Advert(at(time.Second), tc.adv, a4("10.0.0.9")), Output{})
			if got, want := deadline(t, m), at(time.Second+tc.wantDeadline); !got.Equal(want) {
				t.Errorf("deadline = %v after the advert, want %v", got.Sub(at(time.Second)), tc.wantDeadline)
			}
			if m.State() != StateBackup {
				t.Errorf("state = %v, want backup", m.State())
			}
		})
	}
}

func TestPreemptDelayExpires(t *testing.T) {
	m := machine(100, func(c *MachineConfig) { c.PreemptDelay = 2 * time.Second })
	m.Start(t0)
	m.Advert(at(time.Second), advert(50, time.Second), a4("10.0.0.9"))   // within the delay: accepted
	m.Advert(at(3*time.Second), advert(50, time.Second), a4("10.0.0.9")) // past it: discarded
	want := at(4*time.Second + 609375*time.Microsecond)                  // armed by the advert at 1s
	if got := deadline(t, m); !got.Equal(want) {
		t.Errorf("deadline = %v, want %v", got.Sub(t0), want.Sub(t0))
	}
	out := m.Tick(want)
	if out.Transition == nil || out.Transition.To != StateMaster {
		t.Fatalf("Tick = %+v, want a transition to master", out)
	}
}

func TestReleaseReason(t *testing.T) {
	m := machine(100)
	m.Start(t0)
	m.Advert(at(time.Second), advert(0, time.Second), a4("10.0.0.9"))
	out := m.Tick(at(time.Second + m.SkewTime()))
	wantOut(t, "Tick", out, Output{Send: true, SendPriority: 100, Transition: &Transition{StateBackup, StateMaster, "master released the virtual router"}})
}

func TestMasterAdverts(t *testing.T) {
	cases := []struct {
		name      string
		local     uint8
		adv       Advert
		src       netip.Addr
		want      Output
		wantState State
	}{
		{"higher priority makes us step down", 100, advert(150, time.Second), a4("10.0.0.1"),
			Output{Transition: &Transition{StateMaster, StateBackup, "higher priority master"}}, StateBackup},
		{"lower priority is ignored", 100, advert(50, time.Second), a4("10.0.0.9"), Output{}, StateMaster},
		{"equal priority, higher address wins", 100, advert(100, time.Second), a4("10.0.0.3"),
			Output{Transition: &Transition{StateMaster, StateBackup, "equal priority master with higher address"}}, StateBackup},
		{"equal priority, lower address loses", 100, advert(100, time.Second), a4("10.0.0.1"), Output{}, StateMaster},
		{"priority 0 is answered at once", 100, advert(0, time.Second), a4("10.0.0.9"), Output{Send: true, SendPriority: 100}, StateMaster},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := machine(tc.local)
			m.Start(t0)
			m.Tick(at(4 * time.Second))
			if m.State() != StateMaster {
				t.Fatalf("setup: state = %v", m.State())
			}
			wantOut(t, "Advert", m.Advert(at(4500*time.Millisecond), tc.adv, tc.src), tc.want)
			if m.State() != tc.wantState {
				t.Errorf("state = %v, want %v", m.State(), tc.wantState)
			}
			if tc.wantState == StateBackup {
				// 4.5s + Master_Down_Interval (3 × 1s + skew (256-100)/256 s = 609.375ms).
				if got, want := deadline(t, m), at(8109375*time.Microsecond); !got.Equal(want) {
					t.Errorf("master down = %v, want %v", got.Sub(t0), want.Sub(t0))
				}
			}
		})
	}
}

func TestStop(t *testing.T) {
	m := machine(100)
	m.Start(t0)
	m.Tick(at(4 * time.Second))
	wantOut(t, "Stop master", m.Stop(at(5*time.Second)), Output{Send: true, SendPriority: 0, Transition: &Transition{StateMaster, StateInit, "shutdown"}})
	if _, ok := m.Deadline(); ok {
		t.Error("a timer still runs after Stop")
	}
	b := machine(100)
	b.Start(t0)
	wantOut(t, "Stop backup", b.Stop(at(time.Second)), Output{Transition: &Transition{StateBackup, StateInit, "shutdown"}})
	wantOut(t, "Stop twice", b.Stop(at(time.Second)), Output{})
}

func TestSetPriority(t *testing.T) {
	m := machine(100)
	m.Start(t0)
	m.Tick(at(4 * time.Second))
	wantOut(t, "lower as master", m.SetPriority(at(4200*time.Millisecond), 20), Output{Send: true, SendPriority: 20})
	if got := deadline(t, m); !got.Equal(at(5200 * time.Millisecond)) {
		t.Errorf("advert timer = %v, want 5.2s", got.Sub(t0))
	}
	wantOut(t, "same again", m.SetPriority(at(4300*time.Millisecond), 20), Output{})
	wantOut(t, "zero is raised to one", m.SetPriority(at(4400*time.Millisecond), 0), Output{Send: true, SendPriority: 1})
	// A lowered Master now yields to a Backup of priority 50.
	wantOut(t, "advert 50", m.Advert(at(4500*time.Millisecond), advert(50, time.Second), a4("10.0.0.1")),
		Output{Transition: &Transition{StateMaster, StateBackup, "higher priority master"}})
}

// sim runs several machines on a lossless segment where adverts arrive at once.
type sim struct {
	t      *testing.T
	now    time.Time
	ms     []*Machine
	addrs  []netip.Addr
	alive  []bool
	linked []bool // false: cut off from the segment
	log    []string
}

func newSim(t *testing.T, prios []uint8, edit func(*MachineConfig)) *sim {
	s := &sim{t: t, now: t0}
	for i, p := range prios {
		addr := netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)})
		cfg := MachineConfig{Version: 3, Priority: p, Interval: 100 * time.Millisecond, Preempt: true, Primary: addr}
		if edit != nil {
			edit(&cfg)
		}
		s.ms = append(s.ms, NewMachine(cfg))
		s.addrs = append(s.addrs, addr)
		s.alive = append(s.alive, true)
		s.linked = append(s.linked, true)
	}
	for i := range s.ms {
		s.apply(i, s.ms[i].Start(s.now))
	}
	return s
}

func (s *sim) apply(i int, out Output) {
	if out.Transition != nil {
		s.log = append(s.log, fmt.Sprintf("%v n%d %v->%v", s.now.Sub(t0), i, out.Transition.From, out.Transition.To))
	}
	if !out.Send || !s.linked[i] {
		return
	}
	a := Advert{Version: 3, VRID: 1, Priority: out.SendPriority, Interval: s.ms[i].cfg.Interval, Addrs: []netip.Addr{a4("10.0.0.100")}}
	for j, m := range s.ms {
		if j != i && s.alive[j] && s.linked[j] {
			s.apply(j, m.Advert(s.now, a, s.addrs[i]))
		}
	}
}

// run advances the clock to until, firing timers in order.
func (s *sim) run(until time.Time) {
	for range 100000 {
		next, who := until, -1
		for i, m := range s.ms {
			if d, ok := m.Deadline(); ok && s.alive[i] && d.Before(next) {
				next, who = d, i
			}
		}
		s.now = next
		if who < 0 {
			return
		}
		s.apply(who, s.ms[who].Tick(s.now))
	}
	s.t.Fatal("simulation did not settle")
}

func (s *sim) masters() []int {
	var out []int
	for i, m := range s.ms {
		if s.alive[i] && m.State() == StateMaster {
			out = append(out, i)
		}
	}
	sort.Ints(out)
	return out
}

// firstMasterAfter runs until some live machine other than skip is Master.
func (s *sim) firstMasterAfter(skip int, limit time.Duration) (int, time.Duration) {
	start := s.now
	for s.now.Sub(start) < limit {
		s.run(s.now.Add(time.Millisecond))
		for _, i := range s.masters() {
			if i != skip {
				return i, s.now.Sub(start)
			}
		}
	}
	s.t.Fatalf("no new master within %v; log:\n%s", limit, strings.Join(s.log, "\n"))
	return -1, 0
}

func TestSimElection(t *testing.T) {
	s := newSim(t, []uint8{100, 200, 150}, nil)
	s.run(at(2 * time.Second))
	if diff := cmp.Diff([]int{1}, s.masters()); diff != "" {
		t.Errorf("masters (-want +got):\n%s\nlog:\n%s", diff, strings.Join(s.log, "\n"))
	}
}

func TestSimTieBreak(t *testing.T) {
	// Equal priorities only meet as Masters (RFC 5798 §6.4.3): let all three
	// become Master apart, then join them; the highest primary address wins.
	s := newSim(t, []uint8{100, 100, 100}, nil)
	for i := range s.linked {
		s.linked[i] = false
	}
	s.run(at(time.Second))
	if diff := cmp.Diff([]int{0, 1, 2}, s.masters()); diff != "" {
		t.Fatalf("masters while apart (-want +got):\n%s", diff)
	}
	for i := range s.linked {
		s.linked[i] = true
	}
	s.run(at(2 * time.Second))
	if diff := cmp.Diff([]int{2}, s.masters()); diff != "" {
		t.Errorf("masters (-want +got): the highest address must win\n%s", diff)
	}
}

func TestSimFailoverAfterMasterDown(t *testing.T) {
	s := newSim(t, []uint8{100, 200, 150}, nil)
	s.run(at(2 * time.Second))
	s.alive[1] = false // killed: no priority-0 advert
	who, took := s.firstMasterAfter(1, 2*time.Second)
	if who != 2 {
		t.Errorf("new master = n%d, want n2 (priority 150)", who)
	}
	// Master_Down_Interval of priority 150 at 100ms: 300ms + 41.4ms, counted from
	// the last advert, which went out at most one interval before the kill.
	if lo, hi := 241*time.Millisecond, 342*time.Millisecond; took < lo || took > hi {
		t.Errorf("takeover after %v, want within [%v, %v]", took, lo, hi)
	}
}

func TestSimGracefulRelease(t *testing.T) {
	s := newSim(t, []uint8{100, 200, 150}, nil)
	s.run(at(2 * time.Second))
	s.apply(1, s.ms[1].Stop(s.now))
	s.alive[1] = false
	who, took := s.firstMasterAfter(1, 2*time.Second)
	if who != 2 {
		t.Errorf("new master = n%d, want n2", who)
	}
	// Skew_Time of priority 150: 106/256 * 100ms = 41.4ms.
	if took > 42*time.Millisecond {
		t.Errorf("takeover after %v, want within the skew time 41.4ms", took)
	}
}

func TestSimPreemptOff(t *testing.T) {
	s := newSim(t, []uint8{100}, func(c *MachineConfig) { c.Preempt = false })
	s.run(at(time.Second))
	// A higher-priority router joins later and must not take over.
	late := NewMachine(MachineConfig{Version: 3, Priority: 200, Interval: 100 * time.Millisecond, Preempt: false, Primary: a4("10.0.0.9")})
	s.ms, s.addrs, s.alive, s.linked = append(s.ms, late), append(s.addrs, a4("10.0.0.9")), append(s.alive, true), append(s.linked, true)
	s.apply(1, late.Start(s.now))
	s.run(at(3 * time.Second))
	if diff := cmp.Diff([]int{0}, s.masters()); diff != "" {
		t.Errorf("masters with preemption off (-want +got):\n%s", diff)
	}
	// The same with preemption on: the newcomer takes over.
	s2 := newSim(t, []uint8{100}, nil)
	s2.run(at(time.Second))
	late2 := NewMachine(MachineConfig{Version: 3, Priority: 200, Interval: 100 * time.Millisecond, Preempt: true, Primary: a4("10.0.0.9")})
	s2.ms, s2.addrs, s2.alive, s2.linked = append(s2.ms, late2), append(s2.addrs, a4("10.0.0.9")), append(s2.alive, true), append(s2.linked, true)
	s2.apply(1, late2.Start(s2.now))
	s2.run(at(3 * time.Second))
	if diff := cmp.Diff([]int{1}, s2.masters()); diff != "" {
		t.Errorf("masters with preemption on (-want +got):\n%s", diff)
	}
}

func TestSimPartitionHeal(t *testing.T) {
	s := newSim(t, []uint8{200, 100}, nil)
	s.run(at(time.Second))
	s.linked[0] = false
	s.run(at(2 * time.Second))
	if diff := cmp.Diff([]int{0, 1}, s.masters()); diff != "" {
		t.Errorf("masters during the partition (-want +got):\n%s", diff)
	}
	s.linked[0] = true
	s.run(s.now.Add(100 * time.Millisecond))
	if diff := cmp.Diff([]int{0}, s.masters()); diff != "" {
		t.Errorf("masters one interval after the heal (-want +got):\n%s", diff)
	}
}

func TestSimPriorityTracking(t *testing.T) {
	s := newSim(t, []uint8{200, 100}, nil)
	s.run(at(time.Second))
	s.apply(0, s.ms[0].SetPriority(s.now, 50))
	s.run(at(2 * time.Second))
	if diff := cmp.Diff([]int{1}, s.masters()); diff != "" {
		t.Errorf("masters after lowering n0 (-want +got):\n%s", diff)
	}
	s.apply(0, s.ms[0].SetPriority(s.now, 200))
	s.run(at(3 * time.Second))
	if diff := cmp.Diff([]int{0}, s.masters()); diff != "" {
		t.Errorf("masters after restoring n0 (-want +got):\n%s", diff)
	}
}
