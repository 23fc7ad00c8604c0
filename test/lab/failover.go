package lab

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/portico-edge/portico/test/netlab"
)

// FailoverResult is one measured failover of the VIP owner.
type FailoverResult struct {
	Old, New string
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
	var res FailoverResult
	owner, err := l.Owner()
	if err != nil {
		return res, nil, err
	}
	res.Old = owner.Name
	held, err := l.OpenKeepConns(ctx, host, conns)
	if err != nil {
		return res, nil, fmt.Errorf("open long-lived connections: %w", err)
	}
	defer held.Close()
	a := l.Agent(l.EdgeNo(owner))
	if a == nil {
		return res, nil, fmt.Errorf("no agent on %s", owner.Name)
	}
	killed := time.Now()
	if err := a.Kill(syscall.SIGKILL, 5*time.Second); err != nil {
		return res, nil, err
	}
	if err := netlab.IP("-n", owner.NS, "link", "set", "eth0", "down"); err != nil {
		return res, nil, err
	}
	// Probe: a new connection every millisecond, each with one request.
	deadline := killed.Add(10 * time.Second)
	for {
		if time.Now().After(deadline) {
			return res, owner, fmt.Errorf("no reply through the VIP within 10 s of the kill")
		}
		if l.probe(ctx, host) {
			res.Outage = time.Since(killed)
			break
		}
		time.Sleep(time.Millisecond)
	}
	for wait := time.Now().Add(2 * time.Second); time.Now().Before(wait); time.Sleep(10 * time.Millisecond) {
		if n, err := l.newOwner(owner); err == nil {
			res.New = n.Name
			break
		}
	}
	for _, k := range held {
		if k.Edge == owner.Addr.Addr().String() {
			continue
		}
		res.Conns++
		if _, err := k.Do(host, "/after-failover", 3*time.Second); err == nil {
			res.Survived++
		}
	}
	return res, owner, nil
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
	k := &KeepConn{c: c, br: bufio.NewReader(c)}
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
