package agent

import (
	"context"
	"encoding/json"
	"net/netip"
	"slices"
	"time"

	"go.uber.org/zap"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/portico-edge/portico/api/agentstatus"
	"github.com/portico-edge/portico/internal/shutdown"
)

// VRRP by unicast (as keepalived's unicast_peer): a group's agents send their
// adverts to each other and accept adverts from each other alone, so a stranger
// on the segment cannot take the group's VIPs with a forged advert. The peers are
// the adverts' sources each agent publishes in its status Lease
// (State.VRRPSources): a node's VRRP source need not be its replica address
// (another NIC), and IPv6 adverts come from link-local addresses, which
// Kubernetes lists nowhere. Only agents write Leases in their namespace.

// peerMode is what the agents' Leases say of a group's VRRP peers.
type peerMode int

const (
	// peersUnknown: this node's own Lease is not among them yet. Its announcer
	// waits, so the others have its address before it could become Master.
	peersUnknown peerMode = iota
	// peersMulticast: an agent of the group publishes no sources (an older
	// version during an upgrade, or one run with --vrrp-unicast=false): the
	// group stays on multicast and accepts adverts from any source, since
	// unicast routers and that agent would not hear each other.
	peersMulticast
	// peersUnicast: every agent of the group publishes its sources.
	peersUnicast
)

// peerWait bounds the wait for this node's own Lease (the agent cannot list
// Leases, or writes none): after it, the announcer starts on multicast,
// accepting any source, and takes the peers in place once they are known.
const peerWait = 10 * time.Second

// peerReport is the part of an agent's published State the peers come from.
type peerReport struct {
	Node        string   `json:"node"`
	Group       string   `json:"group"`
	VRRPSources []string `json:"vrrpSources"`
}

// groupPeers returns group's VRRP peers among the agents' status Leases at now,
// for the agent on node self: every source the group's agents publish, sorted.
// A Lease not renewed (a dead agent's) counts only with its sources: sending
// adverts to a dead node costs nothing, and while the API server is out of
// reach no Lease is renewed, so the peers must not change with that.
func groupPeers(leases []*coordinationv1.Lease, group, self string, now time.Time) ([]netip.Addr, peerMode) {
	var peers []netip.Addr
	mode, selfSeen := peersUnicast, false
	for _, l := range leases {
		var r peerReport
		if s, ok := l.Annotations[agentstatus.AnnotationState]; !ok || json.Unmarshal([]byte(s), &r) != nil || r.Group != group {
			continue
		}
		var srcs []netip.Addr
		for _, s := range r.VRRPSources {
			if a, err := netip.ParseAddr(s); err == nil {
				srcs = append(srcs, a.Unmap().WithZone(""))
			}
		}
		if r.Node == self {
			selfSeen = len(srcs) > 0
		}
		if len(srcs) == 0 {
			if leaseRenewed(l, now) {
				mode = peersMulticast
			}
			continue
		}
		peers = append(peers, srcs...)
	}
	if !selfSeen {
		return nil, peersUnknown
	}
	if mode == peersMulticast {
		return nil, peersMulticast
	}
	slices.SortFunc(peers, netip.Addr.Compare)
	return slices.Compact(peers), peersUnicast
}

// leaseRenewed reports whether l was renewed within its duration at now.
func leaseRenewed(l *coordinationv1.Lease, now time.Time) bool {
	return l.Spec.RenewTime != nil && l.Spec.LeaseDurationSeconds != nil &&
		!now.After(l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second))
}

// followPeers watches the agents' status Leases in ns and gives v the group's
// peers on every change, until ctx ends. If this node's own Lease has not
// shown up within peerWait, v starts on multicast meanwhile.
func followPeers(ctx context.Context, client kubernetes.Interface, ns string, v *vrrpSink, self string, log *zap.Logger) error {
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = agentstatus.Selector }))
	inf := f.Coordination().V1().Leases()
	changed := make(chan struct{}, 1)
	kick := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: kick, DeleteFunc: kick, UpdateFunc: func(_, n any) { kick(n) },
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	defer shutdown.Informers(log, f)
	wait := time.AfterFunc(peerWait, func() {
		if v.setPeers(ctx, nil, peersMulticast, true) {
			log.Warn("this node's status Lease was not seen: vrrp starts on multicast, accepting adverts from any source, until the group's peers are known",
				zap.Duration("waited", peerWait))
		}
	})
	defer wait.Stop()
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return nil
	}
	for {
		leases, err := inf.Lister().Leases(ns).List(labels.Everything())
		if err != nil {
			return err
		}
		peers, mode := groupPeers(leases, v.group, self, time.Now())
		v.setPeers(ctx, peers, mode, false)
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}
