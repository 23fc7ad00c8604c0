package controlplane

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/retry"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
)

// elect campaigns for the Lease until ctx ends; leadership only gates the writes.
func (c *Controller) elect(ctx context.Context) {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: c.cfg.LeaseNamespace, Name: c.cfg.LeaseName},
		Client:     c.cfg.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: c.cfg.Identity},
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, LeaseDuration: c.cfg.LeaseDuration, RenewDeadline: c.cfg.RenewDeadline, RetryPeriod: c.cfg.RetryPeriod,
			Name: c.cfg.LeaseName, // no ReleaseOnCancel: releaseLease does it, bounded (below)
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) {
					c.log.Info("became leader", zap.String("identity", c.cfg.Identity))
					c.mu.Lock()
					c.reported = map[string]bool{}
					c.provisioned = map[types.UID]time.Time{}
					c.mu.Unlock()
					c.leader.Store(true)
					c.metrics.leader.Set(1)
					c.queue.Add(syncKey)
				},
				OnStoppedLeading: func() {
					c.leader.Store(false)
					c.metrics.leader.Set(0)
					c.log.Info("stopped leading", zap.String("identity", c.cfg.Identity))
				},
			},
		})
		if err != nil {
			c.log.Error("leader election config", zap.Error(err))
			return
		}
		le.Run(ctx)
	}
	if c.cfg.ReleaseOnCancel {
		c.releaseLease()
	}
}

// releaseLease gives the Lease up if this instance still holds it, within 2 s.
// client-go's own release (ReleaseOnCancel) is not used: it is best effort (a
// renewal cut short by the cancellation may have reached the API server, and
// the release then fails on the stale resourceVersion, leaving a successor to
// wait out LeaseDuration), and it waits up to RenewDeadline (10 s) for an API
// server that may be gone: an agent whose site's API server was down took more
// than 10 s to exit on SIGTERM (TestIntegrationLeaderStopsWithAPIDown).
func (c *Controller) releaseLease() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	leases := c.cfg.Client.CoordinationV1().Leases(c.cfg.LeaseNamespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l, err := leases.Get(ctx, c.cfg.LeaseName, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != c.cfg.Identity {
			return err // gone, released or someone else's
		}
		l.Spec.HolderIdentity = nil
		one := int32(1)
		l.Spec.LeaseDurationSeconds = &one
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		return err
	})
	if err != nil && !apierrors.IsNotFound(err) {
		c.log.Warn("release the leader Lease", zap.Error(err))
	}
}

// IsLeader reports whether this instance currently makes the cluster-wide writes.
func (c *Controller) IsLeader() bool { return c.leader.Load() }

func (c *Controller) countWrite(what string, err error) {
	c.metrics.writes.WithLabelValues(what, result(err)).Inc()
}

// write makes the leader's cluster-wide writes on st (the cache with this leader's
// unseen writes overlaid), from what Build made of it (snap, bindings), and returns
// the claims' problems. Each write changes the API server (never the cache); the
// resulting informer events trigger the next sync, which sees the new state.
func (c *Controller) write(ctx context.Context, st State, snap model.Snapshot, bindings Bindings, alloc allocation) ([]model.Problem, error) {
	var errs []error
	// VRIDs.
	for g, id := range alloc.vrids {
		_, err := c.annotate(ctx, "Service", g, v1alpha1.AnnotationVRID, strconv.Itoa(int(id)), "VRIDAssigned", fmt.Sprintf("VRRP id %d", id))
		errs = append(errs, err)
	}
	// VIPs.
	for g, as := range alloc.vips {
		var v []string
		for _, a := range as {
			v = append(v, a.String())
		}
		vip := strings.Join(v, ",")
		_, err := c.annotate(ctx, "Service", g, v1alpha1.AnnotationVIP, vip, "VIPAllocated", "VIP "+vip+" from the pools")
		errs = append(errs, err)
	}
	errs = append(errs, c.writeServiceStatus(ctx, st.Services, snap))
	// Scheduling.
	for _, s := range Schedule(st.Ingresses, bindings, st.Services, c.groupLoads(time.Now())) {
		_, err := c.annotate(ctx, "Ingress", s.Ingress, v1alpha1.AnnotationGroup, s.Group, "Scheduled", s.Reason)
		errs = append(errs, err)
	}
	errs = append(errs, c.writeIngressStatus(ctx, st.Ingresses, bindings, snap))
	problems, err := c.reconcileClaims(ctx, st, snap)
	errs = append(errs, err)
	return problems, errors.Join(errs...)
}
