package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"time"

	"go.uber.org/zap"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/vrrp"
)

// Each agent publishes what it sees in a Lease of its own, portico-agent-<node>,
// renewed every few seconds (as kubelets do with node Leases): its group, VRRP
// states, health and, per VIP, the Maglev digest and each replica's share.
// `portico status` reads them, so an operator sees every node side by side and
// can check that all digests agree.

const (
	labelAgent      = "portico.io/agent"
	annotationState = "portico.io/agent-state"
	statusInterval  = 3 * time.Second
)

// agentState is the JSON an agent publishes.
type agentState struct {
	Node    string            `json:"node"`
	Addrs   []string          `json:"addrs"` // the edge interface's addresses
	Group   string            `json:"group"`
	Healthy bool              `json:"healthy"`
	Reason  string            `json:"reason,omitempty"`
	VRRP    map[string]string `json:"vrrp"` // instance -> state
	VIPs    []vipState        `json:"vips"`
	Updated time.Time         `json:"updated"`
}

type vipState struct {
	VIP      string         `json:"vip"`
	Digest   string         `json:"digest"`
	Replicas []replicaState `json:"replicas"`
}

type replicaState struct {
	Addr     string  `json:"addr"`
	State    string  `json:"state"` // ready, draining
	Local    bool    `json:"local,omitempty"`
	Share    float64 `json:"share"` // fraction of the ring
	Packets  uint64  `json:"packets"`
	MACKnown bool    `json:"macKnown"`
}

func leaseName(node string) string { return "portico-agent-" + node }

// collectState reads this node's view.
func collectState(node, group, iface string, dp *dataplane.Dataplane, h *health, vs *vrrpSink) agentState {
	st := agentState{Node: node, Group: group, VRRP: map[string]string{}, Updated: time.Now().UTC().Truncate(time.Second)}
	if ifc, err := net.InterfaceByName(iface); err == nil {
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil {
				st.Addrs = append(st.Addrs, p.Addr().String())
			}
		}
	}
	h.mu.Lock()
	st.Reason = h.reason
	h.mu.Unlock()
	st.Healthy = st.Reason == ""
	for name, s := range vs.states() {
		st.VRRP[name] = s.String()
	}
	vips, err := dp.VIPs()
	if err != nil {
		st.Healthy, st.Reason = false, err.Error()
		return st
	}
	for _, v := range vips {
		vsx := vipState{VIP: v.Addr.String(), Digest: v.Digest}
		for _, b := range v.Backends {
			r := replicaState{Addr: b.Addr.String(), State: "ready", Local: b.Local, Packets: b.Counters.Packets, MACKnown: b.Local || len(b.MAC) == 6}
			if b.Draining {
				r.State = "draining"
			}
			if v.RingSize > 0 {
				r.Share = float64(b.Slots) / float64(v.RingSize)
			}
			vsx.Replicas = append(vsx.Replicas, r)
		}
		st.VIPs = append(st.VIPs, vsx)
	}
	return st
}

// publishStatus renews this agent's Lease with its state until ctx ends.
func publishStatus(ctx context.Context, client kubernetes.Interface, ns string, collect func() agentState, log *zap.Logger) {
	t := time.NewTicker(statusInterval)
	defer t.Stop()
	for {
		if err := writeState(ctx, client, ns, collect()); err != nil && ctx.Err() == nil {
			log.Warn("publish agent state", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func writeState(ctx context.Context, client kubernetes.Interface, ns string, st agentState) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	leases := client.CoordinationV1().Leases(ns)
	now := metav1.NewMicroTime(time.Now())
	// Two missed renewals and the report counts as stale.
	dur := int32((2*statusInterval + time.Second) / time.Second)
	l, err := leases.Get(ctx, leaseName(st.Node), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: leaseName(st.Node),
			Labels: map[string]string{labelAgent: "true"}, Annotations: map[string]string{annotationState: string(b)}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &st.Node, LeaseDurationSeconds: &dur, RenewTime: &now}}
		_, err = leases.Create(ctx, l, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	l = l.DeepCopy()
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[annotationState] = string(b)
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &st.Node, &dur, &now
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	return err
}

// readStates lists every agent's published state, oldest renewals marked stale.
func readStates(ctx context.Context, client kubernetes.Interface, ns string) ([]agentState, map[string]bool, error) {
	list, err := client.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{LabelSelector: labelAgent + "=true"})
	if err != nil {
		return nil, nil, fmt.Errorf("list agent leases in %s: %w", ns, err)
	}
	var out []agentState
	stale := map[string]bool{}
	for _, l := range list.Items {
		var st agentState
		if err := json.Unmarshal([]byte(l.Annotations[annotationState]), &st); err != nil {
			continue
		}
		if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil ||
			time.Since(l.Spec.RenewTime.Time) > time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second {
			stale[st.Node] = true
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out, stale, nil
}

// ownerOf names the agents whose VRRP instance for a VIP's family is Master.
func ownerOf(states []agentState, group string, vip netip.Addr) []string {
	fam := "v4"
	if vip.Is6() {
		fam = "v6"
	}
	var owners []string
	for _, st := range states {
		if st.Group == group && st.VRRP[group+"/"+fam] == vrrp.StateMaster.String() {
			owners = append(owners, st.Node)
		}
	}
	return owners
}
