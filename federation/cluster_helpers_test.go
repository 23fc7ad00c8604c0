package federation

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/portico-edge/portico/api/v1alpha1"
	"github.com/portico-edge/portico/test/kapi"
	"github.com/portico-edge/portico/test/testenv"
)

// cluster is one real API server of the test: the host or a member.
type cluster struct {
	name   string
	srv    *kapi.Server
	client kubernetes.Interface
	dyn    dynamic.Interface
}

// launchClusters starts the named API servers side by side.
func launchClusters(t *testing.T, names ...string) map[string]*cluster {
	t.Helper()
	kapi.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out := map[string]*cluster{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, len(names))
	for _, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			srv, err := kapi.Launch(ctx, kapi.Options{})
			if err != nil {
				errs <- fmt.Errorf("start %s: %w", n, err)
				return
			}
			c := &cluster{name: n, srv: srv}
			c.client = kubernetes.NewForConfigOrDie(srv.Config)
			c.dyn = dynamic.NewForConfigOrDie(srv.Config)
			mu.Lock()
			out[n] = c
			mu.Unlock()
		}()
	}
	wg.Wait()
	for _, c := range out {
		t.Cleanup(func() { _ = c.srv.Stop() })
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return out
}

// apply applies every object of the manifests under deploy/federation named by files,
// in order, the CRD's resource waited for.
func apply(t *testing.T, ctx context.Context, c *cluster, files ...string) {
	t.Helper()
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.client.Discovery()))
	for _, f := range files {
		data, err := os.ReadFile("../deploy/federation/" + f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewYAMLOrJSONDecoder(strings.NewReader(string(data)), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := dec.Decode(&u.Object); err == io.EOF {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			gvk := u.GroupVersionKind()
			m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			var ri dynamic.ResourceInterface = c.dyn.Resource(m.Resource)
			if u.GetNamespace() != "" {
				ri = c.dyn.Resource(m.Resource).Namespace(u.GetNamespace())
			}
			if _, err := ri.Apply(ctx, u.GetName(), u, metav1.ApplyOptions{FieldManager: "test", Force: true}); err != nil {
				t.Fatalf("%s: apply %s %s: %v", f, u.GetKind(), u.GetName(), err)
			}
			if u.GetKind() == "CustomResourceDefinition" {
				if _, err := testenv.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() bool {
					_, err := c.dyn.Resource(v1alpha1.FederatedIngressResource).Namespace("default").List(ctx, metav1.ListOptions{})
					return err == nil
				}); err != nil {
					t.Fatal("FederatedIngress CRD not served after 30 s")
				}
				mapper.Reset()
			}
		}
	}
}

// serviceAccount is the identity of a ServiceAccount of deploy/federation, for
// impersonation: the tests run as what the manifests grant.
func serviceAccount(name string) (user string, groups []string) {
	return "system:serviceaccount:portico-federation:" + name,
		[]string{"system:serviceaccounts", "system:serviceaccounts:portico-federation", "system:authenticated"}
}

// memberKubeconfig is the member's admin kubeconfig made to act as the member
// ServiceAccount of member-rbac.yaml.
func memberKubeconfig(t *testing.T, c *cluster) []byte {
	t.Helper()
	kc, err := clientcmd.LoadFromFile(c.srv.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	user, groups := serviceAccount("portico-federation-member")
	for _, ai := range kc.AuthInfos {
		ai.Impersonate, ai.ImpersonateGroups = user, groups
	}
	out, err := clientcmd.Write(*kc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
