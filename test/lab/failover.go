package lab

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/portico-edge/portico/test/netlab"
	"github.com/portico-edge/portico/test/traffic"
)

// FailoverResult is one measured edge death.
type FailoverResult struct {
	// Old is the VIP owner before the fault, New after it (the same when a
	// node other than the owner died).
	Old, New string
	Fault    time.Time // when the agent was killed
	// Outage is from the kill to the first reply to a fresh connection through
	// the VIP (probes every millisecond).
	Outage time.Duration
	// Conns counts long-lived connections held by replicas that survived the
	// failover, and Survived how many of them still answered afterwards.
	Conns, Survived int
}

// Failover opens conns long-lived connections, kills the owner's agent (-9) and
// cuts its link, and measures the outage and the surviving connections. The
// killed node is left down: Restore brings it back.
func (l *Lab) Failover(ctx context.Context, host string, conns int) (FailoverResult, *Node, error) {
	owner, err := l.Owner()
	if err != nil {
		return FailoverResult{}, nil, err
	}
	res, err := l.EdgeDeath(ctx, owner, host, conns)
	return res, owner, err
}

// EdgeDeath is Failover for any edge: the owner or another.
func (l *Lab) EdgeDeath(ctx context.Context, victim *Node, host string, conns int) (FailoverResult, error) {
	var res FailoverResult
	owner, err := l.Owner()
	if err != nil {
		return res, err
	}
	res.Old, res.New = owner.Name, owner.Name
	held, err := l.OpenKeepConns(ctx, host, conns)
	if err != nil {
		return res, fmt.Errorf("open long-lived connections: %w", err)
	}
	defer held.Close()
	if l.Agent(l.EdgeNo(victim)) == nil {
		return res, fmt.Errorf("no agent on %s", victim.Name)
	}
	killed := time.Now()
	res.Fault = killed
	if err := l.KillEdge(victim); err != nil {
		return res, err
	}
	// Probe: a new connection every millisecond, each with one request.
	deadline := killed.Add(10 * time.Second)
	for {
		if time.Now().After(deadline) {
			return res, fmt.Errorf("no reply through the VIP within 10 s of the kill")
		}
		if l.probe(ctx, host) {
			res.Outage = time.Since(killed)
			break
		}
		time.Sleep(time.Millisecond)
	}
	for wait := time.Now().Add(2 * time.Second); victim == owner && time.Now().Before(wait); time.Sleep(10 * time.Millisecond) {
		if n, err := l.newOwner(owner); err == nil {
			res.New = n.Name
			break
		}
	}
	for _, k := range held {
		if k.Edge == victim.Addr.Addr().String() {
			continue
		}
		res.Conns++
		if _, err := k.Do(host, "/after-failover", 3*time.Second); err == nil {
			res.Survived++
		}
	}
	return res, nil
}

// probe makes one short request on a new connection: true if it was answered.
func (l *Lab) probe(ctx context.Context, host string) bool {
	pctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	c, err := l.Dial(pctx, "tcp4", net.JoinHostPort(VIP.String(), "80"))
	if err != nil {
		return false
	}
	defer c.Close()
	k := traffic.NewKeepConn(c)
	_, err = k.Do(host, "/probe", 200*time.Millisecond)
	return err == nil
}

// Restore brings a node Failover killed back: link up, agent started, ready.
func (l *Lab) Restore(n *Node) error {
	if err := netlab.IP("-n", n.NS, "link", "set", "eth0", "up"); err != nil {
		return err
	}
	if _, err := l.StartAgent(l.EdgeNo(n)); err != nil {
		return err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := l.Ready(l.EdgeNo(n))
		if err == nil {
			_, err = l.Owner()
		}
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not back within 60 s: %w", n.Name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
