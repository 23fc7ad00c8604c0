package controlplane

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/controlplane/model"
)

// Config wires a Controller. Client, Logger and Registerer are required.
type Config struct {
	Client  kubernetes.Interface
	Dynamic dynamic.Interface // for IngressClaims; nil disables them
	Logger  *zap.Logger
	// Registerer receives the metrics (namespace portico, subsystem controlplane).
	Registerer prometheus.Registerer

	// Namespace limits the namespaced informers to one namespace; "" watches all.
	Namespace string
	// Pools are the VIP ranges the leader allocates from, in order of preference.
	Pools []Pool
	// PodRouteGroup serves pod routes without a portico.io/group annotation.
	PodRouteGroup string
	// ReservedPorts are the edges' and nodes' own ports, which no L4 Service
	// may take (Options.ReservedPorts).
	ReservedPorts map[model.Port]string
	// GroupNamespaces are the namespaces where a Service labelled
	// portico.io/group=true is a group, and where IngressClaims are served (the
	// operator's; a claim provisions privileged agents). Elsewhere such a
	// Service is a plain one (reported), and a claim is refused. Empty: every
	// namespace.
	GroupNamespaces []string
	// Sinks receive every new snapshot.
	Sinks []Sink
	// ReadOnly makes an observer: it builds and publishes snapshots to its
	// sinks, and never campaigns for the Lease nor writes anything (no
	// allocations, statuses, claims or Events), so it needs read access alone:
	// the edges' agents, when the controller Deployment makes the writes.
	ReadOnly bool
	// AgentImage is the image of the DaemonSets IngressClaims provision (default:
	// deploy/agent.yaml's, which make manifests renders from the Makefile's
	// IMAGE_REPO and IMAGE_TAG).
	AgentImage string
	// AgentAPIServer is the API server address those DaemonSets' agents are given
	// (--apiserver), the provisioning agent's own; empty: the in-cluster Service.
	AgentAPIServer string
	// ClaimIface and ClaimNodeSelector place those DaemonSets' agents: the
	// edge interface ("": the manifest's) and the nodes, which a claim's own
	// selector may narrow but never widen (the operator's labels win). The
	// operator's alone: a claim's agents are privileged hostNetwork pods.
	ClaimIface        string
	ClaimNodeSelector map[string]string

	// Identity names this instance in the leader Lease (default: a random name).
	Identity string
	// LeaseNamespace and LeaseName locate the Lease (defaults Namespace or
	// "portico-system", and "portico-controlplane").
	LeaseNamespace, LeaseName string
	// Lease timing (defaults 15 s, 10 s, 2 s).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// ReleaseOnCancel gives the Lease up when Run's context ends, so a successor
	// need not wait for it to expire.
	ReleaseOnCancel bool
	// ResyncPeriod is the informers' resync (default 10 min).
	ResyncPeriod time.Duration
	// ServeTimeout bounds how long a new Ingress's address waits for every
	// edge of its group to serve it (default DefaultServeTimeout; see served.go).
	ServeTimeout time.Duration
	// SinkBackoff bounds the retry delay of a failing sink (defaults 50 ms, 30 s).
	SinkMinBackoff, SinkMaxBackoff time.Duration
}

