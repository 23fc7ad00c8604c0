package cluster

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/portico-edge/portico/test/kapi"
)

// TestBuildImages checks that the lab's images come out byte for byte the same on
// every build, and carry the name and platform `ctr images import` needs.
func TestBuildImages(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two Go programs")
	}
	a, b := t.TempDir(), t.TempDir()
	first, err := BuildImages(a)
	if err != nil {
		t.Fatal(err)
	}
	second, err := BuildImages(b)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{"pause.oci.tar": PauseImage, "echo.oci.tar": EchoImage}
	if len(first) != len(names) || len(second) != len(names) {
		t.Fatalf("archives %v and %v, want %d each", first, second, len(names))
	}
	for i := range first {
		x := sameBuild(t, first[i], second[i])
		var index struct {
			Manifests []struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"manifests"`
		}
		if err := json.Unmarshal(member(t, x, "index.json"), &index); err != nil {
			t.Fatal(err)
		}
		want := names[filepath.Base(first[i])]
		if len(index.Manifests) != 1 || index.Manifests[0].Annotations["io.containerd.image.name"] != want {
			t.Errorf("%s: index %+v, want one image named %s", filepath.Base(first[i]), index, want)
		}
	}
}

// member returns the file name inside the tar archive data.
func member(t *testing.T, data []byte, name string) []byte {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s not in the archive: %v", name, err)
		}
		if h.Name == name {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}

// TestVersionMatchesWrapper keeps KubeVersion equal to what hack/kube.sh builds (the
// wrapper module's k8s.io/kubernetes) and to the API server's version.
func TestVersionMatchesWrapper(t *testing.T) {
	data, err := os.ReadFile("../../hack/kube/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	var got string
	if m := regexp.MustCompile(`(?m)^\s*k8s\.io/kubernetes (v\S+)$`).FindSubmatch(data); m != nil {
		got = string(m[1])
	}
	if got != KubeVersion {
		t.Errorf("hack/kube/go.mod requires k8s.io/kubernetes %q, KubeVersion is %q", got, KubeVersion)
	}
	if KubeVersion != kapi.KubeVersion {
		t.Errorf("kubelet and controllers %s, API server %s: keep them equal", KubeVersion, kapi.KubeVersion)
	}
}

// sameBuild fails the test unless the archives a and b, one image's two builds, hold
// the same bytes, and returns a's.
func sameBuild(t *testing.T, a, b string) []byte {
	t.Helper()
	x, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(x, y) {
		t.Errorf("%s differs between two builds", filepath.Base(a))
	}
	return x
}
