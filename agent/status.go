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

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/vrrp"
)

// Each agent publishes what it sees in a Lease of its own, portico-agent-<node>,
// renewed every few seconds (as kubelets do with node Leases): its group, VRRP
// states, health and, per VIP, the Maglev digest and each replica's share.
// `portico status` reads them, so an operator sees every node side by side and
// can check that all digests agree.

const statusInterval = 3 * time.Second

// State is what an agent publishes: its view of the node and of every VIP of
// its group, as JSON.
type State struct {
	Node  string   `json:"node"`
	Addrs []string `json:"addrs"` // the edge interface's addresses
	// Tunnel is the node's tunnel address in a federation (--tunnel-address, or
	// its default), where other sites send connections a site hand-over gives
	// them.
	Tunnel string `json:"tunnel,omitempty"`
	// Spill is the share of the node's new connections it spills to another
	// site above its capacity (federation overflow).
	Spill   float64           `json:"spill,omitempty"`
	Group   string            `json:"group"`
	Healthy bool              `json:"healthy"`
	Reason  string            `json:"reason,omitempty"`
	VRRP    map[string]string `json:"vrrp"` // instance -> state
	// VRRPSources are the addresses this node's VRRP adverts come from (its
	// first IPv4 address and its IPv6 link-local one on the edge interface):
	// the group's other agents send their adverts to them and accept adverts
	// from them alone (vrrpPeers). Empty in BGP mode and with multicast VRRP.
	VRRPSources []string   `json:"vrrpSources,omitempty"`
	VIPs        []VIPState `json:"vips"`
	// Replicas are the group's replicas as Kubernetes lists them, with this
	// node's liveness verdict on each (a dead one is in no VIP's ring).
	Replicas []ReplicaLiveness `json:"replicas,omitempty"`
	// BGP is the node's sessions and announcements (--announce=bgp).
	BGP *BGPState `json:"bgp,omitempty"`
	// Served is, for each Ingress bound to the group, the generation the
	// node's nginx serves ("namespace/name" -> metadata.generation): the
	// controller writes an Ingress's address once every edge serves it.
	Served  map[string]int64 `json:"served,omitempty"`
	Updated time.Time        `json:"updated"`
}

// ReplicaLiveness is one replica of the group: what Kubernetes says of it and
// whether this node's liveness checks find its nginx serving, since when.
type ReplicaLiveness struct {
	Addr       string    `json:"addr"`
	Kubernetes string    `json:"kubernetes"` // ready, draining
	Live       string    `json:"live"`       // live, dead, unchecked (checks off), live (fallback: why)
	Since      time.Time `json:"since,omitempty"`
}

// VIPState is one VIP as the node sees it: the table digest and the replicas.
type VIPState struct {
	VIP    string `json:"vip"`
	Digest string `json:"digest"`
	// TransitionSeconds is how long the previous ring still counts (flows older
	// than the last replica change keep their replicas); 0 outside a transition.
	TransitionSeconds float64        `json:"transitionSeconds,omitempty"`
	Replicas          []ReplicaState `json:"replicas"`
}

// ReplicaState is one replica of a VIP as the node sees it.
type ReplicaState struct {
	Addr     string  `json:"addr"`
	State    string  `json:"state"` // ready, draining
	Local    bool    `json:"local,omitempty"`
	Share    float64 `json:"share"` // fraction of the ring
	Packets  uint64  `json:"packets"`
	MACKnown bool    `json:"macKnown"`
}

// nodeView is where the agent's State comes from.
type nodeView struct {
	node, group, iface string
	health             func() string                       // why the node is unhealthy; "" when healthy
	vrrp               func() map[string]vrrp.State        // each virtual router's state
	vips               func() ([]dataplane.VIPView, error) // the VIPs in the maps
	replicas           func() []ReplicaLiveness            // the group's replicas and their liveness
	bgp                func() *BGPState                    // nil in VRRP mode
	served             func() map[string]int64             // the Ingress generations nginx serves
	tunnel             netip.Addr                          // the tunnel address, in a federation
	spill              func() float64                      // the spill ratio, in a federation
	vrrpSources        func() []netip.Addr                 // nil: none published
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
func (n nodeView) collect() State {
	st := State{Node: n.node, Group: n.group, VRRP: map[string]string{}, Updated: time.Now().UTC().Truncate(time.Second)}
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
	vips, err := n.vips()
	if err != nil {
		st.Healthy, st.Reason = false, err.Error()
		return st
	}
	for _, v := range vips {
		vsx := VIPState{VIP: v.Addr.String(), Digest: v.Digest, TransitionSeconds: v.Transition.Seconds()}
		for _, b := range v.Backends {
			r := ReplicaState{Addr: b.Addr.String(), State: "ready", Local: b.Local, Packets: b.Counters.Packets, MACKnown: b.Local || len(b.MAC) == 6}
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
func publishStatus(ctx context.Context, client kubernetes.Interface, ns string, collect func() State, kick <-chan struct{}, log *zap.Logger) {
	t := time.NewTicker(statusInterval)
	defer t.Stop()
	for {
		st := collect()
		b, err := json.Marshal(st)
		if err == nil {
			err = WriteLease(ctx, client, ns, st.Node, b, 2*statusInterval+time.Second)
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

// ReadStates reads every agent's published state and which reports are stale.
func ReadStates(ctx context.Context, client kubernetes.Interface, ns string) ([]State, map[string]bool, error) {
	leases, err := ListLeases(ctx, client, ns)
	if err != nil {
		return nil, nil, err
	}
	states, stale := DecodeStates(leases)
	return states, stale, nil
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

// Owners names the agents whose VRRP instance for a VIP's family is Master.
func Owners(states []State, group string, vip netip.Addr) []string {
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
