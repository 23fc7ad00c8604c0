package cluster

import (
	"context"
	"fmt"
	"slices"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/test/traffic"
)

// LivenessBound is what the agents' liveness defaults promise: a replica that can no
// longer serve gets no new flows 300 ms after the fault.
const LivenessBound = 300 * time.Millisecond

// NodeDeath is what the clients saw when the VIP owner died (KillOwner).
type NodeDeath struct {
	Node *Node
	// Takeover is how long after the fault the client sent to another node (its
	// ARP entry for the VIP changed with the new owner's gratuitous ARP).
	Takeover time.Duration
	// CaughtUp is how long after the fault Kubernetes saw the death: the node
	// NotReady and its agent's endpoint not ready (0 when not waited for).
	CaughtUp time.Duration
	// AfterTakeover is what a request on every held connection on a surviving
	// replica found right after the takeover, each with HeldAnswer to answer;
	// AtEnd, after Kubernetes caught up.
	AfterTakeover, AtEnd HeldCheck
	// New counts the new connections (one every 5 ms, 500 ms to answer) from the
	// fault on; AfterBound those from Takeover + LivenessBound after it on, less
	// the ones that connected and were answered late (Unanswered: slowness under
	// load, not a lost flow: a flow sent to a replica without it is reset, and
	// one sent to the dead node never connects).
	New, AfterBound traffic.Failures
	// Unanswered is how many after the bound connected but got no answer in time,
	// and LateAnswers when their answers came after all (traffic.LateAnswers).
	Unanswered  int
	LateAnswers string
	// Said is what the surviving agents logged about liveness, rings and VRRP
	// (and every warning and error) from a second before the first failure
	// after the bound to a second after the last; empty when none failed.
	Said string
}

// HeldAnswer is how soon after the takeover every held connection on a surviving
// replica must answer.
const HeldAnswer = time.Second

func (d NodeDeath) String() string {
	s := fmt.Sprintf("takeover %v; long-lived connections on surviving replicas: %v within %v of the takeover, %v at the end; %v",
		d.Takeover.Round(time.Millisecond), d.AfterTakeover, HeldAnswer, d.AtEnd, d.New)
	if d.CaughtUp > 0 {
		s += fmt.Sprintf("; Kubernetes saw it %.1f s after the fault, and from %v after it %v (and %d answered late)",
			d.CaughtUp.Seconds(), (d.Takeover + LivenessBound).Round(time.Millisecond), d.AfterBound, d.Unanswered)
	}
	if d.LateAnswers != "" {
		s += "; " + d.LateAnswers
	}
	return s
}

// KillOwner kills the VIP owner as a machine dies (Cluster.Kill: kubelet and
// containerd killed, link cut; its pods' processes never get a signal) with clients
// running: the held connections and a stream of new ones. It waits for the client
// to send to a new owner, then asks every held connection on a surviving replica
// at once (HeldAnswer each), and, with waitCaughtUp, waits for Kubernetes to mark
// the node NotReady and its agent's endpoint not ready, then 5 s more, and asks
// them again. The dead node leaves p.Edges.
func (p *Portico) KillOwner(ctx context.Context, held Held, waitCaughtUp bool) (NodeDeath, error) {
	owner, err := p.Owner(GroupVIP)
	if err != nil {
		return NodeDeath{}, err
	}
	d := NodeDeath{Node: owner}
	logs := p.RecordAgentLogs(ctx, "portico-agent")
	defer logs.Stop()
	stream := p.StartStream(ctx, "web.example", traffic.StreamOptions{Every: 5 * time.Millisecond, For: 3 * time.Minute, Late: 8 * time.Second})
	stopped := false
	defer func() {
		if !stopped {
			stream.Stop()
		}
	}()
	time.Sleep(time.Second)
	fault := time.Now()
	if err := p.C.Kill(owner); err != nil {
		return d, err
	}
	p.Edges = slices.DeleteFunc(slices.Clone(p.Edges), func(n *Node) bool { return n == owner })
	if err := until(ctx, fault.Add(5*time.Second), func() error {
		n, err := p.Owner(GroupVIP)
		if err == nil && n == owner {
			err = fmt.Errorf("the client still sends to %s", owner.Name)
		}
		return err
	}); err != nil {
		return d, err
	}
	d.Takeover = time.Since(fault)
	d.AfterTakeover = p.Check(ctx, held, HeldAnswer, owner)
	if waitCaughtUp {
		if err := until(ctx, fault.Add(time.Minute), func() error { return p.deadToKubernetes(ctx, owner) }); err != nil {
			return d, err
		}
		d.CaughtUp = time.Since(fault)
		time.Sleep(5 * time.Second)
	}
	atts := stream.Stop()
	stopped = true
	d.New = traffic.FailuresAround(atts, fault)
	after := traffic.FailuresAround(atts, fault.Add(d.Takeover+LivenessBound))
	d.AfterBound = traffic.FailuresAround(traffic.Hard(atts), fault.Add(d.Takeover+LivenessBound))
	d.Unanswered = after.Unanswered
	d.LateAnswers = traffic.LateAnswers(atts, fault.Add(d.Takeover+LivenessBound))
	if f := d.AfterBound; f.Failed > 0 {
		at := fault.Add(d.Takeover + LivenessBound)
		d.Said = logs.LinesBetween(at.Add(f.First-time.Second), at.Add(f.Last+time.Second),
			`"level":"warn"`, `"level":"error"`, "liveness", "ring follows", "vrrp state changed", "data plane applied")
	}
	d.AtEnd = p.Check(ctx, held, 3*time.Second, owner)
	return d, nil
}

// deadToKubernetes returns nil once node n is NotReady and its agent is not a ready
// endpoint of the group.
func (p *Portico) deadToKubernetes(ctx context.Context, n *Node) error {
	node, err := p.C.Kube.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if NodeReady(node) {
		return fmt.Errorf("%s is still Ready", n.Name)
	}
	list, err := p.C.Kube.DiscoveryV1().EndpointSlices(PorticoNamespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=edge"})
	if err != nil {
		return err
	}
	for _, es := range list.Items {
		for _, ep := range es.Endpoints {
			if ep.NodeName != nil && *ep.NodeName == n.Name && (ep.Conditions.Ready == nil || *ep.Conditions.Ready) {
				return fmt.Errorf("the agent on %s is still a ready endpoint", n.Name)
			}
		}
	}
	return nil
}
