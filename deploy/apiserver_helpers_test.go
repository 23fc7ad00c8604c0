package deploy_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/portico-edge/portico/test/kapi"
	"github.com/portico-edge/portico/test/testenv"
)

// startAPIServer launches a real kube-apiserver configured like a cluster's:
// --allow-privileged=true (kube-apiserver's default is false; kubeadm, kind and the
// managed distributions set it, as kube-proxy and CNI pods need it), and the
// OwnerReferencesPermissionEnforcement admission plugin on (off by default, on in some
// distributions), so the RBAC a blockOwnerDeletion ownerReference needs is checked too.
// It skips like kapi.Shared.Get.
func startAPIServer(t *testing.T) *kapi.Server {
	t.Helper()
	kapi.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := kapi.Launch(ctx, kapi.Options{ExtraArgs: []string{
		"--allow-privileged=true", "--enable-admission-plugins=OwnerReferencesPermissionEnforcement"}})
	if err != nil {
		t.Fatalf("start kube-apiserver: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("stop kube-apiserver: %v", err)
		}
	})
	return srv
}

// applier server-side applies objects through the dynamic client, finding each
// object's resource through discovery.
type applier struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func newApplier(cfg *rest.Config) *applier {
	return &applier{
		dyn:    dynamic.NewForConfigOrDie(cfg),
		mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cfg))),
	}
}

func (a *applier) resource(u *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := u.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", gvk, err)
	}
	if m.Scope.Name() != meta.RESTScopeNameNamespace {
		if u.GetNamespace() != "" {
			return nil, fmt.Errorf("%s is cluster-scoped but names namespace %s", identity(u), u.GetNamespace())
		}
		return a.dyn.Resource(m.Resource), nil
	}
	if u.GetNamespace() == "" {
		u.SetNamespace(namespace) // what kustomize's namespace field does
	}
	return a.dyn.Resource(m.Resource).Namespace(u.GetNamespace()), nil
}

func (a *applier) apply(ctx context.Context, u *unstructured.Unstructured) error {
	ri, err := a.resource(u)
	if err != nil {
		return err
	}
	if _, err := ri.Apply(ctx, u.GetName(), u, metav1.ApplyOptions{FieldManager: "portico-deploy-test", Force: true}); err != nil {
		return fmt.Errorf("apply %s: %w", identity(u), err)
	}
	return nil
}

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// applyAll applies CRDs first and waits until each is Established, then Namespaces,
// then the rest in file order.
func (a *applier) applyAll(t *testing.T, ctx context.Context, objs []*unstructured.Unstructured) {
	t.Helper()
	rank := func(u *unstructured.Unstructured) int {
		switch u.GetKind() {
		case "CustomResourceDefinition":
			return 0
		case "Namespace":
			return 1
		}
		return 2
	}
	ordered := slices.Clone(objs)
	slices.SortStableFunc(ordered, func(x, y *unstructured.Unstructured) int { return rank(x) - rank(y) })
	crdsDone := false
	for _, u := range ordered {
		if rank(u) > 0 && !crdsDone {
			a.waitEstablished(t, ctx, objs)
			a.mapper.Reset() // discover the new resources
			crdsDone = true
		}
		if err := a.apply(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
}

func (a *applier) waitEstablished(t *testing.T, ctx context.Context, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, u := range objs {
		if u.GetKind() != "CustomResourceDefinition" {
			continue
		}
		testenv.Eventually(t, 20*time.Second, func() string {
			crd, err := a.dyn.Resource(crdResource).Get(ctx, u.GetName(), metav1.GetOptions{})
			if err != nil {
				return err.Error()
			}
			conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
			for _, c := range conds {
				if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
					return ""
				}
			}
			return "CRD " + u.GetName() + " not established"
		})
	}
}
