package agentstatus

import (
	"encoding/json"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	// LabelAgent ("true") marks the agents' status Leases.
	LabelAgent = "portico.io/agent"
	// Selector selects the agents' status Leases.
	Selector = LabelAgent + "=true"
	// AnnotationState holds an agent's published State, as JSON.
	AnnotationState = "portico.io/agent-state"
)

// LeaseName is the name of node's status Lease.
func LeaseName(node string) string { return "portico-agent-" + node }

// NewLease is node's status Lease in ns holding state, renewed at now (Renew).
func NewLease(ns, node string, state []byte, ttl time.Duration, now time.Time) *coordinationv1.Lease {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: LeaseName(node),
		Labels: map[string]string{LabelAgent: "true"}}}
	Renew(l, node, state, ttl, now)
	return l
}

// Renew makes l hold node's state, renewed at now; the report counts as stale
// once ttl passes without a renewal. l is changed in place: give it a copy of a
// cached object.
func Renew(l *coordinationv1.Lease, node string, state []byte, ttl time.Duration, now time.Time) {
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[AnnotationState] = string(state)
	renew := metav1.NewMicroTime(now)
	secs := int32((ttl + time.Second - 1) / time.Second)
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &node, &secs, &renew
}

// Lease is one agent's published state.
type Lease struct {
	Node  string
	State []byte
	Stale bool // not renewed within its duration
}

// LeaseOf reads one agent's published state from its status Lease.
func LeaseOf(l *coordinationv1.Lease) Lease {
	a := Lease{State: []byte(l.Annotations[AnnotationState])}
	if l.Spec.HolderIdentity != nil {
		a.Node = *l.Spec.HolderIdentity
	}
	a.Stale = l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil ||
		time.Since(l.Spec.RenewTime.Time) > time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second
	return a
}

// DecodeStates reads the states the leases hold and which reports are stale; an
// unreadable report is left out.
func DecodeStates(leases []Lease) ([]State, map[string]bool) {
	var out []State
	stale := map[string]bool{}
	for _, l := range leases {
		var st State
		if err := json.Unmarshal(l.State, &st); err != nil {
			continue // not ours to judge: an unreadable report is left out
		}
		stale[st.Node] = l.Stale
		out = append(out, st)
	}
	return out, stale
}
