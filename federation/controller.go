package federation

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"sync"
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
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
)

// FieldManager owns what the controller writes on members.
const FieldManager = "portico-federation"

// Work queue keys besides FederatedIngresses' namespace/name.
const (
	membersKey = "\x00members" // rebuild the members from their Secrets
	peersKey   = "\x00peers"   // write every member's peers (syncPeers)
)

var ingressResource = schema.GroupVersionResource{Group: "networking.k8s.io", Version: "v1", Resource: "ingresses"}

// Config is what Run needs.
type Config struct {
	// Host reaches the host cluster's API server.
	Host *rest.Config
	// Namespace holds the member Secrets (default portico-federation).
	Namespace string
	Logger    *zap.Logger
	// Registerer takes the metrics (nil: not registered).
	Registerer prometheus.Registerer
	// Resync refreshes every site's status this often (default 10 s).
	Resync time.Duration
	// DrainLead is how long after a site's drain is asked for it begins
	// (default DrainLead).
	DrainLead time.Duration
}

// Controller propagates FederatedIngresses to member clusters and aggregates their status.
type Controller struct {
	cfg      Config
	log      *zap.Logger
	host     kubernetes.Interface
	dyn      dynamic.Interface
	queue    workqueue.TypedRateLimitingInterface[string]
	recorder record.EventRecorder
	events   record.EventBroadcaster
	dynF     dynamicinformer.DynamicSharedInformerFactory
	fiInf    informers.GenericInformer
	fis      cache.GenericLister
	secrets  corelisters.SecretLister
	synced   []cache.InformerSynced
	metrics  *metrics

	mu       sync.Mutex
	members  map[string]*member // by cluster name
	reported map[string]string  // problem key -> the problem last reported under it (warnOnce)
	// peerEdges: cluster -> the last edges it reported (syncPeers).
	peerEdges map[string][]string
}

type metrics struct {
	syncs        *prometheus.CounterVec
	propagations *prometheus.CounterVec
}

// sitesDesc is the sites gauge, computed on scrape from the cached objects' status
// (nothing to keep in step on every sync).
var sitesDesc = prometheus.NewDesc("portico_federation_sites",
	"Placed sites of all FederatedIngresses by state (propagated, pending, error).", []string{"state"}, nil)

// Describe and Collect make the controller the sites gauge's collector.
func (c *Controller) Describe(ch chan<- *prometheus.Desc) { ch <- sitesDesc }

func (c *Controller) Collect(ch chan<- prometheus.Metric) {
	counts := map[string]float64{"propagated": 0, "pending": 0, "error": 0}
	for _, obj := range c.fisAll() {
		fi := &FederatedIngress{}
		if runtime.DefaultUnstructuredConverter.FromUnstructured(obj.(*unstructured.Unstructured).Object, fi) != nil {
			continue
		}
		for _, s := range fi.Status.Sites {
			switch {
			case s.Error != "":
				counts["error"]++
			case s.PropagatedGeneration == fi.Generation:
				counts["propagated"]++
			default:
				counts["pending"]++
			}
		}
	}
	for state, n := range counts {
		ch <- prometheus.MustNewConstMetric(sitesDesc, prometheus.GaugeValue, n, state)
	}
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "portico", "federation"
	m := &metrics{
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "syncs_total",
			Help: "FederatedIngress syncs by result (ok, error)."}, []string{"result"}),
		propagations: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "propagations_total",
			Help: "Writes of a member's Ingress by action (apply, delete) and result (ok, error)."}, []string{"action", "result"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.syncs, m.propagations} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// New builds a controller; Run starts it.