// Controller watches the cluster, keeps the snapshot current for the sinks and, as
// leader, writes allocations, bindings and status back.
type Controller struct {
	cfg      Config
	log      *zap.Logger
	metrics  *metrics
	queue    workqueue.TypedRateLimitingInterface[string]
	fanout   *fanout
	recorder record.EventRecorder
	events   record.EventBroadcaster

	factories     []informers.SharedInformerFactory
	dynFactory    dynamicinformer.DynamicSharedInformerFactory
	synced        []cache.InformerSynced
	classes       cache.Indexer
	ingresses     cache.Indexer
	services      cache.Indexer
	slices        cache.Indexer
	secrets       cache.Indexer
	pods          cache.Indexer
	nodes         cache.Indexer
	claimInformer cache.SharedIndexInformer
	poolFactory   dynamicinformer.DynamicSharedInformerFactory // cluster-scoped VIPPools
	vipPools      cache.Indexer                                // nil: the CRD is not served
	namespaces    cache.Indexer
	agentLeases   cache.Indexer // the agents' status Leases
	// waits: since when each Ingress generation's first address waits for
	// the edges to serve it (leader's sync only).
	waits map[servedWait]time.Time
	// poolSizes memoizes each pool prefix's size (observePools; build only).
	poolSizes map[string]float64
	// memo carries what one build derived to the next (build only: the
	// queue never runs one key twice at once).
	memo Memo

	leader atomic.Bool

	mu           sync.Mutex
	last         model.Snapshot
	published    bool
	lastProblems []model.Problem
	// claimProblems are the problems of the leader's last writes (IngressClaims).
	claimProblems []model.Problem
	// reports are the agents' status reports the writer decoded, by Lease name.
	reports map[string]decodedReport
	// pending is the latest build's writes, for the writing worker (leader);
	// lastJob the latest build's, for writes without a build (wantWrite).
	pending, lastJob *writeJob
	reported         map[string]bool // problems already sent as Events (leader)
	// provisioned: when this leader last saw each claim's DaemonSet (by claim UID).
	provisioned map[types.UID]time.Time

	// written remembers the annotations this leader wrote until the cache shows them,
	// so a sync on a cache that lags its own writes builds on them and does not
	// allocate or schedule again.
	written map[writtenKey]written
}

// syncKey is the queue's key for builds: every change leads to one full rebuild,
// and changes that arrive while one is queued coalesce into it. writeKey is the
// leader's writes of the latest build, which a second worker makes meanwhile.
const (
	syncKey  = "cluster"
	writeKey = "write"
)

