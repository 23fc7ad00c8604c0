package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

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
			ReleaseOnCancel: c.cfg.ReleaseOnCancel, Name: c.cfg.LeaseName,
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
}

// IsLeader reports whether this instance currently makes the cluster-wide writes.
func (c *Controller) IsLeader() bool { return c.leader.Load() }

func (c *Controller) countWrite(what string, err error) {
	c.metrics.writes.WithLabelValues(what, result(err)).Inc()
}

// write makes the leader's cluster-wide writes on st (the cache with this leader's
// unseen writes overlaid) and returns the claims' problems. Each write changes the
// API server (never the cache); the resulting informer events trigger the next sync,
// which sees the new state.
func (c *Controller) write(ctx context.Context, st State, snap model.Snapshot, alloc allocation) ([]model.Problem, error) {
	var errs []error
	// VRIDs.
	for g, id := range alloc.vrids {
		_, err := c.annotate(ctx, "Service", g, AnnotationVRID, strconv.Itoa(int(id)), "VRIDAssigned", fmt.Sprintf("VRRP id %d", id))
		errs = append(errs, err)
	}
	// VIPs.
	for g, as := range alloc.vips {
		var v []string
		for _, a := range as {
			v = append(v, a.String())
		}
		vip := strings.Join(v, ",")
		_, err := c.annotate(ctx, "Service", g, AnnotationVIP, vip, "VIPAllocated", "VIP "+vip+" from the pools")
		errs = append(errs, err)
	}
	// Group Service status (LoadBalancer Services only: the API server refuses
	// status.loadBalancer.ingress on other types).
	groupVIPs := map[string][]netip.Addr{}
	for _, g := range snap.Groups {
		groupVIPs[g.Name] = g.VIPs
	}
	for _, s := range st.Services {
		if !IsGroup(s) || s.Spec.Type != corev1.ServiceTypeLoadBalancer {
			continue
		}
		want := lbIngress(groupVIPs[key(s)])
		if equality.Semantic.DeepEqual(s.Status.LoadBalancer.Ingress, want) {
			continue
		}
		cp := s.DeepCopy()
		cp.Status.LoadBalancer.Ingress = want
		_, err := c.cfg.Client.CoreV1().Services(s.Namespace).UpdateStatus(ctx, cp, metav1.UpdateOptions{})
		c.countWrite("service-status", err)
		errs = append(errs, ignoreGone(err))
	}
	// Scheduling.
	for ing, g := range Schedule(st.Ingresses, st.IngressClasses, st.Services) {
		_, err := c.annotate(ctx, "Ingress", ing, AnnotationGroup, g, "Scheduled", "bound to group "+g+" (fewest bound Ingresses among the matches)")
		errs = append(errs, err)
	}
	// Ingress status: the bound group's VIPs, nothing when unbound.
	classes := map[string]*networkingv1.IngressClass{}
	for _, cl := range st.IngressClasses {
		classes[cl.Name] = cl
	}
	allVIPs := map[string]bool{}
	for _, g := range snap.Groups {
		for _, a := range g.VIPs {
			allVIPs[a.String()] = true
		}
	}
	for _, ing := range st.Ingresses {
		bd := BindingOf(ing, classes)
		if !bd.Ours && !onlyOurVIPs(ing.Status.LoadBalancer.Ingress, allVIPs) {
			continue // another controller's Ingress (one Portico served before is cleared)
		}
		want := ingressLB(groupVIPs[bd.Group])
		if equality.Semantic.DeepEqual(ing.Status.LoadBalancer.Ingress, want) {
			continue
		}
		cp := ing.DeepCopy()
		cp.Status.LoadBalancer.Ingress = want
		_, err := c.cfg.Client.NetworkingV1().Ingresses(ing.Namespace).UpdateStatus(ctx, cp, metav1.UpdateOptions{})
		c.countWrite("ingress-status", err)
		errs = append(errs, ignoreGone(err))
	}
	problems, err := c.reconcileClaims(ctx, st, snap)
	errs = append(errs, err)
	return problems, errors.Join(errs...)
}
