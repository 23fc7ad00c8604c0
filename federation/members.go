package federation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	coordinationlisters "k8s.io/client-go/listers/coordination/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/portico-edge/portico/api/agentstatus"
	"github.com/portico-edge/portico/api/v1alpha1"
)

// member is one member cluster: clients built from its Secret's kubeconfig and an
// informer on the Ingresses this controller propagated there.
type member struct {
	name   string
	source string                                   // what of the Secret the clients were built from (memberSource)
	agents string                                   // the namespace of the member's agents
	leases coordinationlisters.LeaseNamespaceLister // the member's agents' status Leases
	client kubernetes.Interface
	dyn    dynamic.Interface
	lister networkinglisters.IngressLister
	synced cache.InformerSynced
	stop   context.CancelFunc

	mu        sync.Mutex
	downUntil time.Time // calls are not tried before then
	downErr   string    // what the last failed call said
}

// unreachable reports whether the member failed to answer within the last resync
// period, and how: its FederatedIngresses skip it until then, so one silent member
// does not stall the sync of every other (each call to it could wait for the
// client timeout).
func (m *member) unreachable(now time.Time) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.downErr, now.Before(m.downUntil)
}

// noteCall records the result of a call to the member: a transport error (no API
// status: refused, timed out, TLS) marks it unreachable for hold; anything else,
// including an API error, shows that it answers.
func (m *member) noteCall(err error, now time.Time, hold time.Duration) {
	var status apierrors.APIStatus
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil && !errors.As(err, &status) {
		m.downUntil, m.downErr = now.Add(hold), err.Error()
		return
	}
	m.downUntil, m.downErr = time.Time{}, ""
}

// memberSource is what of a member Secret its member is built from: a change
// of anything else (the drain annotations) does not rebuild it.
func memberSource(s *corev1.Secret) string {
	return s.Annotations[v1alpha1.AnnotationAgentsNamespace] + "\x00" + string(s.Data[v1alpha1.KeyMemberKubeconfig])
}

// memberName is the cluster a member Secret names.
func memberName(s *corev1.Secret) string {
	if v := s.Labels[v1alpha1.LabelMemberCluster]; v != "" && v != "true" {
		return v
	}
	return s.Name
}

// startMember builds a member's clients from s and starts its informers: onChange is
// called with the namespace and FederatedIngress name of every propagated Ingress
// that changes there, onAgents when what an agent of the site reports changes.
func startMember(ctx context.Context, s *corev1.Secret, resync time.Duration, onChange func(ns, name string), onAgents func()) (*member, error) {
	kc := s.Data[v1alpha1.KeyMemberKubeconfig]
	if len(kc) == 0 {
		return nil, fmt.Errorf("secret %s/%s: no key %q", s.Namespace, s.Name, v1alpha1.KeyMemberKubeconfig)
	}
	cfg, err := memberConfig(kc)
	if err != nil {
		return nil, fmt.Errorf("secret %s/%s: kubeconfig: %w", s.Namespace, s.Name, err)
	}
	// A member that does not answer must not stall the others' syncs for long.
	cfg.Timeout = 10 * time.Second
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("secret %s/%s: client: %w", s.Namespace, s.Name, err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("secret %s/%s: client: %w", s.Namespace, s.Name, err)
	}
	f := informers.NewSharedInformerFactoryWithOptions(client, resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = v1alpha1.LabelFederatedIngress }))
	inf := f.Networking().V1().Ingresses()
	notify := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if m, ok := obj.(interface {
			GetNamespace() string
			GetLabels() map[string]string
		}); ok {
			onChange(m.GetNamespace(), m.GetLabels()[v1alpha1.LabelFederatedIngress])
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    notify,
		UpdateFunc: func(_, n any) { notify(n) },
		DeleteFunc: notify,
	}); err != nil {
		return nil, fmt.Errorf("add event handler: %w", err)
	}
	agents := s.Annotations[v1alpha1.AnnotationAgentsNamespace]
	if agents == "" {
		agents = "portico-system"
	}
	// The site's agents' status Leases: renewed every few seconds, so a change
	// counts only when what the site status shows of them changes.
	lf := informers.NewSharedInformerFactoryWithOptions(client, resync, informers.WithNamespace(agents),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = agentstatus.Selector }))
	leases := lf.Coordination().V1().Leases()
	onLease := func(old, cur any) {
		if edgeView(old) != edgeView(cur) {
			onAgents()
		}
	}
	if _, err := leases.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { onLease(nil, obj) },
		UpdateFunc: onLease,
		DeleteFunc: func(obj any) { onLease(obj, nil) },
	}); err != nil {
		return nil, fmt.Errorf("add event handler: %w", err)
	}
	mctx, cancel := context.WithCancel(ctx)
	m := &member{
		name: memberName(s), source: memberSource(s), agents: agents, client: client, dyn: dyn,
		lister: inf.Lister(), leases: leases.Lister().Leases(agents), stop: cancel,
		synced: func() bool { return inf.Informer().HasSynced() && leases.Informer().HasSynced() },
	}
	f.Start(mctx.Done())
	lf.Start(mctx.Done())
	return m, nil
}

