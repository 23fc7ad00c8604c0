// Package lease writes and reads the agents' status Leases through the API
// server: each agent renews its own (Write), and the readers list them all
// (List, ReadStates). The schema is api/agentstatus's; this package adds only
// the client calls, so a reader links neither the agent nor the data plane.
package lease

import (
	"context"
	"fmt"
	"sort"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/portico-edge/portico/api/agentstatus"
)

// Write creates or renews node's status Lease in ns with state; the report
// counts as stale once ttl passes without a renewal.
func Write(ctx context.Context, client kubernetes.Interface, ns, node string, state []byte, ttl time.Duration) error {
	leases := client.CoordinationV1().Leases(ns)
	now := time.Now()
	l, err := leases.Get(ctx, agentstatus.LeaseName(node), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l = agentstatus.NewLease(ns, node, state, ttl, now)
		if _, err := leases.Create(ctx, l, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create status lease %s/%s: %w", ns, l.Name, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("get status lease %s/%s: %w", ns, agentstatus.LeaseName(node), err)
	}
	l = l.DeepCopy()
	agentstatus.Renew(l, node, state, ttl, now)
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("renew status lease %s/%s: %w", ns, l.Name, err)
	}
	return nil
}

// List reads every agent's status Lease in ns, sorted by node.
func List(ctx context.Context, client kubernetes.Interface, ns string) ([]agentstatus.Lease, error) {
	list, err := client.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{LabelSelector: agentstatus.Selector})
	if err != nil {
		return nil, fmt.Errorf("list agent leases in %s: %w", ns, err)
	}
	out := make([]agentstatus.Lease, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, agentstatus.LeaseOf(&list.Items[i]))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out, nil
}

// ReadStates reads every agent's published state and which reports are stale.
func ReadStates(ctx context.Context, client kubernetes.Interface, ns string) ([]agentstatus.State, map[string]bool, error) {
	leases, err := List(ctx, client, ns)
	if err != nil {
		return nil, nil, err
	}
	states, stale := agentstatus.DecodeStates(leases)
	return states, stale, nil
}
