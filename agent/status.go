package agent

import (
	"context"
	"encoding/json"
	"maps"
	"net"
	"net/netip"
	"sync"
	"time"

	"go.uber.org/zap"
	"k8s.io/client-go/kubernetes"

	"github.com/portico-edge/portico/agent/lease"
	"github.com/portico-edge/portico/api/agentstatus"
	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/vrrp"
)

// Each agent publishes what it sees in a Lease of its own, portico-agent-<node>,
// renewed every few seconds (as kubelets do with node Leases): its group, VRRP
// states, health and, per VIP, the Maglev digest and each replica's share
// (api/agentstatus is the schema, agent/lease writes it). `portico status` reads
// them, so an operator sees every node side by side and can check that all
// digests agree.

const statusInterval = 3 * time.Second

// nodeView is where the agent's State comes from.
type nodeView struct {
	node, group, iface string
	health             func() string                        // why the node is unhealthy; "" when healthy
	vrrp               func() map[string]vrrp.State         // each virtual router's state
	vips               func() ([]dataplane.VIPView, error)  // the VIPs in the maps
	replicas           func() []agentstatus.ReplicaLiveness // the group's replicas and their liveness
	bgp                func() *agentstatus.BGPState         // nil in VRRP mode
	served             func() map[string]int64              // the Ingress generations nginx serves
	tunnel             netip.Addr                           // the tunnel address, in a federation
	spill              func() float64                       // the spill ratio, in a federation
	vrrpSources        func() []netip.Addr                  // nil: none published
	attachMode         func() dataplane.AttachMode          // xdp_lb's; nil or "": unknown
	load               func(time.Time) *agentstatus.Load    // the edge's work (loadMeter.sample); nil: none
}

// servedIngresses is what the node's nginx serves of its group's Ingresses
// (nginx.ReloaderConfig.OnServed); each change asks for a publish at once.
type servedIngresses struct {
	group string
	kick  chan struct{}
	mu    sync.Mutex
	gens  map[string]int64
}

func (s *servedIngresses) set(snap model.Snapshot) {
	var gens map[string]int64
	for _, g := range snap.Groups {
		if g.Name == s.group {
			gens = maps.Clone(g.Ingresses)
		}
	}
	s.mu.Lock()
	changed := !maps.Equal(s.gens, gens)
	s.gens = gens
	s.mu.Unlock()
	if changed {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

func (s *servedIngresses) get() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.gens)
}

// collect reads this node's view.
func (n nodeView) collect() agentstatus.State {
	st := agentstatus.State{Node: n.node, Group: n.group, VRRP: map[string]string{}, Updated: time.Now().UTC().Truncate(time.Second)}
	if ifc, err := net.InterfaceByName(n.iface); err == nil {
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil {
				st.Addrs = append(st.Addrs, p.Addr().String())
			}
		}
	}
	if n.tunnel.IsValid() {
		st.Tunnel = n.tunnel.String()
	}
	if n.spill != nil {
		st.Spill = n.spill()
	}
	if n.attachMode != nil {
		st.XDPAttachMode = string(n.attachMode())
	}
	st.Reason = n.health()
	st.Healthy = st.Reason == ""
	if n.vrrpSources != nil {
		for _, a := range n.vrrpSources() {
			st.VRRPSources = append(st.VRRPSources, a.String())
		}
	}
	for name, s := range n.vrrp() {
		st.VRRP[name] = s.String()
	}
	if n.replicas != nil {
		st.Replicas = n.replicas()
	}
	if n.bgp != nil {
		st.BGP = n.bgp()
	}
	if n.served != nil {
		st.Served = n.served()
	}
	if n.load != nil {
		st.Load = n.load(time.Now())
	}
	vips, err := n.vips()
	if err != nil {
		st.Healthy, st.Reason = false, err.Error()
		return st
	}
	for _, v := range vips {
		vsx := agentstatus.VIPState{VIP: v.Addr.String(), Digest: v.Digest, TransitionSeconds: v.Transition.Seconds()}
		for _, b := range v.Backends {
			r := agentstatus.ReplicaState{Addr: b.Addr.String(), State: "ready", Local: b.Local, Packets: b.Counters.Packets, MACKnown: b.Local || len(b.MAC) == 6}
			if b.Draining {
				r.State = "draining"
			}
			if b.Remote {
				r.State = "other site"
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

// publishStatus renews this agent's Lease with its state until ctx ends, and at
// once on a kick (nil: never). Two missed renewals and the report counts as stale.
func publishStatus(ctx context.Context, client kubernetes.Interface, ns string, collect func() agentstatus.State, kick <-chan struct{}, log *zap.Logger) {
	t := time.NewTicker(statusInterval)
	defer t.Stop()
	for {
		st := collect()
		b, err := json.Marshal(st)
		if err == nil {
			err = lease.Write(ctx, client, ns, st.Node, b, 2*statusInterval+time.Second)
		}
		if err != nil && ctx.Err() == nil {
			log.Warn("publish agent state", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-kick:
		}
	}
}
