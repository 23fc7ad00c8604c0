package controlplane

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/portico-edge/portico/api/agentstatus"
	"github.com/portico-edge/portico/controlplane/model"
)

// An Ingress gets its address in status only once its routes are served: tools
// that take "has an address" for "ready" (CD pipelines, conformance runners,
// kubectl wait) would otherwise send requests before nginx has the routes. Every
// agent publishes, in its status Lease, the generation of each of its group's
// Ingresses its nginx serves (agentstatus.State.Served); the leader writes an
// Ingress's first address once every edge of its group with a ready replica
// serves that generation, or, if one lags, after Config.ServeTimeout with a Warning Event
// naming the lagging edges. A group no agent reports on (none runs yet, or the
// controller runs alone) has nothing to wait for. An address already written
// stays while the Ingress changes: a change of routes is not an outage.

const (
	// DefaultServeTimeout bounds the wait for every edge to serve an Ingress.
	DefaultServeTimeout = 30 * time.Second
)

// agentReport is the part of an agent's published state the leader reads.
type agentReport struct {
	Node   string            `json:"node"`
	Group  string            `json:"group"`
	Served map[string]int64  `json:"served"`
	Load   *agentstatus.Load `json:"load"`
}

// reportOf parses a status Lease; ok is false for one that is not an agent's,
// cannot be read, or has not been renewed within its duration (a dead agent's).
func reportOf(l *coordinationv1.Lease, now time.Time) (agentReport, bool) {
	r, ok := decodeReport(l)
	return r, ok && renewed(l, now)
}

// decodeReport reads the report in an agent's status Lease.
func decodeReport(l *coordinationv1.Lease) (agentReport, bool) {
	var r agentReport
	s, has := l.Annotations[agentstatus.AnnotationState]
	return r, has && json.Unmarshal([]byte(s), &r) == nil && r.Node != ""
}

// renewed reports whether the agent renewed its Lease recently enough at now.
func renewed(l *coordinationv1.Lease, now time.Time) bool {
	return l.Spec.RenewTime != nil && l.Spec.LeaseDurationSeconds != nil &&
		!now.After(l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second))
}

// decoded is reportOf(l, now), decoding each version of a Lease once: the leader
// asks every agent's report for every Ingress it writes an address of. Only the
// writer calls it.
func (c *Controller) decoded(l *coordinationv1.Lease, now time.Time) (agentReport, bool) {
	e, ok := c.reports[l.Name]
	if !ok || e.version != l.ResourceVersion {
		r, valid := decodeReport(l)
		e = decodedReport{version: l.ResourceVersion, report: r, valid: valid}
		if c.reports == nil || len(c.reports) > 4096 {
			c.reports = map[string]decodedReport{} // Leases that come and go: start over
		}
		c.reports[l.Name] = e
	}
	return e.report, e.valid && renewed(l, now)
}

type decodedReport struct {
	version string
	report  agentReport
	valid   bool
}

// watchAgents adds the informer on the agents' status Leases (in the lease
// namespace). A renewal that changes nothing the leader reads queues no sync.
func (c *Controller) watchAgents() error {
	f := informers.NewSharedInformerFactoryWithOptions(c.cfg.Client, c.cfg.ResyncPeriod,
		informers.WithNamespace(c.cfg.LeaseNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = agentstatus.Selector }))
	i := f.Coordination().V1().Leases().Informer()
	enqueue := func(any) { c.queue.Add(syncKey) }
	// The report of each Lease's version the handler saw last, so that an
	// update decodes its new version only: a report lists every Ingress of
	// the group, and every agent publishes one every few seconds and after
	// each change it serves. The informer calls the handler from one goroutine.
	seen := map[string]decodedReport{}
	report := func(l *coordinationv1.Lease) agentReport {
		if e, ok := seen[l.Name]; ok && e.version == l.ResourceVersion {
			return e.report
		}
		r, _ := decodeReport(l)
		return r
	}
	if _, err := i.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue,
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*coordinationv1.Lease)
			n, ok2 := cur.(*coordinationv1.Lease)
			if !ok1 || !ok2 {
				return
			}
			if o.Annotations[agentstatus.AnnotationState] == n.Annotations[agentstatus.AnnotationState] {
				// A renewal: the report is the same, and decoding it twice (it
				// lists every Ingress of the group) is the cost of every renewal
				// of every agent.
				return
			}
			ro, rn := report(o), report(n)
			seen[n.Name] = decodedReport{version: n.ResourceVersion, report: rn}
			if ro.Group != rn.Group {
				c.queue.Add(syncKey)
			} else if !maps.Equal(ro.Served, rn.Served) {
				c.wantWrite() // only the leader's address writes wait for it
			}
		},
		DeleteFunc: func(obj any) {
			if l, ok := obj.(*coordinationv1.Lease); ok {
				delete(seen, l.Name)
			} else if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				_, name, _ := cache.SplitMetaNamespaceKey(d.Key)
				delete(seen, name)
			}
			enqueue(obj)
		},
	}); err != nil {
		return fmt.Errorf("add event handler: %w", err)
	}
	c.factories = append(c.factories, f)
	c.synced = append(c.synced, i.HasSynced)
	c.agentLeases = i.GetIndexer()
	return nil
}