// edgeView is the part of an agent's status Lease the site status shows (what it
// serves and announces, and whether it renews), so renewals alone are not changes.
func edgeView(obj any) string {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return ""
	}
	states, stale := agentstatus.DecodeStates([]agentstatus.Lease{agentstatus.LeaseOf(l)})
	if len(states) == 0 {
		return ""
	}
	st := states[0]
	v := struct {
		Served map[string]int64
		Pref   string
		Routes int
		VRRP   map[string]string
		Stale  bool
		Spill  float64
	}{Served: st.Served, VRRP: st.VRRP, Stale: stale[st.Node], Spill: st.Spill}
	if st.BGP != nil {
		v.Pref, v.Routes = st.BGP.Preference, len(st.BGP.Announced)
	}
	b, _ := json.Marshal(v) // maps marshal in key order
	return string(b)
}

// propagated lists the Ingresses in ns that this controller propagated for name.
func (m *member) propagated(ns, name string) ([]string, error) {
	sel := labels.SelectorFromSet(labels.Set{v1alpha1.LabelFederatedIngress: name})
	list, err := m.lister.Ingresses(ns).List(sel)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(list))
	for _, ing := range list {
		out = append(out, ing.Name)
	}
	return out, nil
}

// memberConfig is the client configuration of a member Secret's kubeconfig,
// which must carry everything inline: an exec plugin or auth provider (a
// command the controller would run) and a file reference (a token, key or
// certificate read from the controller's own file system) are refused. Whoever
// may write a Secret in the federation namespace is not thereby allowed to run
// commands in the controller or read its files (issue 24, 7).
func memberConfig(kc []byte) (*rest.Config, error) {
	c, err := clientcmd.Load(kc)
	if err != nil {
		return nil, err
	}
	var bad []string
	for name, a := range c.AuthInfos {
		for what, set := range map[string]bool{
			"an exec plugin": a.Exec != nil, "an auth provider": a.AuthProvider != nil, "a token file": a.TokenFile != "",
			"a client certificate file": a.ClientCertificate != "", "a client key file": a.ClientKey != "",
		} {
			if set {
				bad = append(bad, fmt.Sprintf("user %q has %s", name, what))
			}
		}
	}
	for name, cl := range c.Clusters {
		if cl.CertificateAuthority != "" {
			bad = append(bad, fmt.Sprintf("cluster %q has a certificate authority file", name))
		}
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		return nil, fmt.Errorf("%s: a member's kubeconfig must carry its credentials inline", strings.Join(bad, ", "))
	}
	return clientcmd.NewDefaultClientConfig(*c, &clientcmd.ConfigOverrides{}).ClientConfig()
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
