package agent

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/portico-edge/portico/test/testenv"
)

const ownerNS = "portico-system"

func agentDaemonSet(uid string) *appsv1.DaemonSet {
	return &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: ownerNS, Name: "portico-agent", UID: types.UID(uid)}}
}

// agentPod is the agent pod p1 that ds runs (nil: none).
func agentPod(ds *appsv1.DaemonSet) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ownerNS, Name: "portico-agent-p1", UID: "pod-1"}}
	if ds != nil {
		p.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(ds, appsv1.SchemeGroupVersion.WithKind("DaemonSet"))}
	}
	return p
}

// startOwnerWatch watches the pod portico-agent-p1 through cs and waits until
// both watches have listed; events counts what they handle from then on.
func startOwnerWatch(t *testing.T, cs kubernetes.Interface, log *zap.Logger) (w *ownerWatch, events *atomic.Int64) {
	t.Helper()
	w, err := watchOwner(cs, ownerNS+"/portico-agent-p1", log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.stop)
	testenv.Eventually(t, 10*time.Second, func() string {
		if !w.synced() {
			return "not listed"
		}
		return ""
	})
	events = new(atomic.Int64)
	w.mu.Lock()
	w.event = func() { events.Add(1) }
	w.mu.Unlock()
	return w, events
}

// TestOwnerUninstalling: an agent undoes its node when its DaemonSet is deleted
// (or is being deleted with its pods), and not when the DaemonSet is updated, its
// pod alone is deleted, or the DaemonSet is deleted with the orphan policy.
func TestOwnerUninstalling(t *testing.T) {
	ds := agentDaemonSet("ds-1")
	deleting := func(finalizer string) *appsv1.DaemonSet {
		d := ds.DeepCopy()
		now := metav1.Now()
		d.DeletionTimestamp, d.Finalizers = &now, []string{finalizer}
		return d
	}
	newTemplate := ds.DeepCopy()
	newTemplate.Spec.Template.Annotations = map[string]string{"portico.io/restartedAt": "now"}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		// steps change the cluster; each makes one watch event.
		steps   []func(ctx context.Context, cs *fake.Clientset) error
		want    bool
		wantWhy string
	}{
		{name: "DaemonSet there", pod: agentPod(ds), want: false, wantWhy: "is there"},
		{name: "DaemonSet deleted", pod: agentPod(ds), steps: []func(context.Context, *fake.Clientset) error{
			deleteDS(ds.Name)}, want: true, wantWhy: "was deleted"},
		{name: "DaemonSet updated with a new template", pod: agentPod(ds), steps: []func(context.Context, *fake.Clientset) error{
			updateDS(newTemplate)}, want: false, wantWhy: "is there"},
		{name: "pod deleted alone", pod: agentPod(ds), steps: []func(context.Context, *fake.Clientset) error{
			func(ctx context.Context, cs *fake.Clientset) error {
				return cs.CoreV1().Pods(ownerNS).Delete(ctx, "portico-agent-p1", metav1.DeleteOptions{})
			}}, want: false, wantWhy: "is there"},
		{name: "foreground deletion", pod: agentPod(ds), steps: []func(context.Context, *fake.Clientset) error{
			updateDS(deleting(metav1.FinalizerDeleteDependents))}, want: true, wantWhy: "being deleted"},
		{name: "orphan deletion under way", pod: agentPod(ds), steps: []func(context.Context, *fake.Clientset) error{
			updateDS(deleting(metav1.FinalizerOrphanDependents))}, want: false, wantWhy: "orphan"},
		// The garbage collector drops the pod's owner reference, then the
		// DaemonSet; the DaemonSet's deletion may be seen first.
		{name: "deleted with the orphan policy", pod: agentPod(ds), steps: []func(context.Context, *fake.Clientset) error{
			updateDS(deleting(metav1.FinalizerOrphanDependents)), deleteDS(ds.Name), updatePod(agentPod(nil))}, want: false, wantWhy: "no DaemonSet"},
		{name: "deleted with the orphan policy, owner reference not yet dropped", pod: agentPod(ds), steps: []func(context.Context, *fake.Clientset) error{
			updateDS(deleting(metav1.FinalizerOrphanDependents)), deleteDS(ds.Name)}, want: false, wantWhy: "orphan"},
		{name: "deleted and made again with the same name", pod: agentPod(ds), steps: []func(context.Context, *fake.Clientset) error{
			deleteDS(ds.Name), createDS(agentDaemonSet("ds-2"))}, want: true, wantWhy: "was deleted"},
		{name: "adopted by a new DaemonSet after an orphan deletion", pod: agentPod(nil), steps: []func(context.Context, *fake.Clientset) error{
			deleteDS(ds.Name), createDS(agentDaemonSet("ds-2")), updatePod(agentPod(agentDaemonSet("ds-2")))}, want: false, wantWhy: "is there"},
		{name: "pod not run by a DaemonSet", pod: agentPod(nil), steps: []func(context.Context, *fake.Clientset) error{
			deleteDS(ds.Name)}, want: false, wantWhy: "no DaemonSet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			cs := fake.NewClientset(ds.DeepCopy(), tc.pod)
			w, events := startOwnerWatch(t, cs, zaptest.NewLogger(t))
			testenv.Eventually(t, 10*time.Second, func() string {
				if w.mu.Lock(); !w.podSeen {
					w.mu.Unlock()
					return "pod not seen"
				}
				w.mu.Unlock()
				return ""
			})
			for i, step := range tc.steps {
				if err := step(ctx, cs); err != nil {
					t.Fatal(err)
				}
				testenv.Eventually(t, 10*time.Second, func() string {
					if n := events.Load(); n < int64(i+1) {
						return fmt.Sprintf("%d watch events after the changes, want %d", n, i+1)
					}
					return ""
				})
			}
			got, why := w.uninstalling()
			if got != tc.want || !strings.Contains(why, tc.wantWhy) {
				t.Errorf("uninstalling = %v (%s), want %v (%q)", got, why, tc.want, tc.wantWhy)
			}
		})
	}
}

