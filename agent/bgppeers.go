package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/bgp"
	"github.com/portico-edge/portico/internal/shutdown"
)

// BGP peers from objects: beside the peers of its --bgp-config file, each agent
// peers with the BGPPeer objects of its own namespace whose nodeSelectors match
// its Node's labels, with the timers of the BFDProfile each names and the
// password of the Secret each names, and follows every change of them, of its
// Node's labels and of those Secrets live (bgp.Speaker.Reconfigure): no restart,
// and no session whose configuration did not change is touched. A BGPPeer the
// agent cannot use is refused alone, with a Warning Event on it, a log line and
// portico_bgp_peer_objects{state="refused"}: an unknown BFDProfile, a missing
// Secret or key, a Secret in another namespace, an address or AS the speaker
// refuses, or an address that is already a peer (the file's, or an older
// BGPPeer's: the older one keeps it).

// Peer object states, as portico_bgp_peer_objects names them.
const (
	peerObjectUsed       = "used"       // this node peers with it
	peerObjectRefused    = "refused"    // selects this node, but cannot be used (an Event says why)
	peerObjectOtherNodes = "otherNodes" // selects other nodes only
)

// peerVerdict is what becomes of one BGPPeer on this node.
type peerVerdict struct {
	obj   *v1alpha1.BGPPeer
	state string   // peerObject*
	peer  bgp.Peer // when used
	err   error    // when refused
}

// peerInputs is what the peers of a node are computed from.
type peerInputs struct {
	namespace string
	file      []bgp.Peer // the file's peers for this node
	objects   []*v1alpha1.BGPPeer
	profiles  map[string]v1alpha1.BFDProfileSpec
	node      labels.Set // this node's labels (none if its Node is missing)
	// secret returns a Secret of the namespace, false when there is none.
	secret func(name string) (*corev1.Secret, bool)
	// check is bgp.Config.CheckPeer for the speaker's settings.
	check func(bgp.Peer) error
}

// desiredPeers is the node's peers: the file's, then the BGPPeers' that select
// the node and can be used, oldest first; and what became of each BGPPeer.
func desiredPeers(in peerInputs) ([]bgp.Peer, []peerVerdict) {
	peers := slices.Clone(in.file)
	owner := map[netip.Addr]string{}
	for _, p := range in.file {
		owner[p.Addr.Unmap()] = "the --bgp-config file's peer"
	}
	objs := slices.Clone(in.objects)
	slices.SortFunc(objs, func(a, b *v1alpha1.BGPPeer) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	var verdicts []peerVerdict
	for _, o := range objs {
		v := peerVerdict{obj: o}
		selected, err := selectsNode(o.Spec.NodeSelectors, in.node)
		switch {
		case err != nil:
			v.state, v.err = peerObjectRefused, err
		case !selected:
			v.state = peerObjectOtherNodes
		default:
			v.peer, v.err = peerFromObject(in, o)
			if v.err == nil {
				if who, dup := owner[v.peer.Addr]; dup {
					v.err = fmt.Errorf("address %v is already %s", v.peer.Addr, who)
				}
			}
			v.state = peerObjectUsed
			if v.err != nil {
				v.state = peerObjectRefused
			} else {
				owner[v.peer.Addr] = "BGPPeer " + o.Name + "'s (older)"
				peers = append(peers, v.peer)
			}
		}
		verdicts = append(verdicts, v)
	}
	return peers, verdicts
}

// selectsNode reports whether any of selectors matches the node's labels; no
// selector matches every node.
func selectsNode(selectors []metav1.LabelSelector, node labels.Set) (bool, error) {
	if len(selectors) == 0 {
		return true, nil
	}
	for i := range selectors {
		sel, err := metav1.LabelSelectorAsSelector(&selectors[i])
		if err != nil {
			return false, fmt.Errorf("nodeSelectors[%d]: %w", i, err)
		}
		if sel.Matches(node) {
			return true, nil
		}
	}
	return false, nil
}

// peerFromObject is the speaker's peer for o, or why there is none.
func peerFromObject(in peerInputs, o *v1alpha1.BGPPeer) (bgp.Peer, error) {
	s := o.Spec
	a, err := netip.ParseAddr(s.Address)
	if err != nil {
		return bgp.Peer{}, fmt.Errorf("address %q: %w", s.Address, err)
	}
	p := bgp.Peer{Addr: a.Unmap(), ASN: s.ASN, EBGPMultiHop: s.EBGPMultiHop}
	if s.Port != nil {
		if *s.Port < 1 || *s.Port > 65535 {
			return p, fmt.Errorf("port %d is not 1 to 65535", *s.Port)
		}
		p.Port = uint16(*s.Port)
	}
	if s.HoldTime != nil {
		p.HoldTime = s.HoldTime.Duration
	}
	if s.KeepaliveInterval != nil {
		p.KeepaliveInterval = s.KeepaliveInterval.Duration
	}
	if s.BFDProfile != "" {
		prof, ok := in.profiles[s.BFDProfile]
		if !ok {
			return p, fmt.Errorf("no BFDProfile %q in namespace %s", s.BFDProfile, in.namespace)
		}
		p.BFD = bfdFromProfile(prof)
	}
	if ref := s.PasswordSecret; ref != nil {
		if ref.Namespace != "" && ref.Namespace != in.namespace {
			return p, fmt.Errorf("passwordSecret %s/%s: the Secret must be in the BGPPeer's namespace %s", ref.Namespace, ref.Name, in.namespace)
		}
		sec, ok := in.secret(ref.Name)
		if !ok {
			return p, fmt.Errorf("passwordSecret: no Secret %s in namespace %s", ref.Name, in.namespace)
		}
		pw := sec.Data[v1alpha1.BGPPasswordKey]
		if len(pw) == 0 {
			return p, fmt.Errorf("passwordSecret: Secret %s has no key %q, or it is empty", ref.Name, v1alpha1.BGPPasswordKey)
		}
		p.Password = string(pw)
	}
	if err := in.check(p); err != nil {
		return p, err
	}
	return p, nil
}

// bfdFromProfile is the speaker's BFD for a profile (unset fields: the
// speaker's defaults).
func bfdFromProfile(s v1alpha1.BFDProfileSpec) *bgp.BFD {
	b := &bgp.BFD{}
	if s.TransmitInterval != nil {
		b.MinTx = time.Duration(*s.TransmitInterval) * time.Millisecond
	}
	if s.ReceiveInterval != nil {
		b.MinRx = time.Duration(*s.ReceiveInterval) * time.Millisecond
	}
	if s.DetectMultiplier != nil {
		b.Multiplier = uint8(min(*s.DetectMultiplier, 255))
	}
	return b
}

// peerMetrics are the agent's series of BGPPeer objects.
type peerMetrics struct {
	objects  *prometheus.GaugeVec
	failures prometheus.Counter
}

func newPeerMetrics() *peerMetrics {
	return &peerMetrics{
		objects: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "portico", Subsystem: "bgp", Name: "peer_objects",
			Help: "BGPPeer objects of the agent's namespace, by state on this node: used, refused (it selects this node but cannot be used; an Event on it says why), otherNodes (its nodeSelectors match other nodes)."},
			[]string{"state"}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "portico", Subsystem: "bgp", Name: "reconfigure_failures_total",
			Help: "Changes of the speaker's peers that failed (retried); the log says why."}),
	}
}

