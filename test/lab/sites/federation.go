package sites

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/federation"
	"github.com/portico-edge/portico/test/kapi"
	"github.com/portico-edge/portico/test/lab"
)

// Federation is a host cluster for a Sites lab: its own API server with the
// FederatedIngress CRD, `portico federation`'s controller (in the test process)
// with every site as a member, and, per site, what the kubelet does for a
// mounted ConfigMap: the peers the controller writes into the member reach the
// agents' --federation-peers file.
type Federation struct {
	Host *kapi.Server
	Dyn  dynamic.Interface
	objs *lab.Lab // the host's objects (ApplyFile)
	done chan error
}

// Federate starts the host cluster and its controller over the lab's sites.
// drainLead is the controller's DrainLead. The Sites lab's Close stops it.
func (s *Sites) Federate(ctx context.Context, t testing.TB, drainLead time.Duration) (*Federation, error) {
	host, err := kapi.Launch(ctx, kapi.Options{})
	if err != nil {
		return nil, err
	}
	f := &Federation{Host: host, objs: &lab.Lab{API: host}, done: make(chan error, 1)}
	s.shared.OnClose(host.Stop)
	if f.objs.Kube, err = kubernetes.NewForConfig(host.Config); err != nil {
		return nil, err
	}
	for _, file := range []string{"federation/federatedingresses.portico.io.yaml", "federation/controller.yaml"} {
		if err := f.objs.ApplyFile(ctx, file); err != nil {
			return nil, err
		}
	}
	if f.Dyn, err = dynamic.NewForConfig(host.Config); err != nil {
		return nil, err
	}
	hostKube := f.objs.Kube
	if _, err := hostKube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lab.AppNamespace}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	for _, site := range s.all() {
		kc, err := os.ReadFile(site.API.Kubeconfig)
		if err != nil {
			return nil, err
		}
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "site-" + site.SiteName(), Namespace: "portico-federation",
			Labels: map[string]string{v1alpha1.LabelMemberCluster: site.SiteName()}}, Data: map[string][]byte{v1alpha1.KeyMemberKubeconfig: kc}}
		if _, err := hostKube.CoreV1().Secrets("portico-federation").Create(ctx, sec, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
	}
	ctrl, err := federation.New(federation.Config{Host: host.Config, Logger: zaptest.NewLogger(t).Named("federation"),
		Resync: 2 * time.Second, DrainLead: drainLead})
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	go func() { f.done <- ctrl.Run(cctx) }()
	s.shared.OnClose(func() error {
		cancel()
		return <-f.done
	})
	for _, site := range s.all() {
		go mountPeers(cctx, site)
	}
	return f, nil
}

// mountPeers does for a site's agents what the kubelet does for the mounted
// ConfigMap portico-federation-peers: every half second, its content, when it
// changed, replaces the --federation-peers file (atomically).
func mountPeers(ctx context.Context, l *lab.Lab) {
	var last string
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
		cm, err := l.Kube.CoreV1().ConfigMaps(lab.GroupNamespace).Get(ctx, federation.PeersConfigMap, metav1.GetOptions{})
		if err != nil {
			continue // not written yet, or the member's API server is down: the file stays
		}
		if data := cm.Data[federation.PeersKey]; data != last {
			tmp := l.SitesFile + ".tmp"
			if os.WriteFile(tmp, []byte(data), 0o644) == nil && os.Rename(tmp, l.SitesFile) == nil {
				last = data
			}
		}
	}
}

// Create creates a FederatedIngress on the host.
func (f *Federation) Create(ctx context.Context, fi *v1alpha1.FederatedIngress) error {
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(fi)
	if err != nil {
		return err
	}
	_, err = f.Dyn.Resource(v1alpha1.FederatedIngressResource).Namespace(fi.Namespace).Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{})
	return err
}

// Get reads a FederatedIngress from the host.
func (f *Federation) Get(ctx context.Context, ns, name string) (*v1alpha1.FederatedIngress, error) {
	u, err := f.Dyn.Resource(v1alpha1.FederatedIngressResource).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var fi v1alpha1.FederatedIngress
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// Annotate sets annotations on a site's member Secret ("" removes one).
func (f *Federation) Annotate(ctx context.Context, site string, kv map[string]string) error {
	c := f.objs.Kube.CoreV1().Secrets("portico-federation")
	for range 5 {
		sec, err := c.Get(ctx, "site-"+site, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if sec.Annotations == nil {
			sec.Annotations = map[string]string{}
		}
		for k, v := range kv {
			if v == "" {
				delete(sec.Annotations, k)
			} else {
				sec.Annotations[k] = v
			}
		}
		if _, err = c.Update(ctx, sec, metav1.UpdateOptions{}); err == nil || !apierrors.IsConflict(err) {
			return err
		}
	}
	return errors.New("annotate: conflicts")
}

// site returns a site's status in a FederatedIngress.
func site(fi *v1alpha1.FederatedIngress, name string) (v1alpha1.SiteStatus, error) {
	for _, s := range fi.Status.Sites {
		if s.Cluster == name {
			return s, nil
		}
	}
	return v1alpha1.SiteStatus{}, fmt.Errorf("no status for site %s", name)
}