func deleteDS(name string) func(context.Context, *fake.Clientset) error {
	return func(ctx context.Context, cs *fake.Clientset) error {
		return cs.AppsV1().DaemonSets(ownerNS).Delete(ctx, name, metav1.DeleteOptions{})
	}
}

func updateDS(ds *appsv1.DaemonSet) func(context.Context, *fake.Clientset) error {
	return func(ctx context.Context, cs *fake.Clientset) error {
		_, err := cs.AppsV1().DaemonSets(ownerNS).Update(ctx, ds, metav1.UpdateOptions{})
		return err
	}
}

func createDS(ds *appsv1.DaemonSet) func(context.Context, *fake.Clientset) error {
	return func(ctx context.Context, cs *fake.Clientset) error {
		_, err := cs.AppsV1().DaemonSets(ownerNS).Create(ctx, ds, metav1.CreateOptions{})
		return err
	}
}

func updatePod(p *corev1.Pod) func(context.Context, *fake.Clientset) error {
	return func(ctx context.Context, cs *fake.Clientset) error {
		_, err := cs.CoreV1().Pods(ownerNS).Update(ctx, p, metav1.UpdateOptions{})
		return err
	}
}

// TestOwnerWatchFails: while the DaemonSets cannot be listed (no RBAC), a
// deleted DaemonSet is not an uninstall, and the failure is logged once, not on
// every retry.
func TestOwnerWatchFails(t *testing.T) {
	ds := agentDaemonSet("ds-1")
	cs := fake.NewClientset(ds, agentPod(ds))
	var mu sync.Mutex
	lists := 0
	cs.PrependReactor("list", "daemonsets", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		lists++
		mu.Unlock()
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "daemonsets"}, "", nil)
	})
	core, logs := observer.New(zap.InfoLevel)
	w, err := watchOwner(cs, ownerNS+"/portico-agent-p1", zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	defer w.stop()
	// The reflector retries after a back-off (about a second): two lists.
	testenv.Eventually(t, 20*time.Second, func() string {
		mu.Lock()
		defer mu.Unlock()
		if lists < 2 {
			return "DaemonSets listed fewer than twice"
		}
		return ""
	})
	if err := cs.AppsV1().DaemonSets(ownerNS).Delete(context.Background(), ds.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, why := w.uninstalling(); got || !strings.Contains(why, "never listed") {
		t.Errorf("uninstalling = %v (%s), want false: the DaemonSets were never listed", got, why)
	}
	warned := logs.FilterMessageSnippet("watch for this agent's DaemonSet failed").All()
	if len(warned) != 1 {
		t.Fatalf("%d warnings about the failed watch, want 1: %v", len(warned), logs.All())
	}
	if f := warned[0].ContextMap(); f["resource"] != "daemonsets" || !strings.Contains(f["error"].(string), "forbidden") {
		t.Errorf("warning fields %v, want resource daemonsets and the forbidden error", f)
	}
}