func New(cfg Config) (*Controller, error) {
	if cfg.Host == nil {
		return nil, errors.New("federation: no host cluster config")
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "portico-federation"
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Resync == 0 {
		cfg.Resync = 10 * time.Second
	}
	if cfg.DrainLead <= 0 {
		cfg.DrainLead = DrainLead
	}
	host, err := kubernetes.NewForConfig(cfg.Host)
	if err != nil {
		return nil, fmt.Errorf("host client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg.Host)
	if err != nil {
		return nil, fmt.Errorf("host client: %w", err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	c := &Controller{
		cfg: cfg, log: cfg.Logger, host: host, dyn: dyn, metrics: m,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "portico-federation"}),
		members:   map[string]*member{},
		reported:  map[string]string{},
		peerEdges: map[string][]string{},
	}
	c.dynF = dynamicinformer.NewDynamicSharedInformerFactory(dyn, cfg.Resync)
	c.fiInf = c.dynF.ForResource(Resource)
	c.fis = c.fiInf.Lister()
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	c.events = record.NewBroadcaster()
	c.recorder = c.events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "portico-federation"})
	return c, nil
}

// Run watches the host cluster and syncs until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	c.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.host.CoreV1().Events("")})
	defer c.events.Shutdown()
	defer c.stopMembers()

	dynF, fiInf := c.dynF, c.fiInf
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			c.queue.Add(key)
		}
		c.queue.Add(peersKey) // its site policies
	}
	if _, err := fiInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, n any) { enqueue(n) }, DeleteFunc: enqueue,
	}); err != nil {
		return fmt.Errorf("add event handler: %w", err)
	}
	secF := informers.NewSharedInformerFactoryWithOptions(c.host, c.cfg.Resync, informers.WithNamespace(c.cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelMember }))
	secInf := secF.Core().V1().Secrets()
	c.secrets = secInf.Lister()
	// A member added, changed or removed: rebuild the members, then sync everything.
	onSecret := func(any) { c.queue.Add(membersKey) }
	if _, err := secInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: onSecret, UpdateFunc: func(_, _ any) { onSecret(nil) }, DeleteFunc: onSecret,
	}); err != nil {
		return fmt.Errorf("add event handler: %w", err)
	}
	c.synced = []cache.InformerSynced{fiInf.Informer().HasSynced, secInf.Informer().HasSynced}
	dynF.Start(ctx.Done())
	secF.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return ctx.Err()
	}
	c.log.Info("federation controller started", zap.String("namespace", c.cfg.Namespace))

	go func() {
		<-ctx.Done()
		c.queue.ShutDown()
	}()
	// The sites' edges are re-read every resync period too (their addresses
	// are not part of what a Lease change signals).
	go func() {
		t := time.NewTicker(c.cfg.Resync)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				c.queue.Add(peersKey)
			}
		}
	}()
	for {
		key, quit := c.queue.Get()
		if quit {
			return nil
		}
		var err error
		switch key {
		case membersKey:
			c.syncMembers(ctx)
			c.enqueueAll()
			c.queue.Add(peersKey)
		case peersKey:
			c.syncPeers(ctx)
		default:
			err = c.sync(ctx, key)
		}
		c.queue.Done(key)
		if err != nil {
			c.metrics.syncs.WithLabelValues("error").Inc()
			c.log.Warn("sync failed", zap.String("federatedingress", key), zap.Error(err))
			c.queue.AddRateLimited(key)
			continue
		}
		if key != membersKey && key != peersKey {
			// Sites report through objects not all watched (endpoints): the
			// informer's resync brings every FederatedIngress back each period.
			c.metrics.syncs.WithLabelValues("ok").Inc()
			c.queue.Forget(key)
		}
	}
}

// enqueueAll asks for a sync of every FederatedIngress.
func (c *Controller) enqueueAll() {
	for _, obj := range c.fisAll() {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			c.queue.Add(key)
		}
	}
}

func (c *Controller) fisAll() []runtime.Object {
	list, err := c.fis.List(labels.Everything())
	if err != nil {
		return nil
	}
	return list
}