func (m *peerMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.objects, m.failures}
}

// peerObjects follows the BGPPeers, BFDProfiles and Secrets of the agent's
// namespace and its own Node, and keeps the speaker's peers equal to
// desiredPeers.
type peerObjects struct {
	namespace string
	node      string
	file      []bgp.Peer
	check     func(bgp.Peer) error
	// apply is the speaker's Reconfigure.
	apply    func(context.Context, []bgp.Peer) error
	log      *zap.Logger
	met      *peerMetrics
	events   bool          // record Events on the BGPPeers (in the namespace)
	retry    time.Duration // after a failed apply
	recorder record.EventRecorder

	mu       sync.Mutex
	applied  []bgp.Peer        // what apply last took
	reported map[string]string // by BGPPeer name: the refusal last reported ("" once used)
}

// run watches until ctx ends. The speaker has the file's peers from its start;
// the objects' join once the informers have listed everything.
func (po *peerObjects) run(ctx context.Context, client kubernetes.Interface, dyn dynamic.Interface) error {
	kick := make(chan struct{}, 1)
	notify := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke(kick) },
		UpdateFunc: func(any, any) { poke(kick) },
		DeleteFunc: func(any) { poke(kick) },
	}
	df := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, po.namespace, nil)
	peerInf := df.ForResource(v1alpha1.BGPPeerResource).Informer()
	profInf := df.ForResource(v1alpha1.BFDProfileResource).Informer()
	sf := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(po.namespace))
	secInf := sf.Core().V1().Secrets().Informer()
	nf := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", po.node).String()
	}))
	nodeInf := nf.Core().V1().Nodes().Informer()
	for _, inf := range []cache.SharedIndexInformer{peerInf, profInf, secInf, nodeInf} {
		if _, err := inf.AddEventHandler(notify); err != nil {
			return fmt.Errorf("bgp peer objects: %w", err)
		}
	}
	if po.events {
		b := record.NewBroadcaster(record.WithContext(ctx))
		b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events(po.namespace)})
		defer b.Shutdown()
		po.recorder = b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "portico-agent", Host: po.node})
	}
	df.Start(ctx.Done())
	sf.Start(ctx.Done())
	nf.Start(ctx.Done())
	defer shutdown.Informers(po.log, df, sf, nf)

	// The objects join once everything is listed (a BGPPeer whose Secret is
	// not listed yet would be refused for nothing). Without the CRDs (an
	// install of the plain manifests without them) the file's peers go on.
	warn := time.AfterFunc(30*time.Second, func() {
		po.log.Warn("BGPPeer and BFDProfile objects not listed yet: are the CRDs installed? the --bgp-config peers go on meanwhile",
			zap.String("namespace", po.namespace))
	})
	ok := cache.WaitForCacheSync(ctx.Done(), peerInf.HasSynced, profInf.HasSynced, secInf.HasSynced, nodeInf.HasSynced)
	warn.Stop()
	if !ok {
		return nil // ctx ended
	}
	var retry <-chan time.Time
	for {
		in := peerInputs{namespace: po.namespace, file: po.file, check: po.check, profiles: map[string]v1alpha1.BFDProfileSpec{}}
		for _, obj := range peerInf.GetStore().List() {
			var p v1alpha1.BGPPeer
			if err := fromUnstructured(obj, &p); err != nil {
				po.log.Warn("BGPPeer not read", zap.Error(err))
				continue
			}
			in.objects = append(in.objects, &p)
		}
		for _, obj := range profInf.GetStore().List() {
			var p v1alpha1.BFDProfile
			if err := fromUnstructured(obj, &p); err != nil {
				po.log.Warn("BFDProfile not read", zap.Error(err))
				continue
			}
			in.profiles[p.Name] = p.Spec
		}
		if obj, found, _ := nodeInf.GetStore().GetByKey(po.node); found {
			in.node = labels.Set(obj.(*corev1.Node).Labels)
		}
		in.secret = func(name string) (*corev1.Secret, bool) {
			obj, found, _ := secInf.GetStore().GetByKey(po.namespace + "/" + name)
			if !found {
				return nil, false
			}
			return obj.(*corev1.Secret), true
		}
		retry = nil
		if err := po.sync(ctx, in); err != nil {
			po.met.failures.Inc()
			po.log.Error("bgp peers not changed; retrying", zap.Duration("after", po.retry), zap.Error(err))
			retry = time.After(po.retry)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-kick:
		case <-retry:
		}
	}
}