// New builds a Controller; Run starts it.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil || cfg.Logger == nil || cfg.Registerer == nil {
		return nil, errors.New("controlplane: Client, Logger and Registerer are required")
	}
	setDefault(&cfg.LeaseDuration, 15*time.Second)
	setDefault(&cfg.ServeTimeout, DefaultServeTimeout)
	setDefault(&cfg.RenewDeadline, 10*time.Second)
	setDefault(&cfg.RetryPeriod, 2*time.Second)
	setDefault(&cfg.ResyncPeriod, 10*time.Minute)
	setDefault(&cfg.SinkMinBackoff, 50*time.Millisecond)
	setDefault(&cfg.SinkMaxBackoff, 30*time.Second)
	if cfg.LeaseNamespace == "" {
		cfg.LeaseNamespace = cfg.Namespace
		if cfg.LeaseNamespace == "" {
			cfg.LeaseNamespace = "portico-system"
		}
	}
	if cfg.LeaseName == "" {
		cfg.LeaseName = "portico-controlplane"
	}
	if cfg.Identity == "" {
		cfg.Identity = "portico-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	}
	c := &Controller{
		cfg: cfg,
		log: cfg.Logger,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "portico-controlplane"}),
		reported:    map[string]bool{},
		provisioned: map[types.UID]time.Time{},
		written:     map[writtenKey]written{},
		waits:       map[servedWait]time.Time{},
	}
	m, err := newMetrics(cfg.Registerer, func() float64 { return float64(c.queue.Len()) })
	if err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	c.metrics = m
	c.fanout = newFanout(cfg.Sinks, c.log, m, cfg.SinkMinBackoff, cfg.SinkMaxBackoff)
	c.events = record.NewBroadcaster()
	c.recorder = c.events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "portico-controlplane", Host: cfg.Identity})

	nsOpt := informers.WithNamespace(cfg.Namespace)
	main := informers.NewSharedInformerFactoryWithOptions(cfg.Client, cfg.ResyncPeriod, nsOpt)
	// Only TLS Secrets, only microservice pods: the rest is never read.
	tlsSecrets := informers.NewSharedInformerFactoryWithOptions(cfg.Client, cfg.ResyncPeriod, nsOpt,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "type=" + string(corev1.SecretTypeTLS) }))
	podRoutes := informers.NewSharedInformerFactoryWithOptions(cfg.Client, cfg.ResyncPeriod, nsOpt,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = v1alpha1.LabelMicroservice + "=true" }))
	c.factories = []informers.SharedInformerFactory{main, tlsSecrets, podRoutes}

	for _, inf := range []struct {
		i   cache.SharedIndexInformer
		dst *cache.Indexer
	}{
		{main.Networking().V1().IngressClasses().Informer(), &c.classes},
		{main.Networking().V1().Ingresses().Informer(), &c.ingresses},
		{main.Core().V1().Services().Informer(), &c.services},
		{main.Discovery().V1().EndpointSlices().Informer(), &c.slices},
		{main.Core().V1().Nodes().Informer(), &c.nodes},
		{tlsSecrets.Core().V1().Secrets().Informer(), &c.secrets},
		{podRoutes.Core().V1().Pods().Informer(), &c.pods},
	} {
		if err := c.watch(inf.i); err != nil {
			return nil, err
		}
		*inf.dst = inf.i.GetIndexer()
	}
	if !cfg.ReadOnly { // only the leader's writes wait for the edges
		if err := c.watchAgents(); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// watchClaims adds the IngressClaim informer when the CRD is served (an informer on a
// missing resource would never sync). A CRD installed later needs a restart.
func (c *Controller) watchClaims() error {
	if ok, err := c.served(v1alpha1.IngressClaimResource, "IngressClaim CRD not installed: claims are not served"); !ok {
		return err
	}
	c.dynFactory = dynamicinformer.NewFilteredDynamicSharedInformerFactory(c.cfg.Dynamic, c.cfg.ResyncPeriod, c.cfg.Namespace, nil)
	c.claimInformer = c.dynFactory.ForResource(v1alpha1.IngressClaimResource).Informer()
	return c.watch(c.claimInformer)
}

// watchPools adds the VIPPool informer, and the Namespace informer the pools'
// selectors read, when the CRD is served. Without it, the --vip-pool flags are
// the only pools. A CRD installed later needs a restart.
func (c *Controller) watchPools() error {
	if ok, err := c.served(v1alpha1.VIPPoolResource, "VIPPool CRD not installed: the --vip-pool flags are the only VIP pools"); !ok {
		return err
	}
	c.poolFactory = dynamicinformer.NewDynamicSharedInformerFactory(c.cfg.Dynamic, c.cfg.ResyncPeriod)
	pools := c.poolFactory.ForResource(v1alpha1.VIPPoolResource).Informer()
	namespaces := informers.NewSharedInformerFactory(c.cfg.Client, c.cfg.ResyncPeriod)
	c.factories = append(c.factories, namespaces)
	ns := namespaces.Core().V1().Namespaces().Informer()
	for _, i := range []cache.SharedIndexInformer{pools, ns} {
		if err := c.watch(i); err != nil {
			return err
		}
	}
	c.vipPools, c.namespaces = pools.GetIndexer(), ns.GetIndexer()
	return nil
}

// served reports whether the API server serves resource r (an informer on a
// missing resource would never sync), logging missing when it does not.
func (c *Controller) served(r schema.GroupVersionResource, missing string) (bool, error) {
	if c.cfg.Dynamic == nil {
		return false, nil
	}
	gv := r.GroupVersion().String()
	list, err := c.cfg.Client.Discovery().ServerResourcesForGroupVersion(gv)
	if err != nil && !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("discover %s: %w", gv, err)
	}
	if list != nil {
		for _, res := range list.APIResources {
			if res.Name == r.Resource {
				return true, nil
			}
		}
	}
	c.log.Warn(missing, zap.String("resource", r.String()))
	return false, nil
}

func setDefault(d *time.Duration, v time.Duration) {
	if *d == 0 {
		*d = v
	}
}

func (c *Controller) watch(i cache.SharedIndexInformer) error {
	enqueue := func(any) { c.queue.Add(syncKey) }
	if _, err := i.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue,
		UpdateFunc: func(old, cur any) {
			if statusOnly(old, cur) {
				c.wantWrite()
				return
			}
			c.queue.Add(syncKey)
		},
		DeleteFunc: enqueue,
	}); err != nil {
		return fmt.Errorf("add event handler: %w", err)
	}
	c.synced = append(c.synced, i.HasSynced)
	return nil
}