// syncMembers brings the member set in line with the Secrets: a new or changed Secret
// (re)builds its member, a removed one stops it. A bad Secret is reported as a Warning
// Event on it and skipped; the other members keep working.
func (c *Controller) syncMembers(ctx context.Context) {
	list, err := c.secrets.List(labels.Everything())
	if err != nil {
		c.log.Warn("list member secrets", zap.Error(err))
		return
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Name < list[j].Name })
	c.mu.Lock()
	defer c.mu.Unlock()
	want := map[string]bool{}
	for _, s := range list {
		name := memberName(s)
		key := s.Namespace + "/" + s.Name
		if want[name] {
			c.warnLocked(s, key, "InvalidMemberCluster", fmt.Sprintf("cluster %q is already named by another Secret", name))
			continue
		}
		want[name] = true
		if m := c.members[name]; m != nil && m.source == memberSource(s) {
			continue
		}
		m, err := startMember(ctx, s, c.cfg.Resync, func(ns, fi string) {
			if fi != "" {
				c.queue.Add(ns + "/" + fi)
			}
		}, func() { c.enqueueAll(); c.queue.Add(peersKey) })
		if err != nil {
			c.warnLocked(s, key, "InvalidMemberCluster", err.Error())
			continue
		}
		if old := c.members[name]; old != nil {
			old.stop()
		}
		c.members[name] = m
		delete(c.reported, key)
		c.log.Info("member cluster", zap.String("cluster", name), zap.String("secret", key))
	}
	for name, m := range c.members {
		if !want[name] {
			m.stop()
			delete(c.members, name)
			c.log.Info("member cluster removed", zap.String("cluster", name))
		}
	}
}

func (c *Controller) stopMembers() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.members {
		m.stop()
	}
}

// member returns a cluster's member once its informer has synced, else nil.
func (c *Controller) member(name string) *member {
	c.mu.Lock()
	m := c.members[name]
	c.mu.Unlock()
	if m == nil || !m.synced() {
		return nil
	}
	return m
}

func (c *Controller) memberNames() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	names := make([]string, 0, len(c.members))
	for n := range c.members {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func (c *Controller) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	obj, err := c.fis.ByNamespace(ns).Get(name)
	if apierrors.IsNotFound(err) {
		// Gone without our finalizer (created while no controller ran and deleted
		// before one did): its Ingresses stay on the members. Deleting them on a
		// missing object would let an empty host cache take every site down, which
		// fail-static forbids.
		return nil
	}
	if err != nil {
		return err
	}
	u := obj.(*unstructured.Unstructured)
	fi := &FederatedIngress{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, fi); err != nil {
		c.recorder.Event(u, corev1.EventTypeWarning, "InvalidFederatedIngress", err.Error())
		return nil
	}
	if fi.DeletionTimestamp != nil {
		return c.finalize(ctx, u, fi)
	}
	if !slices.Contains(fi.Finalizers, Finalizer) {
		cp := u.DeepCopy()
		cp.SetFinalizers(append(cp.GetFinalizers(), Finalizer))
		if _, err := c.dyn.Resource(Resource).Namespace(ns).Update(ctx, cp, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("add finalizer: %w", err)
		}
		return nil // the update comes back as an event
	}

	status := Status{ObservedGeneration: fi.Generation}
	if err := Validate(fi); err != nil {
		c.warnOnce(u, key, "InvalidFederatedIngress", err.Error())
		for _, cl := range fi.Spec.Placement.Clusters {
			status.Sites = append(status.Sites, SiteStatus{Cluster: cl, Error: err.Error()})
		}
	} else {
		c.warnOnce(u, key, "", "")
		for _, cl := range fi.Spec.Placement.Clusters {
			status.Sites = append(status.Sites, c.propagate(ctx, u, fi, cl))
		}
		placed := map[string]bool{}
		for _, cl := range fi.Spec.Placement.Clusters {
			placed[cl] = true
		}
		// A cluster that left the placement but does not answer keeps the Ingress
		// until a resync reaches it.
		for _, cl := range c.memberNames() {
			if !placed[cl] {
				err := c.remove(ctx, cl, ns, name)
				msg := ""
				if err != nil {
					msg = err.Error()
				}
				c.warnOnce(u, key+" "+cl+" remove", "NotRemoved", msg)
			}
		}
	}
	sort.Slice(status.Sites, func(i, j int) bool { return status.Sites[i].Cluster < status.Sites[j].Cluster })
	// When each site's announcement last changed: kept from the status written.
	for i, s := range status.Sites {
		for _, old := range fi.Status.Sites {
			if old.Cluster != s.Cluster {
				continue
			}
			status.Sites[i].AnnounceChanged = old.AnnounceChanged
			if old.Announce != s.Announce && s.Announce != "" {
				status.Sites[i].AnnounceChanged = &metav1.Time{Time: time.Now().Truncate(time.Second)}
			}
		}
	}
	for _, s := range status.Sites {
		if s.Error == "" && s.PropagatedGeneration == fi.Generation {
			status.Propagated++
			if s.ReadyBackends > 0 && s.EdgesServing > 0 {
				status.Ready++
			}
		}
	}
	return c.writeStatus(ctx, u, fi, status)
}

