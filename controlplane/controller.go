package controlplane

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
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
	// AgentLogLevel is those DaemonSets' agents' --log-level, the provisioning
	// process's own; empty: the manifest's.
	AgentLogLevel string
	// ClaimIface and ClaimNodeSelector place those DaemonSets' agents: the
	// edge interface ("": the manifest's) and the nodes, which a claim's own
	// selector may narrow but never widen (the operator's labels win). The
	// operator's alone: a claim's agents are privileged hostNetwork pods.
	ClaimIface        string
	ClaimNodeSelector map[string]string
	// AgentXDPMode is those DaemonSets' agents' --xdp-mode (native or
	// best-effort), the provisioning process's own: they run on the
	// operator's NICs, as its agents do; empty: the manifest's.
	AgentXDPMode string

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
	// Gateway API's (nil: its CRDs are not served), typed.
	gwFactories                                []dynamicinformer.DynamicSharedInformerFactory
	gwClasses, gateways, httpRoutes, refGrants cache.Indexer
	agentLeases                                cache.Indexer // the agents' status Leases
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
	agents := &agentsCollector{leader: c.IsLeader, now: time.Now, leases: func() []any {
		if c.agentLeases == nil { // set by watchAgents, below
			return nil
		}
		return c.agentLeases.List()
	}}
	m, err := newMetrics(cfg.Registerer, func() float64 { return float64(c.queue.Len()) }, agents)
	if err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	c.metrics = m
	c.fanout = newFanout(cfg.Sinks, c.log, m, cfg.SinkMinBackoff, cfg.SinkMaxBackoff)
	c.events = record.NewBroadcaster()
	c.recorder = c.events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "portico-controlplane", Host: cfg.Identity})

	if err := c.watchCluster(); err != nil {
		return nil, err
	}
	if !cfg.ReadOnly { // only the leader's writes wait for the edges
		if err := c.watchAgents(); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func setDefault(d *time.Duration, v time.Duration) {
	if *d == 0 {
		*d = v
	}
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
	if err := c.watchGateways(); err != nil {
		return err
	}
	defer c.startInformers(ctx)()
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
