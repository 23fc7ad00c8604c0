package controlplane

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/portico-edge/portico/controlplane/model"
)

// syncKey is the queue's key for builds: every change leads to one full rebuild,
// and changes that arrive while one is queued coalesce into it. writeKey is the
// leader's writes of the latest build, which a second worker makes meanwhile.
const (
	syncKey  = "cluster"
	writeKey = "write"
)

// processNext runs the queue's next key: a build, or the leader's writes of the
// latest one. It returns false once the queue shuts down.
func (c *Controller) processNext(ctx context.Context) bool {
	k, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(k)
	if k == syncKey {
		// Build and publish; the leader's writes go to the other worker, so that
		// a long run of writes (statuses of many new Ingresses, at the client's
		// rate limit) never holds back the next snapshot.
		if job := c.build(); job != nil && c.IsLeader() {
			c.mu.Lock()
			c.pending = job
			c.mu.Unlock()
			c.queue.Add(writeKey)
		}
		c.queue.Forget(k)
		return true
	}
	c.mu.Lock()
	job := c.pending
	c.pending = nil
	c.mu.Unlock()
	if job == nil || !c.IsLeader() { // leadership lost since the build: the next leader writes
		c.queue.Forget(k)
		return true
	}
	if err := c.writeOut(ctx, job); err != nil {
		if ctx.Err() != nil {
			return true
		}
		c.log.Warn("leader writes failed, retrying", zap.Error(err))
		c.mu.Lock()
		if c.pending == nil {
			c.pending = job
		}
		c.mu.Unlock()
		c.queue.AddRateLimited(k)
		return true
	}
	c.queue.Forget(k)
	return true
}

// wantWrite has the leader's writer look again at the last build (an agent's
// report of what its nginx serves changed, or a status did), without building
// again.
func (c *Controller) wantWrite() {
	if !c.IsLeader() {
		return
	}
	c.mu.Lock()
	if c.pending == nil {
		c.pending = c.lastJob
	}
	c.mu.Unlock()
	c.queue.Add(writeKey)
}

// sync builds and, as leader, writes what the build asks, in one go.
func (c *Controller) sync(ctx context.Context) error {
	job := c.build()
	if job == nil || !c.IsLeader() {
		return nil
	}
	return c.writeOut(ctx, job)
}

// writeJob is what one build asks the leader to write; the writer lists the
// caches again and allocates from them (writeOut).
type writeJob struct {
	snap     model.Snapshot
	bindings Bindings
	problems []model.Problem // of the build and the allocation
	gateways GatewayStatuses
}

// build builds the snapshot, publishes it when it changed, and returns what the
// leader is to write from it; nil when the snapshot is invalid.
func (c *Controller) build() *writeJob {
	start := time.Now()
	defer func() { c.metrics.syncDuration.Observe(time.Since(start).Seconds()) }()
	// One state for the whole sync: the cache with this leader's writes that it
	// does not show yet, so that nothing is allocated or scheduled twice.
	st, notAllowed := allowedGroups(c.withWritten(c.state()), c.cfg.GroupNamespaces)
	res := BuildAll(&c.memo, st, Options{PodRouteGroup: c.cfg.PodRouteGroup, ReservedPorts: c.cfg.ReservedPorts,
		Pools: c.cfg.Pools, OperatorNamespaces: c.cfg.GroupNamespaces})
	snap, bindings, problems := res.Snapshot, res.Bindings, res.Problems
	if err := snap.Validate(); err != nil {
		// A bug in Build, not a bad object: the sinks keep the last snapshot, and
		// nothing is written from this one.
		c.metrics.syncs.WithLabelValues("invalid").Inc()
		c.log.Error("built snapshot is invalid; not published", zap.Error(err))
		return nil
	}
	// Allocation is pure too: every instance computes it, so its problems show in
	// Problems() and the metrics everywhere; only the leader writes the result.
	// The pools are parsed once per sync: Build parses its own copy (it is pure).
	pools, _ := vipPools(c.cfg.Pools, st.VIPPools, st.Namespaces) // reported by the build
	alloc := c.allocate(st, &pools, GatewayAddresses(res.Gateways))
	problems = append(append(notAllowed, problems...), alloc.problems...)

	c.mu.Lock()
	// The first snapshot always goes out, even an empty one: sinks start from it.
	changed := !c.published || !snap.Equal(c.last)
	if changed {
		c.last, c.published = snap, true
	}
	all := append(slices.Clone(problems), c.claimProblems...)
	c.lastProblems = all
	c.mu.Unlock()
	if changed {
		c.fanout.publish(snap)
		c.metrics.syncs.WithLabelValues("changed").Inc()
		c.log.Debug("snapshot changed", zap.Int("groups", len(snap.Groups)), zap.Int("servers", len(snap.Servers)))
	} else {
		c.metrics.syncs.WithLabelValues("unchanged").Inc()
	}
	c.observe(st, all)
	c.observePools(pools, snap)
	job := &writeJob{snap: snap, bindings: bindings, problems: problems, gateways: res.Gateways}
	c.mu.Lock()
	c.lastJob = job
	c.mu.Unlock()
	return job
}

// writeOut makes the leader's writes of a build (annotations, statuses, claims)
// and reports its problems as Events.
func (c *Controller) writeOut(ctx context.Context, job *writeJob) error {
	// The caches as they are now, with this leader's writes, and what they
	// allocate: the build may be older than the writer's last writes, and a
	// user's own portico.io/vip written since must not be overwritten.
	st, _ := allowedGroups(c.withWritten(c.state()), c.cfg.GroupNamespaces)
	claimProblems, err := c.write(ctx, st, job.snap, job.bindings, c.allocate(st, nil, GatewayAddresses(job.gateways)))
	err = errors.Join(err, c.writeGatewayStatus(ctx, st, job.gateways, job.snap))
	all := append(slices.Clone(job.problems), claimProblems...)
	c.report(all)
	if err != nil {
		c.metrics.syncs.WithLabelValues("error").Inc()
	}
	c.mu.Lock()
	c.claimProblems, c.lastProblems = claimProblems, all
	c.mu.Unlock()
	return err
}

// allocation is what the leader would allocate on this sync.
type allocation struct {
	vrids    map[string]uint8
	vips     map[string][]netip.Addr
	problems []model.Problem
}

func (c *Controller) allocate(st State, pools *Pools, gateways []netip.Addr) allocation {
	if pools == nil {
		p, _ := vipPools(c.cfg.Pools, st.VIPPools, st.Namespaces) // reported by the build
		pools = &p
	}
	vrids, problems := AllocateVRIDs(st.Services)
	vips, vipProblems := AllocateVIPs(st.Services, st.Nodes, *pools, gateways...)
	return allocation{vrids: vrids, vips: vips, problems: append(problems, vipProblems...)}
}
