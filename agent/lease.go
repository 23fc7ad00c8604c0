package agent

import (
	"context"
	"fmt"
	"sort"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Every agent reports its node-local view (VRRP state, health, table digests) in a
// Lease of its own, portico-agent-<node>, renewed every few seconds, as kubelets
// do with node Leases. The state is opaque here: the agent writes it and
// `portico status` reads it.

const (
	// LabelAgent ("true") marks the agents' status Leases.
	LabelAgent = "portico.io/agent"
	// annotationState holds an agent's published state.
	annotationState = "portico.io/agent-state"
)

// leaseName is the name of node's status Lease.
func leaseName(node string) string { return "portico-agent-" + node }

// WriteLease creates or renews node's status Lease in ns with state; the
// report counts as stale once ttl passes without a renewal.
func WriteLease(ctx context.Context, client kubernetes.Interface, ns, node string, state []byte, ttl time.Duration) error {
	leases := client.CoordinationV1().Leases(ns)
	now := metav1.NewMicroTime(time.Now())
	secs := int32((ttl + time.Second - 1) / time.Second)
	l, err := leases.Get(ctx, leaseName(node), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: leaseName(node),
			Labels: map[string]string{LabelAgent: "true"}, Annotations: map[string]string{annotationState: string(state)}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &node, LeaseDurationSeconds: &secs, RenewTime: &now}}
		if _, err := leases.Create(ctx, l, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create status lease %s/%s: %w", ns, l.Name, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("get status lease %s/%s: %w", ns, leaseName(node), err)
	}
	l = l.DeepCopy()
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[annotationState] = string(state)
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &node, &secs, &now
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("renew status lease %s/%s: %w", ns, l.Name, err)
	}
	return nil
}

// Lease is one agent's published state.
type Lease struct {
	Node  string
	State []byte
	Stale bool // not renewed within its duration
}

// ListLeases reads every agent's status Lease in ns, sorted by node.
func ListLeases(ctx context.Context, client kubernetes.Interface, ns string) ([]Lease, error) {
	list, err := client.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelAgent + "=true"})
	if err != nil {
		return nil, fmt.Errorf("list agent leases in %s: %w", ns, err)
	}
	out := make([]Lease, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, LeaseOf(&list.Items[i]))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out, nil
}

// LeaseOf reads one agent's published state from its status Lease.
func LeaseOf(l *coordinationv1.Lease) Lease {
	a := Lease{State: []byte(l.Annotations[annotationState])}
	if l.Spec.HolderIdentity != nil {
		a.Node = *l.Spec.HolderIdentity
	}
	a.Stale = l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil ||
		time.Since(l.Spec.RenewTime.Time) > time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second
	return a
}
