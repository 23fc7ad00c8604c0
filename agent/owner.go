package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	appsinformers "k8s.io/client-go/informers/apps/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// An agent that stops leaves xdp_lb attached, its maps pinned, the VIPs on lo and
// the sysctls set, so that a restart or a rolling update never stops forwarding.
// When its DaemonSet is deleted (helm uninstall, kubectl delete daemonset, an
// IngressClaim reclaimed) nothing will take over: then it removes all of it.
//
// Which of the two a SIGTERM means is decided from watches started with the
// agent, not from a request made at SIGTERM: helm uninstall deletes the DaemonSet
// first and the agent's RBAC right after, and the garbage collector deletes the
// pods later, so by then the agent may no longer be allowed to ask. The agent
// watches its own Pod (for its controller, the DaemonSet, by UID) and the
// DaemonSets of its namespace. Its DaemonSet counts as deleted when the watch saw
// it go (or saw a deletionTimestamp: foreground deletion), and the pod still
// names it as its owner. Not when:
//   - the DaemonSet is still there: a rolling update (the same DaemonSet, a new
//     template), kubectl delete pod, a drain or an eviction;
//   - it was deleted with --cascade=orphan: the pods keep running, the garbage
//     collector removes their owner reference first (and a DaemonSet made again
//     later may adopt and roll them: an update, not an uninstall);
//   - the watches never listed the pod and the DaemonSets (no RBAC, no API
//     server): logged, and the node is left as it is (portico uninstall undoes it).
// A DaemonSet deleted and made again with the same name has another UID: the old
// one's pods are still uninstalled, and the new one's agents wait for them (the
// node's lock, lockNode).

// ownerWatch follows an agent's own Pod and the DaemonSets of its namespace.
type ownerWatch struct {
	ns, pod string
	log     *zap.Logger
	cancel  context.CancelFunc
	dsStore cache.Store
	synced  func() bool // both informers have listed once

	mu       sync.Mutex
	podSeen  bool
	owner    *metav1.OwnerReference // the pod's DaemonSet as last seen; nil: none
	orphaned map[types.UID]bool     // DaemonSets seen being deleted with the orphan policy
	errs     map[string]string      // the last watch error per resource, logged once
	event    func()                 // tests: after every event handled
}

// watchOwner starts watching pod (namespace/name) and its namespace's
// DaemonSets until stop. The watches run on their own, not on the agent's
// context, so that they still see the DaemonSet go while the agent shuts down.
func watchOwner(client kubernetes.Interface, pod string, log *zap.Logger) (*ownerWatch, error) {
	ns, name, ok := strings.Cut(pod, "/")
	if !ok || ns == "" || name == "" {
		return nil, fmt.Errorf("pod %q: want namespace/name", pod)
	}
	w := &ownerWatch{ns: ns, pod: name, log: log, orphaned: map[types.UID]bool{}, errs: map[string]string{}}
	podInf := coreinformers.NewFilteredPodInformer(client, ns, 0, cache.Indexers{}, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
	})
	dsInf := appsinformers.NewFilteredDaemonSetInformer(client, ns, 0, cache.Indexers{}, nil)
	w.dsStore = dsInf.GetStore()
	w.synced = func() bool { return podInf.HasSynced() && dsInf.HasSynced() }
	for _, inf := range []struct {
		what string
		inf  cache.SharedIndexInformer
		seen func(any)
	}{{"pod", podInf, w.seenPod}, {"daemonsets", dsInf, w.seenDaemonSet}} {
		if err := inf.inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) { w.watchError(inf.what, err) }); err != nil {
			return nil, err
		}
		if _, err := inf.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    inf.seen,
			UpdateFunc: func(_, obj any) { inf.seen(obj) },
			DeleteFunc: func(any) { w.seen() },
		}); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	go podInf.Run(ctx.Done())
	go dsInf.Run(ctx.Done())
	return w, nil
}

// stop ends the watches.
func (w *ownerWatch) stop() { w.cancel() }

// wait gives the watches up to timeout to list the pod and the DaemonSets, for
// an agent that stops soon after it started.
func (w *ownerWatch) wait(timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cache.WaitForCacheSync(ctx.Done(), w.synced)
}

func (w *ownerWatch) seenPod(obj any) {
	if p, ok := obj.(*corev1.Pod); ok && p.Name == w.pod {
		w.mu.Lock()
		w.podSeen = true
		w.owner = nil
		if ref := metav1.GetControllerOf(p); ref != nil && ref.Kind == "DaemonSet" && strings.HasPrefix(ref.APIVersion, appsv1.GroupName+"/") {
			w.owner = ref
		}
		w.mu.Unlock()
	}
	w.seen()
}

func (w *ownerWatch) seenDaemonSet(obj any) {
	if ds, ok := obj.(*appsv1.DaemonSet); ok && orphaning(ds) {
		w.mu.Lock()
		w.orphaned[ds.UID] = true
		w.mu.Unlock()
	}
	w.seen()
}

func (w *ownerWatch) seen() {
	w.mu.Lock()
	event := w.event
	w.mu.Unlock()
	if event != nil {
		event()
	}
}

// orphaning reports whether ds is being deleted with the orphan policy: its
// pods stay.
func orphaning(ds *appsv1.DaemonSet) bool {
	return ds.DeletionTimestamp != nil && slices.Contains(ds.Finalizers, metav1.FinalizerOrphanDependents)
}

// watchError logs a watch's failure once per distinct error: while it lasts,
// an uninstall is not seen (the informer retries on its own).
func (w *ownerWatch) watchError(what string, err error) {
	if errors.Is(err, io.EOF) {
		return // the server closed a watch: the informer watches again
	}
	w.mu.Lock()
	repeated := w.errs[what] == err.Error()
	w.errs[what] = err.Error()
	w.mu.Unlock()
	if repeated {
		return
	}
	w.log.Warn("watch for this agent's DaemonSet failed: until it works, deleting the DaemonSet leaves this node as it is (portico uninstall undoes it)",
		zap.String("resource", what), zap.Error(err))
}

// uninstalling reports whether the agent's DaemonSet is deleted or being
// deleted with its pods, and why it is or is not.
func (w *ownerWatch) uninstalling() (bool, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case !w.synced():
		return false, "the pod or its namespace's DaemonSets were never listed"
	case !w.podSeen:
		return false, "the pod " + w.ns + "/" + w.pod + " was not found"
	case w.owner == nil:
		return false, "the pod has no DaemonSet (orphaned, or not run by one)"
	case w.orphaned[w.owner.UID]:
		return false, "DaemonSet " + w.owner.Name + " was deleted with the orphan policy: its pods stay"
	}
	obj, ok, _ := w.dsStore.GetByKey(w.ns + "/" + w.owner.Name)
	ds, _ := obj.(*appsv1.DaemonSet)
	switch {
	case !ok || ds == nil || ds.UID != w.owner.UID:
		return true, "DaemonSet " + w.owner.Name + " was deleted"
	case orphaning(ds):
		return false, "DaemonSet " + w.owner.Name + " is being deleted with the orphan policy: its pods stay"
	case ds.DeletionTimestamp != nil:
		return true, "DaemonSet " + w.owner.Name + " is being deleted"
	}
	return false, "DaemonSet " + w.owner.Name + " is there"
}
