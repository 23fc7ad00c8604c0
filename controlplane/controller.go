package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
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
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

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
	// Sinks receive every new snapshot.
	Sinks []Sink
	// AgentImage is the image of the DaemonSets IngressClaims provision.
	AgentImage string

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

	leader atomic.Bool

	mu           sync.Mutex
	last         model.Snapshot
	published    bool
	lastProblems []model.Problem
	reported     map[string]bool // problems already sent as Events (leader)
	// provisioned: when this leader last saw each claim's DaemonSet (by claim UID).
	provisioned map[types.UID]time.Time

	// written remembers the annotations this leader wrote until the cache shows them,
	// so a sync on a cache that lags its own writes does not allocate or schedule again.
	written map[writtenKey]written
}

// syncKey is the one key in the queue: every change leads to one full rebuild, and
// changes that arrive while one is queued coalesce into it.
const syncKey = "cluster"

// New builds a Controller; Run starts it.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil || cfg.Logger == nil || cfg.Registerer == nil {
		return nil, errors.New("controlplane: Client, Logger and Registerer are required")
	}
	setDefault(&cfg.LeaseDuration, 15*time.Second)
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
	if cfg.AgentImage == "" {
		cfg.AgentImage = "ghcr.io/portico-edge/portico:latest"
	}
	c := &Controller{
		cfg: cfg,
		log: cfg.Logger,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "portico-controlplane"}),
		reported:    map[string]bool{},
		provisioned: map[types.UID]time.Time{},
		written:     map[writtenKey]written{},
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
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelMicroservice + "=true" }))
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
	return c, nil
}

// watchClaims adds the IngressClaim informer when the CRD is served (an informer on a
// missing resource would never sync). A CRD installed later needs a restart.
func (c *Controller) watchClaims() error {
	if c.cfg.Dynamic == nil {
		return nil
	}
	gv := ClaimResource.GroupVersion().String()
	list, err := c.cfg.Client.Discovery().ServerResourcesForGroupVersion(gv)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("discover %s: %w", gv, err)
	}
	served := false
	if list != nil {
		for _, r := range list.APIResources {
			served = served || r.Name == ClaimResource.Resource
		}
	}
	if !served {
		c.log.Warn("IngressClaim CRD not installed: claims are not served", zap.String("resource", ClaimResource.String()))
		return nil
	}
	c.dynFactory = dynamicinformer.NewFilteredDynamicSharedInformerFactory(c.cfg.Dynamic, c.cfg.ResyncPeriod, c.cfg.Namespace, nil)
	c.claimInformer = c.dynFactory.ForResource(ClaimResource).Informer()
	return c.watch(c.claimInformer)
}

func setDefault(d *time.Duration, v time.Duration) {
	if *d == 0 {
		*d = v
	}
}

func (c *Controller) watch(i cache.SharedIndexInformer) error {
	enqueue := func(any) { c.queue.Add(syncKey) }
	if _, err := i.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, _ any) { c.queue.Add(syncKey) },
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
	c.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.cfg.Client.CoreV1().Events("")})
	defer c.events.Shutdown()

	if err := c.watchClaims(); err != nil {
		return err
	}
	for _, f := range c.factories {
		f.Start(ctx.Done())
	}
	if c.dynFactory != nil {
		c.dynFactory.Start(ctx.Done())
	}
	defer func() {
		for _, f := range c.factories {
			f.Shutdown()
		}
		if c.dynFactory != nil {
			c.dynFactory.Shutdown()
		}
	}()
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return fmt.Errorf("wait for informer caches: %w", ctx.Err())
	}
	c.log.Info("informer caches synced")

	var wg sync.WaitGroup
	defer wg.Wait()
	c.fanout.run(ctx, &wg)
	wg.Add(2)
	go func() {
		defer wg.Done()
		c.elect(ctx)
	}()
	go func() {
		defer wg.Done()
		for c.processNext(ctx) {
		}
	}()
	c.queue.Add(syncKey)
	<-ctx.Done()
	c.queue.ShutDown()
	return nil
}

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
	if err := c.sync(ctx); err != nil {
		if ctx.Err() != nil {
			return true
		}
		c.log.Warn("sync failed, retrying", zap.Error(err))
		c.queue.AddRateLimited(k)
		return true
	}
	c.queue.Forget(k)
	return true
}

func list[T any](i cache.Indexer) []T {
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
	}
}

