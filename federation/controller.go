package federation

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

	"github.com/portico-edge/portico/api/v1alpha1"
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
	c.fiInf = c.dynF.ForResource(v1alpha1.FederatedIngressResource)
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

	if err := c.watch(ctx); err != nil {
		return err
	}
	c.log.Info("federation controller started", zap.String("namespace", c.cfg.Namespace))

	go func() {
		<-ctx.Done()
		c.queue.ShutDown()
	}()
	go c.resyncPeers(ctx)
	for c.processNext(ctx) {
	}
	return nil
}

// watch starts the host cluster's informers (the FederatedIngresses and the member
// Secrets), which feed the queue, and waits for their first lists.
func (c *Controller) watch(ctx context.Context) error {
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
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = v1alpha1.LabelMemberCluster }))
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
	return nil
}

// resyncPeers asks for the sites' edges to be re-read every resync period (their
// addresses are not part of what a Lease change signals), until ctx ends.
func (c *Controller) resyncPeers(ctx context.Context) {
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
}

// processNext handles the queue's next key; false once the queue is shut down.
func (c *Controller) processNext(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	err := c.handle(ctx, key)
	c.queue.Done(key)
	if err != nil {
		c.metrics.syncs.WithLabelValues("error").Inc()
		c.log.Warn("sync failed", zap.String("federatedingress", key), zap.Error(err))
		c.queue.AddRateLimited(key)
		return true
	}
	if key != membersKey && key != peersKey {
		// Sites report through objects not all watched (endpoints): the
		// informer's resync brings every FederatedIngress back each period.
		c.metrics.syncs.WithLabelValues("ok").Inc()
		c.queue.Forget(key)
	}
	return true
}

// handle does what a queue key asks: rebuild the members (then sync everything),
// write the peers, or sync one FederatedIngress.
func (c *Controller) handle(ctx context.Context, key string) error {
	switch key {
	case membersKey:
		c.syncMembers(ctx)
		c.enqueueAll()
		c.queue.Add(peersKey)
		return nil
	case peersKey:
		c.syncPeers(ctx)
		return nil
	default:
		return c.sync(ctx, key)
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
