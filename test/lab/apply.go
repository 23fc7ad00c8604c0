package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/portico-edge/portico/test/testenv"
)

// deployDir is the repository's deploy/ folder (the lab runs from source).
func deployDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "deploy")
}

// ApplyFile creates every object of a multi-document YAML file under deploy/, as
// `kubectl create -f` would.
func (l *Lab) ApplyFile(ctx context.Context, rel string) error {
	b, err := os.ReadFile(filepath.Join(deployDir(), rel))
	if err != nil {
		return err
	}
	return l.ApplyYAML(ctx, rel, b)
}

// ApplyYAML creates every object of a multi-document YAML document (named rel in
// errors), as `kubectl create -f` would; a kind the API server does not serve
// yet (a CRD created a moment ago) is waited for, up to 30 s.
func (l *Lab) ApplyYAML(ctx context.Context, rel string, b []byte) error {
	return l.writeYAML(ctx, rel, b, false)
}

// ServerSideApply applies every object of a multi-document YAML document
// (server-side apply, as `kubectl apply --server-side` would): created if
// missing, else changed to what it says.
func (l *Lab) ServerSideApply(ctx context.Context, rel string, b []byte) error {
	return l.writeYAML(ctx, rel, b, true)
}

// writeYAML creates (or with apply, applies) every object of b.
func (l *Lab) writeYAML(ctx context.Context, rel string, b []byte, apply bool) error {
	dc, err := discovery.NewDiscoveryClientForConfig(l.API.Config)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(l.API.Config)
	if err != nil {
		return err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("decode %s: %w", rel, err)
		}
		if len(obj.Object) == 0 {
			continue
		}
		gvk := obj.GroupVersionKind()
		var m *meta.RESTMapping
		if _, waitErr := testenv.Poll(ctx, 30*time.Second, 200*time.Millisecond, func() bool {
			m, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if meta.IsNoMatchError(err) {
				mapper.Reset()
				return false
			}
			return true
		}); waitErr != nil || err != nil {
			return fmt.Errorf("%s: %s: %w", rel, gvk, err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if ns := obj.GetNamespace(); ns != "" {
			ri = dyn.Resource(m.Resource).Namespace(ns)
		}
		if apply {
			if _, err := ri.Apply(ctx, obj.GetName(), &obj, metav1.ApplyOptions{FieldManager: "portico-lab", Force: true}); err != nil {
				return fmt.Errorf("%s: apply %s %s: %w", rel, gvk.Kind, obj.GetName(), err)
			}
			continue
		}
		if _, err := ri.Create(ctx, &obj, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("%s: create %s %s: %w", rel, gvk.Kind, obj.GetName(), err)
		}
	}
}