func (c *Controller) sync(ctx context.Context) error {
	start := time.Now()
	defer func() { c.metrics.syncDuration.Observe(time.Since(start).Seconds()) }()
	st := c.state()
	snap, problems := Build(st, Options{PodRouteGroup: c.cfg.PodRouteGroup})
	// Allocation is pure too: every instance computes it, so its problems show in
	// Problems() and the metrics everywhere; only the leader writes the result.
	wst := c.withWritten(st)
	alloc := c.allocate(wst)
	problems = append(problems, alloc.problems...)

	c.mu.Lock()
	// The first snapshot always goes out, even an empty one: sinks start from it.
	changed := !c.published || !snap.Equal(c.last)
	if changed {
		c.last, c.published = snap, true
	}
	c.mu.Unlock()
	if changed {
		c.fanout.publish(snap)
		c.metrics.syncs.WithLabelValues("changed").Inc()
		c.log.Debug("snapshot changed", zap.Int("groups", len(snap.Groups)), zap.Int("servers", len(snap.Servers)))
	} else {
		c.metrics.syncs.WithLabelValues("unchanged").Inc()
	}
	var err error
	if c.IsLeader() {
		var claimProblems []model.Problem
		claimProblems, err = c.write(ctx, wst, snap, alloc)
		problems = append(problems, claimProblems...)
		c.report(problems)
		if err != nil {
			c.metrics.syncs.WithLabelValues("error").Inc()
		}
	}
	c.observe(st, problems)
	c.mu.Lock()
	c.lastProblems = problems
	c.mu.Unlock()
	return err
}

// allocation is what the leader would allocate on this sync.
type allocation struct {
	vrids    map[string]uint8
	vips     map[string][]netip.Addr
	problems []model.Problem
}

func (c *Controller) allocate(st State) allocation {
	vrids, problems := AllocateVRIDs(st.Services)
	vips, vipProblems := AllocateVIPs(st.Services, c.cfg.Pools)
	return allocation{vrids: vrids, vips: vips, problems: append(problems, vipProblems...)}
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
		c.metrics.problems.WithLabelValues(p.Reason).Inc()
	}
}

// report sends each new problem as a Warning Event on its object, once while it
// lasts (leader only, so the agents do not repeat each other). Every problem goes
// through it: Build's, allocation's and the claims'.
func (c *Controller) report(problems []model.Problem) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := map[string]bool{}
	for _, p := range problems {
		k := p.String()
		now[k] = true
		if c.reported[k] {
			continue
		}
		if ref := problemRef(p); ref != nil {
			c.recorder.Event(ref, corev1.EventTypeWarning, p.Reason, strings.TrimSpace(p.Field+": "+p.Detail))
		}
		c.log.Warn("problem", zap.String("object", p.Object), zap.String("field", p.Field), zap.String("reason", p.Reason), zap.String("detail", p.Detail))
	}
	c.reported = now
}

// problemRef turns a Problem's "Kind namespace/name" into an object reference.
func problemRef(p model.Problem) *corev1.ObjectReference {
	kind, obj, ok := strings.Cut(p.Object, " ")
	if !ok {
		return nil
	}
	ns, name, ok := strings.Cut(obj, "/")
	if !ok {
		ns, name = "", obj
	}
	return objRef(kind, ns, name)
}

// objRef references an object for an Event; nil for kinds Portico does not report on.
func objRef(kind, ns, name string) *corev1.ObjectReference {
	api := map[string]string{"Ingress": "networking.k8s.io/v1", "IngressClass": "networking.k8s.io/v1",
		"Service": "v1", "Pod": "v1", "Secret": "v1", "Node": "v1",
		"IngressClaim": ClaimResource.GroupVersion().String()}[kind]
	if api == "" {
		return nil
	}
	return &corev1.ObjectReference{APIVersion: api, Kind: kind, Namespace: ns, Name: name}
}

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

// onlyOurVIPs reports whether an Ingress status lists addresses and all are Portico
// VIPs: what Portico wrote for an Ingress that has since moved to another class.
func onlyOurVIPs(lb []networkingv1.IngressLoadBalancerIngress, vips map[string]bool) bool {
	for _, e := range lb {
		if e.Hostname != "" || !vips[e.IP] {
			return false
		}
	}
	return len(lb) > 0
}

