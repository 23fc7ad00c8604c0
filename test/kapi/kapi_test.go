package kapi

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// TestVersionsMatchWrappers keeps the constants equal to what hack/kapi.sh builds.
func TestVersionsMatchWrappers(t *testing.T) {
	for _, tc := range []struct {
		name, gomod, module, want string
	}{
		{"kube-apiserver", "../../hack/kapi/kube-apiserver/go.mod", "k8s.io/kubernetes", KubeVersion},
		{"etcd", "../../hack/kapi/etcd/go.mod", "go.etcd.io/etcd/server/v3", EtcdVersion},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := os.ReadFile(tc.gomod)
			if err != nil {
				t.Fatal(err)
			}
			var got string
			for _, line := range strings.Split(string(data), "\n") {
				f := strings.Fields(line)
				if len(f) >= 2 && f[0] == tc.module {
					got = f[1]
					break
				}
				if len(f) >= 3 && f[0] == "require" && f[1] == tc.module {
					got = f[2]
					break
				}
			}
			if got != tc.want {
				t.Errorf("%s requires %s %q, the Go constant says %q", tc.gomod, tc.module, got, tc.want)
			}
		})
	}
}

func TestStartServesAndStops(t *testing.T) {
	Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := Launch(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()

	// The client configuration and the kubeconfig file both work.
	fromFile, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig)
	if err != nil {
		t.Fatalf("load kubeconfig: %v", err)
	}
	for name, cfg := range map[string]*rest.Config{"Config": s.Config, "kubeconfig": fromFile} {
		t.Run(name, func(t *testing.T) {
			cs := kubernetes.NewForConfigOrDie(cfg)
			v, err := cs.Discovery().ServerVersion()
			if err != nil {
				t.Fatalf("server version: %v", err)
			}
			if v.GitVersion != KubeVersion {
				t.Errorf("server reports %q, want %q", v.GitVersion, KubeVersion)
			}
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "kapi-"}}
			if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
				t.Errorf("create namespace: %v", err)
			}
		})
	}

	api, etcd := s.PIDs()
	dir := s.Dir
	if err := s.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	for _, pid := range []int{api, etcd} {
		// Wait reaped the children, so signal 0 must fail with ESRCH.
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("pid %d still exists after Stop (kill 0: %v)", pid, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "kubeconfig")); !os.IsNotExist(err) {
		t.Errorf("server folder %s not removed: %v", dir, err)
	}
}
