// Package bgpfile is the agent's BGP configuration file in --announce=bgp mode:
// the chart renders it from its bgp values into a ConfigMap, the agents read it
// (--bgp-config). A leaf: it imports nothing of Portico, so what writes or checks
// the file never links the BGP speaker.
package bgpfile

import (
	"fmt"
	"os"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// File is the agent's BGP configuration in --announce=bgp mode: the file the
// chart renders from its bgp values into a ConfigMap (one for every edge node;
// peers can be limited to some nodes). Durations are Go durations ("50ms", "9s").
type File struct {
	// ASN is the edges' autonomous system number (every edge the same).
	ASN uint32 `json:"asn"`
	// RouterID defaults to the node's IPv4 address on the edge interface.
	RouterID string `json:"routerID,omitempty"`
	// GracefulRestart (default false, as MetalLB's): the routers keep this edge's
	// routes for RestartTime when its session drops. That spares the ECMP rehash of
	// an agent restart, which Portico does not need (every edge steers a flow to
	// the same replica), and keeps a dead edge's routes as long: a router in
	// graceful-restart helper mode does not drop them when BFD or the hold timer
	// finds the session down. Without it a restarting agent's routes go at once
	// (its session ends with a Cease), the other edges take its flows, and it
	// announces again within seconds of starting.
	GracefulRestart *bool            `json:"gracefulRestart,omitempty"`
	RestartTime     *metav1.Duration `json:"restartTime,omitempty"`
	// NextHop6 is this node's IPv6 next hop, needed to announce IPv6 VIPs over
	// IPv4 sessions. Per node, so usually given by flag instead (--bgp-nexthop6).
	NextHop6 string `json:"nextHop6,omitempty"`
	// WithdrawAfter is how long an unhealthy node stays announced, de-preferenced,
	// before it withdraws (default 10s): a short hiccup moves only new flows away.
	WithdrawAfter *metav1.Duration `json:"withdrawAfter,omitempty"`
	BFDProfiles   []BFDProfile     `json:"bfdProfiles,omitempty"`
	Peers         []Peer           `json:"peers"`
}

// BFDProfile is a named set of BFD timers, as MetalLB's BFDProfile.
type BFDProfile struct {
	Name             string          `json:"name"`
	TransmitInterval metav1.Duration `json:"transmitInterval"`
	ReceiveInterval  metav1.Duration `json:"receiveInterval"`
	DetectMultiplier uint8           `json:"detectMultiplier"`
}

// Peer is one router the edges peer with, as MetalLB's BGPPeer.
type Peer struct {
	Address           string           `json:"address"`
	ASN               uint32           `json:"asn"`
	Port              uint16           `json:"port,omitempty"`
	Password          string           `json:"password,omitempty"`
	HoldTime          *metav1.Duration `json:"holdTime,omitempty"`
	KeepaliveInterval *metav1.Duration `json:"keepaliveInterval,omitempty"`
	BFDProfile        string           `json:"bfdProfile,omitempty"`
	Communities       []string         `json:"communities,omitempty"`
	LocalPref         uint32           `json:"localPref,omitempty"`
	// Nodes limits the peer to these nodes (by name); empty: every edge node.
	Nodes []string `json:"nodes,omitempty"`
}

// Load reads a File (YAML or JSON), rejecting unknown fields.
func Load(path string) (File, error) {
	var f File
	b, err := os.ReadFile(path)
	if err != nil {
		return f, fmt.Errorf("read bgp config: %w", err)
	}
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return f, fmt.Errorf("bgp config %s: %w", path, err)
	}
	return f, nil
}