func lbIngress(vips []netip.Addr) []corev1.LoadBalancerIngress {
	var out []corev1.LoadBalancerIngress
	for _, a := range vips {
		// The API server defaults ipMode to VIP; say so, or every sync would differ.
		out = append(out, corev1.LoadBalancerIngress{IP: a.String(), IPMode: ptrTo(corev1.LoadBalancerIPModeVIP)})
	}
	return out
}

func ingressLB(vips []netip.Addr) []networkingv1.IngressLoadBalancerIngress {
	var out []networkingv1.IngressLoadBalancerIngress
	for _, a := range vips {
		out = append(out, networkingv1.IngressLoadBalancerIngress{IP: a.String()})
	}
	return out
}

func ignoreGone(err error) error {
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		// Deleted or changed since the cache saw it: the informer event brings the
		// next sync, which retries with the new object.
		return nil
	}
	return err
}

// annotate sets one annotation on a Service or Ingress ("namespace/name") and, only
// when the patch applied (not on an object deleted since the cache saw it), records
// reason as a Normal Event on the object and logs the decision. It reports whether the
// patch applied.
func (c *Controller) annotate(ctx context.Context, kind, object, ann, value, reason, message string) (bool, error) {
	ns, name, _ := strings.Cut(object, "/")
	applied, err := c.patchAnnotation(ctx, kind, ns, name, ann, value)
	if applied {
		c.recorder.Event(objRef(kind, ns, name), corev1.EventTypeNormal, reason, message)
		c.log.Info(message, zap.String("reason", reason), zap.String("object", kind+" "+object),
			zap.String("annotation", ann), zap.String("value", value))
	}
	return applied, err
}

// patchAnnotation sets one annotation with a merge patch (the cached object is not
// touched). It reports whether the patch applied: an object deleted meanwhile is
// neither an error nor a change.
func (c *Controller) patchAnnotation(ctx context.Context, kind, ns, name, k, v string) (bool, error) {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{k: v}}})
	if err != nil {
		return false, fmt.Errorf("encode patch: %w", err)
	}
	switch kind {
	case "Service":
		_, err = c.cfg.Client.CoreV1().Services(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	case "Ingress":
		_, err = c.cfg.Client.NetworkingV1().Ingresses(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	default:
		return false, fmt.Errorf("patch %s: unsupported kind", kind)
	}
	c.countWrite("annotate-"+strings.ToLower(kind), err)
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("annotate %s %s/%s %s: %w", kind, ns, name, k, err)
	}
	c.mu.Lock()
	c.written[writtenKey{kind, ns + "/" + name, k}] = written{v, time.Now()}
	c.mu.Unlock()
	return true, nil
}

type writtenKey struct{ kind, object, annotation string }

type written struct {
	value string
	at    time.Time
}

// writtenTTL bounds how long a write the cache has not shown yet is assumed to hold.
const writtenTTL = 30 * time.Second

// withWritten overlays the annotations this leader wrote and the cache does not show
// yet onto copies of the affected objects (the cached ones are never changed).
func (c *Controller) withWritten(st State) State {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.written) == 0 {
		return st
	}
	overlay := func(kind string, o metav1.Object) map[string]string {
		var add map[string]string
		for _, ann := range []string{AnnotationVIP, AnnotationVRID, AnnotationGroup} {
			k := writtenKey{kind, key(o), ann}
			w, ok := c.written[k]
			if !ok {
				continue
			}
			if cur, has := o.GetAnnotations()[ann]; (has && cur == w.value) || time.Since(w.at) > writtenTTL {
				delete(c.written, k) // the cache caught up (or never will)
				continue
			}
			if add == nil {
				add = map[string]string{}
			}
			add[ann] = w.value
		}
		return add
	}
	out := st
	out.Services = overlayWritten("Service", st.Services, overlay)
	out.Ingresses = overlayWritten("Ingress", st.Ingresses, overlay)
	return out
}

// overlayWritten returns objs with each object that overlay gives annotations for
// replaced by a copy that has them (objs and its objects are left as they are).
func overlayWritten[T interface {
	metav1.Object
	DeepCopy() T
}](kind string, objs []T, overlay func(string, metav1.Object) map[string]string) []T {
	out := slices.Clone(objs)
	for i, o := range out {
		add := overlay(kind, o)
		if add == nil {
			continue
		}
		cp := o.DeepCopy()
		anns := cp.GetAnnotations()
		if anns == nil {
			anns = map[string]string{}
		}
		maps.Copy(anns, add)
		cp.SetAnnotations(anns)
		out[i] = cp
	}
	return out
}
