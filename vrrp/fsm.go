package vrrp

import (
	"fmt"
	"net/netip"
	"time"
)

// State is a virtual router's state (RFC 5798 §6.4).
type State uint8

// The three states of RFC 5798 §6.4.
const (
	StateInit State = iota
	StateBackup
	StateMaster
)

func (s State) String() string {
	switch s {
	case StateInit:
		return "init"
	case StateBackup:
		return "backup"
	case StateMaster:
		return "master"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// PriorityOwner is the priority of the router that owns the virtual addresses; it
// becomes Master at once on start-up.
const PriorityOwner = 255

// MachineConfig is what the state machine needs to know about its virtual router.
type MachineConfig struct {
	// Version is 2 or 3; it decides the skew-time formula and whether the
	// Master's advertised interval is adopted (version 3 only).
	Version uint8
	// Priority is the configured priority, 1 to 255.
	Priority uint8
	// Interval is the Advertisement_Interval this router sends with as Master.
	Interval time.Duration
	// Preempt lets a Backup of higher priority take over from a lower-priority
	// Master (RFC 5798 Preempt_Mode; on by default in Config).
	Preempt bool
	// PreemptDelay holds preemption back for this long after entering Backup:
	// until then a lower-priority Master is accepted like any other.
	PreemptDelay time.Duration
	// Primary is this router's primary address on the interface, which breaks
	// ties between equal priorities (the higher address wins).
	Primary netip.Addr
}

// Transition records a change of state and why it happened.
type Transition struct {
	From, To State
	Reason   string
}

// Output is what the driver must do after an event: send an advert with the given
// priority, and/or act on a transition (add the VIPs and announce them on entering
// Master, remove them on leaving it).
type Output struct {
	Send         bool
	SendPriority uint8
	Transition   *Transition
}

// Machine is the RFC 5798 §6.4 state machine of one virtual router. It holds no
// sockets and reads no clock: every event carries the current time and the driver
// asks Deadline when to call Tick next. It is not safe for concurrent use.
type Machine struct {
	cfg   MachineConfig
	prio  uint8
	state State

	masterAdverInterval time.Duration
	masterDown          time.Time // Master_Down_Timer, armed in Backup
	adverTimer          time.Time // Adver_Timer, armed in Master
	released            bool      // masterDown was armed by a priority-0 advert
	preemptAfter        time.Time
}

// NewMachine returns a machine in the Initialize state.
func NewMachine(cfg MachineConfig) *Machine {
	return &Machine{cfg: cfg, prio: cfg.Priority, masterAdverInterval: cfg.Interval}
}

// State returns the current state.
func (m *Machine) State() State { return m.state }

// Priority returns the effective priority.
func (m *Machine) Priority() uint8 { return m.prio }

// Deadline returns when Tick must next be called, or false when no timer runs.
func (m *Machine) Deadline() (time.Time, bool) {
	switch m.state {
	case StateBackup:
		return m.masterDown, true
	case StateMaster:
		return m.adverTimer, true
	}
	return time.Time{}, false
}

// SkewTime is Skew_Time for the current priority and Master_Adver_Interval.
func (m *Machine) SkewTime() time.Duration {
	if m.cfg.Version == 2 {
		// RFC 3768 §6.1: (256 - Priority) / 256 seconds.
		return time.Duration(256-int(m.prio)) * time.Second / 256
	}
	return time.Duration(256-int(m.prio)) * m.masterAdverInterval / 256
}

// MasterDownInterval is Master_Down_Interval: three advert intervals plus the skew.
func (m *Machine) MasterDownInterval() time.Duration {
	return 3*m.masterAdverInterval + m.SkewTime()
}

// Start leaves Initialize: the address owner becomes Master at once, anyone else
// becomes Backup and waits Master_Down_Interval for a Master to show itself.
func (m *Machine) Start(now time.Time) Output {
	if m.state != StateInit {
		return Output{}
	}
	if m.prio == PriorityOwner {
		return m.becomeMaster(now, "address owner starting")
	}
	return m.becomeBackup(now, m.cfg.Interval, StateInit, "starting")
}

// Stop is the Shutdown event: a Master sends a priority-0 advert so that a Backup
// takes over after its skew time rather than the whole master-down interval.
func (m *Machine) Stop(now time.Time) Output {
	var out Output
	switch m.state {
	case StateInit:
		return out
	case StateMaster:
		out.Send, out.SendPriority = true, 0
	}
	out.Transition = &Transition{From: m.state, To: StateInit, Reason: "shutdown"}
	m.state = StateInit
	return out
}

// Tick fires whichever timer has expired by now.
func (m *Machine) Tick(now time.Time) Output {
	switch m.state {
	case StateBackup:
		if now.Before(m.masterDown) {
			return Output{}
		}
		reason := "master down timer expired"
		if m.released {
			reason = "master released the virtual router"
		}
		return m.becomeMaster(now, reason)
	case StateMaster:
		if now.Before(m.adverTimer) {
			return Output{}
		}
		m.adverTimer = now.Add(m.cfg.Interval)
		return Output{Send: true, SendPriority: m.prio}
	}
	return Output{}
}

// Advert handles a validated advert for this virtual router from src.
func (m *Machine) Advert(now time.Time, a Advert, src netip.Addr) Output {
	switch m.state {
	case StateBackup:
		switch {
		case a.Priority == 0:
			m.masterDown = now.Add(m.SkewTime())
			m.released = true
		case !m.cfg.Preempt || a.Priority >= m.prio || now.Before(m.preemptAfter):
			if m.cfg.Version == 3 {
				m.masterAdverInterval = a.Interval
			}
			m.masterDown = now.Add(m.MasterDownInterval())
			m.released = false
		default:
			// A lower-priority Master and we may preempt: discard, so the
			// master-down timer fires and we take over.
		}
	case StateMaster:
		switch {
		case a.Priority == 0:
			m.adverTimer = now.Add(m.cfg.Interval)
			return Output{Send: true, SendPriority: m.prio}
		case a.Priority > m.prio:
			return m.becomeBackup(now, a.Interval, StateMaster, "higher priority master")
		case a.Priority == m.prio && src.Compare(m.cfg.Primary) > 0:
			return m.becomeBackup(now, a.Interval, StateMaster, "equal priority master with higher address")
		}
	}
	return Output{}
}

// SetPriority changes the effective priority, e.g. when a health check fails. A
// Master advertises the new priority at once so a healthier Backup can preempt.
// Priority 0 is reserved for release and is raised to 1.
func (m *Machine) SetPriority(now time.Time, p uint8) Output {
	if p == 0 {
		p = 1
	}
	if p == m.prio {
		return Output{}
	}
	m.prio = p
	if m.state == StateMaster {
		m.adverTimer = now.Add(m.cfg.Interval)
		return Output{Send: true, SendPriority: m.prio}
	}
	return Output{}
}

func (m *Machine) becomeMaster(now time.Time, reason string) Output {
	from := m.state
	m.state = StateMaster
	m.released = false
	m.adverTimer = now.Add(m.cfg.Interval)
	return Output{Send: true, SendPriority: m.prio, Transition: &Transition{From: from, To: StateMaster, Reason: reason}}
}

func (m *Machine) becomeBackup(now time.Time, masterInterval time.Duration, from State, reason string) Output {
	m.state = StateBackup
	m.released = false
	m.masterAdverInterval = m.cfg.Interval
	if m.cfg.Version == 3 && masterInterval > 0 {
		m.masterAdverInterval = masterInterval
	}
	m.masterDown = now.Add(m.MasterDownInterval())
	m.preemptAfter = now.Add(m.cfg.PreemptDelay)
	return Output{Transition: &Transition{From: from, To: StateBackup, Reason: reason}}
}