// sync computes the node's peers from in, reports what became of each
// BGPPeer, and applies the peers if they changed.
func (po *peerObjects) sync(ctx context.Context, in peerInputs) error {
	peers, verdicts := desiredPeers(in)
	po.mu.Lock()
	defer po.mu.Unlock()
	count := map[string]int{peerObjectUsed: 0, peerObjectRefused: 0, peerObjectOtherNodes: 0}
	seen := map[string]bool{}
	for _, v := range verdicts {
		count[v.state]++
		name := v.obj.Name
		seen[name] = true
		last, known := po.reported[name]
		switch {
		case v.state == peerObjectRefused:
			msg := v.err.Error()
			if msg != last {
				po.log.Warn("BGPPeer refused", zap.String("bgppeer", name), zap.Int64("generation", v.obj.Generation), zap.Error(v.err))
				po.event(v.obj, corev1.EventTypeWarning, v1alpha1.ReasonPeerRefused, "node "+po.node+": "+msg)
			}
			po.reported[name] = msg
		case v.state == peerObjectUsed:
			if known && last != "" {
				po.event(v.obj, corev1.EventTypeNormal, v1alpha1.ReasonPeerConfigured, "node "+po.node+": peering with "+v.peer.Addr.String())
			}
			po.reported[name] = ""
		default:
			delete(po.reported, name)
		}
	}
	for name := range po.reported {
		if !seen[name] {
			delete(po.reported, name)
		}
	}
	for state, n := range count {
		po.met.objects.WithLabelValues(state).Set(float64(n))
	}
	if po.applied != nil && slices.EqualFunc(peers, po.applied, bgp.Peer.Equal) {
		return nil
	}
	if err := po.apply(ctx, peers); err != nil {
		return err
	}
	addrs := make([]string, 0, len(peers))
	for _, p := range peers {
		addrs = append(addrs, p.Addr.String())
	}
	po.log.Info("bgp peers", zap.Strings("peers", addrs), zap.Int("file", len(po.file)), zap.Int("objects", count[peerObjectUsed]))
	po.applied = peers
	return nil
}

func (po *peerObjects) event(obj *v1alpha1.BGPPeer, typ, reason, msg string) {
	if po.recorder != nil {
		po.recorder.Event(obj, typ, reason, msg)
	}
}

// fromUnstructured converts an informer's object into a typed one, keeping its
// apiVersion and kind (an Event's reference needs them).
func fromUnstructured(obj any, out runtime.Object) error {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return errors.New("not an unstructured object")
	}
	return runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out)
}

func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
