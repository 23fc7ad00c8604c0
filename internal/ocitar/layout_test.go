package ocitar

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/v1/random"
)

// TestWriteLayoutNames checks that each name is a descriptor of its own, all of the
// one manifest, with the annotations containerd and skopeo read, and that a layout
// needs at least one name.
func TestWriteLayoutNames(t *testing.T) {
	img, err := random.Image(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "oci")
	refs := []string{"registry.k8s.io/x/echo:v1.5.1", "docker.io/portico/echo:lab"}
	digest, err := WriteLayout(dir, img, refs...)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	var index struct {
		Manifests []struct {
			Digest      string            `json:"digest"`
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal(data, &index); err != nil {
		t.Fatal(err)
	}
	type named struct{ Digest, Name, Tag string }
	var got []named
	for _, m := range index.Manifests {
		got = append(got, named{m.Digest, m.Annotations["io.containerd.image.name"], m.Annotations["org.opencontainers.image.ref.name"]})
	}
	want := []named{{digest.String(), refs[0], "v1.5.1"}, {digest.String(), refs[1], "lab"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("index.json's images (-want +got):\n%s", diff)
	}
	if _, err := WriteLayout(filepath.Join(t.TempDir(), "oci"), img); err == nil {
		t.Error("a layout without a name was written")
	}
}