// propagate applies the cluster's Ingress (unless it already holds this generation
// as written) and reads back its state. A member's failure is the site's error in the
// status, not a retry of the whole FederatedIngress: the resync tries it again, and
// an unreachable member is skipped until then.
func (c *Controller) propagate(ctx context.Context, u *unstructured.Unstructured, fi *FederatedIngress, cluster string) SiteStatus {
	site := SiteStatus{Cluster: cluster}
	m := c.member(cluster)
	if m == nil {
		site.Error = fmt.Sprintf("no member cluster %q (a Secret in %s labelled %s, or its first list, is missing)", cluster, c.cfg.Namespace, LabelMember)
		return site
	}
	if why, down := m.unreachable(time.Now()); down {
		site.Error = "unreachable: " + why
		return site
	}
	problemKey := fi.Namespace + "/" + fi.Name + " " + cluster
	desired, err := MemberIngress(fi, cluster)
	if err != nil {
		site.Error = err.Error()
		c.warnOnce(u, problemKey, "InvalidOverride", err.Error())
		return site
	}
	cur, err := m.lister.Ingresses(fi.Namespace).Get(fi.Name)
	if err != nil && !apierrors.IsNotFound(err) {
		site.Error = err.Error()
		return site
	}
	if cur == nil || !holds(cur, desired) {
		obj, err := applyObject(desired)
		if err == nil {
			err = c.ensureNamespace(ctx, m, fi.Namespace)
		}
		var applied *unstructured.Unstructured
		if err == nil {
			applied, err = m.dyn.Resource(ingressResource).Namespace(fi.Namespace).Apply(ctx, fi.Name, obj,
				metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
		}
		m.noteCall(err, time.Now(), c.cfg.Resync)
		if err != nil {
			c.metrics.propagations.WithLabelValues("apply", "error").Inc()
			site.Error = fmt.Sprintf("apply: %v", err)
			c.warnOnce(u, problemKey, "NotPropagated", cluster+": "+err.Error())
			return site
		}
		c.metrics.propagations.WithLabelValues("apply", "ok").Inc()
		c.warnOnce(u, problemKey, "", "")
		c.log.Info("propagated", zap.String("federatedingress", fi.Namespace+"/"+fi.Name), zap.String("cluster", cluster),
			zap.Int64("generation", fi.Generation))
		cur = &networkingv1.Ingress{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(applied.Object, cur); err != nil {
			site.Error = fmt.Sprintf("decode applied ingress: %v", err)
			return site
		}
	}
	site.PropagatedGeneration, _ = strconv.ParseInt(cur.Annotations[AnnotationGeneration], 10, 64)
	for _, lb := range cur.Status.LoadBalancer.Ingress {
		if lb.IP != "" {
			site.Addresses = append(site.Addresses, lb.IP)
		} else if lb.Hostname != "" {
			site.Addresses = append(site.Addresses, lb.Hostname)
		}
	}
	ready, all, err := backends(ctx, m.client, cur)
	m.noteCall(err, time.Now(), c.cfg.Resync)
	if err != nil {
		site.Error = fmt.Sprintf("read endpoints: %v", err)
		return site
	}
	site.ReadyBackends, site.Backends = ready, all
	ev, err := edges(m.leases, fi.Namespace+"/"+fi.Name, cur.Generation)
	if err != nil {
		site.Error = fmt.Sprintf("read the agents' reports: %v", err)
		return site
	}
	if vip := fi.Spec.Policy.AnycastVIP; vip != "" && len(site.Addresses) > 0 && !slices.Contains(site.Addresses, vip) {
		site.Error = fmt.Sprintf("serves the Ingress on %v, not on the anycast VIP %s (portico.io/vip on the site's group Service)", site.Addresses, vip)
		c.warnOnce(u, problemKey+" vip", "AnycastVIPMismatch", site.Error)
	} else {
		c.warnOnce(u, problemKey+" vip", "", "")
	}
	site.Edges, site.EdgesServing, site.Announce = ev.edges, ev.serving, ev.announce
	site.Overflow = int32(math.Round(100 * ev.spill))
	if site.Announce == Depreferenced && c.siteDraining(cluster, time.Now()) {
		site.Announce = Draining
	}
	return site
}

// siteDraining reports whether a member's Secret says it drains now.
func (c *Controller) siteDraining(cluster string, now time.Time) bool {
	list, err := c.secrets.List(labels.Everything())
	if err != nil {
		return false
	}
	for _, s := range list {
		if memberName(s) != cluster {
			continue
		}
		v := s.Annotations[AnnotationDrain]
		from, err := time.Parse(time.RFC3339, v)
		if err != nil {
			from, err = time.Parse(time.RFC3339, s.Annotations[AnnotationDrainFrom])
		}
		return err == nil && !now.Before(from)
	}
	return false
}

// holds reports whether the member's Ingress already carries everything desired
// says (labels, annotations, spec): other managers' additions do not count.
func holds(cur, want *networkingv1.Ingress) bool {
	for k, v := range want.Labels {
		if cur.Labels[k] != v {
			return false
		}
	}
	for k, v := range want.Annotations {
		if cur.Annotations[k] != v {
			return false
		}
	}
	return equality.Semantic.DeepEqual(cur.Spec, want.Spec)
}

func (c *Controller) ensureNamespace(ctx context.Context, m *member, ns string) error {
	_, err := m.client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err == nil || !apierrors.IsNotFound(err) {
		return err
	}
	_, err = m.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// backends counts the ready and all endpoints behind the Services an Ingress names,
// each endpoint once (by its target or first address) however many slices and ports
// list it.
func backends(ctx context.Context, client kubernetes.Interface, ing *networkingv1.Ingress) (ready, all int32, err error) {
	services := map[string]bool{}
	add := func(b *networkingv1.IngressBackend) {
		if b != nil && b.Service != nil {
			services[b.Service.Name] = true
		}
	}
	add(ing.Spec.DefaultBackend)
	for _, r := range ing.Spec.Rules {
		if r.HTTP == nil {
			continue
		}
		for i := range r.HTTP.Paths {
			add(&r.HTTP.Paths[i].Backend)
		}
	}
	names := make([]string, 0, len(services))
	for s := range services {
		names = append(names, s)
	}
	sort.Strings(names)
	seen := map[string]bool{}
	for _, svc := range names {
		list, err := client.DiscoveryV1().EndpointSlices(ing.Namespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc})
		if err != nil {
			return 0, 0, err
		}
		for _, sl := range list.Items {
			for _, ep := range sl.Endpoints {
				id := svc + "/"
				switch {
				case ep.TargetRef != nil:
					id += string(ep.TargetRef.UID) + ep.TargetRef.Name
				case len(ep.Addresses) > 0:
					id += ep.Addresses[0]
				default:
					continue
				}
				if seen[id] {
					continue
				}
				seen[id] = true
				all++
				if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
					ready++
				}
			}
		}
	}
	return ready, all, nil
}

// remove deletes what was propagated for ns/name from one cluster (placement no
// longer names it, or the FederatedIngress is being deleted).
func (c *Controller) remove(ctx context.Context, cluster, ns, name string) error {
	m := c.member(cluster)
	if m == nil {
		return nil
	}
	names, err := m.propagated(ns, name)
	if err != nil {
		return err
	}
	if why, down := m.unreachable(time.Now()); down && len(names) > 0 {
		return fmt.Errorf("%s: unreachable: %s", cluster, why)
	}
	for _, n := range names {
		err := m.client.NetworkingV1().Ingresses(ns).Delete(ctx, n, metav1.DeleteOptions{})
		m.noteCall(err, time.Now(), c.cfg.Resync)
		if err != nil && !apierrors.IsNotFound(err) {
			c.metrics.propagations.WithLabelValues("delete", "error").Inc()
			return fmt.Errorf("%s: delete ingress %s/%s: %w", cluster, ns, n, err)
		}
		c.metrics.propagations.WithLabelValues("delete", "ok").Inc()
		c.log.Info("removed", zap.String("federatedingress", ns+"/"+name), zap.String("cluster", cluster))
	}
	return nil
}

// finalize removes the Ingresses from every member, then the finalizer. A member that
// cannot be reached keeps the finalizer on (retried); one whose Secret is gone cannot
// be cleaned and is not waited for.
func (c *Controller) finalize(ctx context.Context, u *unstructured.Unstructured, fi *FederatedIngress) error {
	if !slices.Contains(fi.Finalizers, Finalizer) {
		return nil
	}
	var errs error
	for _, cl := range c.memberNames() {
		if err := c.remove(ctx, cl, fi.Namespace, fi.Name); err != nil {
			errs = errors.Join(errs, err)
		}
	}
	if errs != nil {
		return errs
	}
	cp := u.DeepCopy()
	cp.SetFinalizers(slices.DeleteFunc(cp.GetFinalizers(), func(f string) bool { return f == Finalizer }))
	if _, err := c.dyn.Resource(Resource).Namespace(fi.Namespace).Update(ctx, cp, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove finalizer: %w", err)
	}
	return nil
}

func (c *Controller) writeStatus(ctx context.Context, u *unstructured.Unstructured, fi *FederatedIngress, st Status) error {
	if equality.Semantic.DeepEqual(fi.Status, st) {
		return nil
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&st)
	if err != nil {
		return fmt.Errorf("encode status: %w", err)
	}
	cp := u.DeepCopy()
	cp.Object["status"] = m
	if _, err := c.dyn.Resource(Resource).Namespace(fi.Namespace).UpdateStatus(ctx, cp, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update status: %w", err)
	}
	return nil
}

// warnOnce sends a Warning Event on obj and logs it, once while the same problem lasts
// under key; an empty problem clears key.
func (c *Controller) warnOnce(obj runtime.Object, key, reason, problem string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.warnLocked(obj, key, reason, problem)
}

// warnLocked is warnOnce with c.mu held.
func (c *Controller) warnLocked(obj runtime.Object, key, reason, problem string) {
	if problem == "" {
		delete(c.reported, key)
		return
	}
	if c.reported[key] == reason+problem {
		return
	}
	c.reported[key] = reason + problem
	c.recorder.Event(obj, corev1.EventTypeWarning, reason, problem)
	c.log.Warn("problem", zap.String("object", key), zap.String("reason", reason), zap.String("detail", problem))
}