// lagging returns the edges of g that do not serve ing's generation yet, and
// how many edges it waited for: those whose replica is ready in the snapshot
// (they get new connections) and whose agent reports. An agent's own health is
// not asked: it is published every few seconds and lags its nginx.
func (c *Controller) lagging(k string, gen int64, g model.Group, now time.Time) (lag []string, edges int) {
	if c.agentLeases == nil {
		return nil, 0
	}
	ready := map[string]bool{}
	for _, r := range g.Replicas {
		if r.State == model.Ready && r.Node != "" {
			ready[r.Node] = true
		}
	}
	for _, o := range c.agentLeases.List() {
		l, ok := o.(*coordinationv1.Lease)
		if !ok {
			continue
		}
		r, ok := c.decoded(l, now)
		if !ok || r.Group != g.Name || !ready[r.Node] {
			continue
		}
		edges++
		if r.Served[k] < gen {
			lag = append(lag, r.Node)
		}
	}
	slices.Sort(lag)
	return lag, edges
}

// readyForAddress reports whether ing's first address may be written now.
func (c *Controller) readyForAddress(ing *networkingv1.Ingress, g model.Group) bool {
	return c.everyEdgeServes(key(ing), ing.Generation, g, ing)
}

// everyEdgeServes reports whether every edge of g serves generation gen of the
// object the agents report as k (obj, for an Event). While edges lag it records
// since when, and asks for a sync when the bound ends; after it, it says yes
// all the same, with a Warning Event on obj.
func (c *Controller) everyEdgeServes(k string, gen int64, g model.Group, obj runtime.Object) bool {
	now := time.Now()
	lag, edges := c.lagging(k, gen, g, now)
	w := servedWait{k, gen}
	since, waiting := c.waits[w]
	if len(lag) == 0 {
		if waiting {
			delete(c.waits, w)
			c.log.Info("served by every edge", zap.String("object", w.ingress),
				zap.Int64("generation", w.generation), zap.Int("edges", edges), zap.Duration("waited", now.Sub(since)))
		}
		return true
	}
	if !waiting {
		since = now
		c.waits[w] = since
	}
	timeout := c.cfg.ServeTimeout
	if left := timeout - now.Sub(since); left > 0 {
		c.queue.AddAfter(syncKey, left)
		return false
	}
	delete(c.waits, w)
	msg := fmt.Sprintf("edges %s did not serve generation %d within %v: status written anyway", strings.Join(lag, ", "), gen, timeout)
	c.recorder.Event(obj, corev1.EventTypeWarning, "EdgesNotServing", msg)
	c.log.Warn("status written before every edge serves it", zap.String("object", w.ingress), zap.Strings("lagging", lag))
	return true
}

// groupLoads adds up, by group, the load the agents with a fresh status Lease
// report (Schedule's headroom).
func (c *Controller) groupLoads(now time.Time) map[string]GroupLoad {
	if c.agentLeases == nil {
		return nil
	}
	out := map[string]GroupLoad{}
	for _, o := range c.agentLeases.List() {
		l, ok := o.(*coordinationv1.Lease)
		if !ok {
			continue
		}
		r, ok := c.decoded(l, now)
		if !ok || r.Load == nil || r.Load.Cores <= 0 {
			continue
		}
		g := out[r.Group]
		g.Edges++
		g.Cores += r.Load.Cores
		g.Requests += r.Load.Requests
		g.Bytes += r.Load.Bytes
		g.NginxCPU += r.Load.NginxCPU
		g.NewConnections += r.Load.NewConnections
		out[r.Group] = g
	}
	return out
}

// servedWait is one Ingress generation whose address waits for the edges.
type servedWait struct {
	ingress    string // the Ingress's "namespace/name", or another kind's "Kind namespace/name"
	generation int64
}