// Run starts the informers, the sinks, leader election and the worker, and blocks
// until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	if !c.cfg.ReadOnly {
		c.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.cfg.Client.CoreV1().Events("")})
		defer c.events.Shutdown()
		if err := c.watchClaims(); err != nil {
			return err
		}
	}
	if err := c.watchPools(); err != nil {
		return err
	}
	for _, f := range c.factories {
		f.Start(ctx.Done())
	}
	for _, f := range []dynamicinformer.DynamicSharedInformerFactory{c.dynFactory, c.poolFactory} {
		if f != nil {
			f.Start(ctx.Done())
		}
	}
	defer func() {
		for _, f := range c.factories {
			f.Shutdown()
		}
		for _, f := range []dynamicinformer.DynamicSharedInformerFactory{c.dynFactory, c.poolFactory} {
			if f != nil {
				f.Shutdown()
			}
		}
	}()
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return fmt.Errorf("wait for informer caches: %w", ctx.Err())
	}
	c.log.Info("informer caches synced")

	var wg sync.WaitGroup
	defer wg.Wait()
	c.fanout.run(ctx, &wg)
	if !c.cfg.ReadOnly {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.elect(ctx)
		}()
	}
	for range 2 { // one builds while the other writes (the queue never runs a key twice at once)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c.processNext(ctx) {
			}
		}()
	}
	c.queue.Add(syncKey)
	<-ctx.Done()
	c.queue.ShutDown()
	return nil
}

// Problems returns the problems of the last build.
func (c *Controller) Problems() []model.Problem {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.lastProblems)
}

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

func list[T any](i cache.Indexer) []T {
	if i == nil {
		return nil
	}
	objs := i.List()
	out := make([]T, 0, len(objs))
	for _, o := range objs {
		if t, ok := o.(T); ok {
			out = append(out, t)
		}
	}
	return out
}

// state lists the caches. The objects are shared with the informers: read only.
func (c *Controller) state() State {
	return State{
		IngressClasses: list[*networkingv1.IngressClass](c.classes),
		Ingresses:      list[*networkingv1.Ingress](c.ingresses),
		Services:       list[*corev1.Service](c.services),
		EndpointSlices: list[*discoveryv1.EndpointSlice](c.slices),
		Secrets:        list[*corev1.Secret](c.secrets),
		Pods:           list[*corev1.Pod](c.pods),
		Nodes:          list[*corev1.Node](c.nodes),
		VIPPools:       c.listPools(),
		Namespaces:     list[*corev1.Namespace](c.namespaces),
	}
}

// listPools decodes the cached VIPPools; one that does not decode (the CRD's
// schema should not let it in) is logged and not used.
func (c *Controller) listPools() []*v1alpha1.VIPPool {
	if c.vipPools == nil {
		return nil
	}
	var out []*v1alpha1.VIPPool
	for _, o := range c.vipPools.List() {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		p := &v1alpha1.VIPPool{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, p); err != nil {
			c.log.Warn("VIPPool does not decode; not used", zap.String("pool", u.GetName()), zap.Error(err))
			continue
		}
		out = append(out, p)
	}
	return out
}

func (c *Controller) sync(ctx context.Context) error {
	job := c.build()
	if job == nil || !c.IsLeader() {
		return nil
	}
	return c.writeOut(ctx, job)
}

// statusOnly reports whether an update of an Ingress or a Service changed its
// status alone (Build never reads it): the leader's own address writes, which
// need no new build, only a look by the writer.
func statusOnly(old, cur any) bool {
	switch o := old.(type) {
	case *networkingv1.Ingress:
		n, ok := cur.(*networkingv1.Ingress)
		return ok && sameMeta(&o.ObjectMeta, &n.ObjectMeta) && equality.Semantic.DeepEqual(o.Spec, n.Spec)
	case *corev1.Service:
		n, ok := cur.(*corev1.Service)
		return ok && sameMeta(&o.ObjectMeta, &n.ObjectMeta) && equality.Semantic.DeepEqual(o.Spec, n.Spec)
	}
	return false
}

