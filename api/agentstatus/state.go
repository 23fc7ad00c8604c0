package agentstatus

import (
	"net/netip"
	"time"
)

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
	VRRP    map[string]string `json:"vrrp"` // instance -> state (VRRPMaster, ...)
	// VRRPSources are the addresses this node's VRRP adverts come from (its
	// first IPv4 address and its IPv6 link-local one on the edge interface):
	// the group's other agents send their adverts to them and accept adverts
	// from them alone. Empty in BGP mode and with multicast VRRP.
	VRRPSources []string   `json:"vrrpSources,omitempty"`
	VIPs        []VIPState `json:"vips"`
	// Replicas are the group's replicas as Kubernetes lists them, with this
	// node's liveness verdict on each (a dead one is in no VIP's ring).
	Replicas []ReplicaLiveness `json:"replicas,omitempty"`
	// BGP is the node's sessions and announcements (--announce=bgp).
	BGP *BGPState `json:"bgp,omitempty"`
	// XDPAttachMode is the mode xdp_lb runs in on the edge interface: native,
	// or generic where the driver refused native (--xdp-mode=best-effort).
	// Empty from agents older than the field, or when the agent could not tell.
	XDPAttachMode string `json:"xdpAttachMode,omitempty"`
	// Served is, for each Ingress bound to the group, the generation the
	// node's nginx serves ("namespace/name" -> metadata.generation): the
	// controller writes an Ingress's address once every edge serves it.
	Served map[string]int64 `json:"served,omitempty"`
	// Load is what the node's edge measured of its own work: the leader
	// schedules a new Ingress to the group with the most headroom by it. Nil
	// from agents older than the field and before a first measurement.
	Load    *Load     `json:"load,omitempty"`
	Updated time.Time `json:"updated"`
}

// Load is an edge's work, averaged over about LoadWindow: what its nginx
// served and the CPU its workers used, and the new connections its xdp_lb
// steered as a director (to any replica).
type Load struct {
	Requests       float64 `json:"requestsPerSecond"`
	Bytes          float64 `json:"bytesPerSecond"` // requests' and responses'
	NginxCPU       float64 `json:"nginxCPU"`       // cores busy with nginx's workers
	NewConnections float64 `json:"newConnectionsPerSecond"`
	Cores          int     `json:"cores"` // the CPUs the node gives the agent
}

// LoadWindow is about how far back Load's figures reach: each report moves
// them a share of the way to what was measured since the last one.
const LoadWindow = 30 * time.Second

// VRRPMaster is the State.VRRP value of an instance that owns its VIPs.
const VRRPMaster = "master"

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
	State    string  `json:"state"` // ready, draining, other site
	Local    bool    `json:"local,omitempty"`
	Share    float64 `json:"share"` // fraction of the ring
	Packets  uint64  `json:"packets"`
	MACKnown bool    `json:"macKnown"`
}

// BGPState is what a node in --announce=bgp mode publishes: how it announces
// (Preference), its sessions and their BFD state, and what it announces.
type BGPState struct {
	Preference string            `json:"preference"` // withdrawn, normal, depreferenced
	Peers      []BGPPeerStatus   `json:"peers"`
	Announced  []BGPAnnouncement `json:"announced"`
}

// BGP preferences, as BGPState.Preference and BGPAnnouncement.Preference name them.
const (
	PreferenceWithdrawn     = "withdrawn"
	PreferenceNormal        = "normal"
	PreferenceDepreferenced = "depreferenced"
)

// BGPPeerStatus is one peer's session.
type BGPPeerStatus struct {
	Addr  netip.Addr `json:"addr"`
	ASN   uint32     `json:"asn"`
	State string     `json:"state"` // idle, connect, active, opensent, openconfirm, established
	// EstablishedAt and UptimeSeconds are set while established.
	EstablishedAt time.Time `json:"established_at,omitzero"`
	UptimeSeconds float64   `json:"uptime_seconds,omitempty"`
	// BFD is up, down, init or admin-down; empty without BFD.
	BFD string `json:"bfd,omitempty"`
	// Received and Accepted count the peer's paths, over all families.
	Received uint64 `json:"received"`
	Accepted uint64 `json:"accepted"`
}

// BGPAnnouncement is a prefix and how it is announced.
type BGPAnnouncement struct {
	Prefix     netip.Prefix `json:"prefix"`
	Preference string       `json:"preference"`
}

// Owners names the agents whose VRRP instance for a VIP's family is Master.
func Owners(states []State, group string, vip netip.Addr) []string {
	fam := "v4"
	if vip.Is6() {
		fam = "v6"
	}
	var owners []string
	for _, st := range states {
		if st.Group == group && st.VRRP[group+"/"+fam] == VRRPMaster {
			owners = append(owners, st.Node)
		}
	}
	return owners
}