// sameMeta compares what Build reads of two versions of one object's metadata.
func sameMeta(o, n *metav1.ObjectMeta) bool {
	return o.Generation == n.Generation && maps.Equal(o.Annotations, n.Annotations) && maps.Equal(o.Labels, n.Labels) &&
		o.DeletionTimestamp.IsZero() == n.DeletionTimestamp.IsZero() && slices.Equal(o.Finalizers, n.Finalizers)
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

// writeJob is what one build asks the leader to write; the writer lists the
// caches again and allocates from them (writeOut).
type writeJob struct {
	snap     model.Snapshot
	bindings Bindings
	problems []model.Problem // of the build and the allocation
}

// build builds the snapshot, publishes it when it changed, and returns what the
// leader is to write from it; nil when the snapshot is invalid.
func (c *Controller) build() *writeJob {
	start := time.Now()
	defer func() { c.metrics.syncDuration.Observe(time.Since(start).Seconds()) }()
	// One state for the whole sync: the cache with this leader's writes that it
	// does not show yet, so that nothing is allocated or scheduled twice.
	st, notAllowed := allowedGroups(c.withWritten(c.state()), c.cfg.GroupNamespaces)
	snap, bindings, problems := BuildWith(&c.memo, st, Options{PodRouteGroup: c.cfg.PodRouteGroup, ReservedPorts: c.cfg.ReservedPorts,
		Pools: c.cfg.Pools, OperatorNamespaces: c.cfg.GroupNamespaces})
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
	alloc := c.allocate(st, &pools)
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
	job := &writeJob{snap: snap, bindings: bindings, problems: problems}
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
	claimProblems, err := c.write(ctx, st, job.snap, job.bindings, c.allocate(st, nil))
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

func (c *Controller) allocate(st State, pools *Pools) allocation {
	if pools == nil {
		p, _ := vipPools(c.cfg.Pools, st.VIPPools, st.Namespaces) // reported by the build
		pools = &p
	}
	vrids, problems := AllocateVRIDs(st.Services)
	vips, vipProblems := AllocateVIPs(st.Services, st.Nodes, *pools)
	return allocation{vrids: vrids, vips: vips, problems: append(problems, vipProblems...)}
}

// observePools sets the pools' usage from the snapshot the sinks serve.
func (c *Controller) observePools(pools Pools, snap model.Snapshot) {
	c.metrics.poolAddrs.Reset()
	// A pool's size takes up to 4,096 steps a prefix to count: once per pool,
	// not on every sync (an endpoint change is one). Only the build worker
	// runs this.
	if c.poolSizes == nil {
		c.poolSizes = map[string]float64{}
	}
	seen := map[string]bool{}
	size := func(p Pool) float64 {
		k := p.String()
		seen[k] = true
		n, ok := c.poolSizes[k]
		if !ok {
			n = p.size()
			c.poolSizes[k] = n
		}
		return n
	}
	usage := poolUsage(pools, snap, size)
	maps.DeleteFunc(c.poolSizes, func(k string, _ float64) bool { return !seen[k] })
	for k, v := range usage {
		c.metrics.poolAddrs.WithLabelValues(k[0], k[1], "used").Set(v[0])
		c.metrics.poolAddrs.WithLabelValues(k[0], k[1], "free").Set(v[1])
	}
}

func (c *Controller) observe(st State, problems []model.Problem) {
	for kind, n := range map[string]int{
		"IngressClass": len(st.IngressClasses), "Ingress": len(st.Ingresses), "Service": len(st.Services),
		"EndpointSlice": len(st.EndpointSlices), "Secret": len(st.Secrets), "Pod": len(st.Pods), "Node": len(st.Nodes),
	} {
		c.metrics.objects.WithLabelValues(kind).Set(float64(n))
	}
	if c.claimInformer != nil {
		c.metrics.objects.WithLabelValues("IngressClaim").Set(float64(len(c.claimInformer.GetStore().List())))
	}
	c.metrics.problems.Reset()
	for _, p := range problems {
		c.metrics.problems.WithLabelValues(string(p.Reason)).Inc()
	}
}
