package cluster

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/portico-edge/portico/internal/ocitar"
)

// The images every node imports: no registry is reachable, so pods use them with
// imagePullPolicy Never (or IfNotPresent).
const (
	// PauseImage is the pod sandbox (images/pause), containerd's sandbox_image.
	PauseImage = "docker.io/portico/pause:lab"
	// EchoImage is the lab's backend (images/echo): it answers with its pod's name
	// and the client's address on :8080, /info tells its namespaces apart.
	EchoImage = "docker.io/portico/echo:lab"
	// EchoPort is where the echo image listens unless given -listen.
	EchoPort = 8080
)

// imageTime is the creation time and every mtime of the lab's images, so the same
// sources give the same bytes.
var imageTime = time.Unix(0, 0).UTC()

// BuildImages compiles the pause and echo commands (static, CGO off) and writes each as
// an OCI archive for `ctr images import` into dir: pause.oci.tar and echo.oci.tar. It
// returns their paths. It needs the go command and this module's sources.
func BuildImages(dir string) ([]string, error) {
	var archives []string
	for _, img := range []struct{ cmd, name string }{{"pause", PauseImage}, {"echo", EchoImage}} {
		bin := filepath.Join(dir, img.cmd)
		build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -buildid=", "-o", bin,
			"github.com/portico-edge/portico/test/cluster/images/"+img.cmd)
		build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
		if out, err := build.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("build the %s image's command: %w: %s", img.cmd, err, out)
		}
		archive := filepath.Join(dir, img.cmd+".oci.tar")
		if err := writeImage(archive, bin, "/"+img.cmd, img.name); err != nil {
			return nil, fmt.Errorf("write image %s: %w", img.name, err)
		}
		archives = append(archives, archive)
	}
	return archives, nil
}

// writeImage writes an OCI archive (a tar of an OCI image layout) holding one image
// for linux/amd64, under each of names: one layer with the file bin at path dst, dst
// as entry point.
func writeImage(archive, bin, dst string, names ...string) error {
	data, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	var layerTar bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(dst, "/"), Mode: 0o755,
		Size: int64(len(data)), ModTime: imageTime, Format: tar.FormatPAX}); err != nil {
		return err
	}
	if _, err := tw.Write(data); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar.Bytes())), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return fmt.Errorf("make layer: %w", err)
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, MediaType: types.OCILayer,
		History: v1.History{Created: v1.Time{Time: imageTime}, CreatedBy: "test/cluster " + dst}})
	if err != nil {
		return fmt.Errorf("append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	// Without os and architecture `ctr images import` skips the image silently.
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Entrypoint = []string{dst}
	cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cf.Config.WorkingDir = "/"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	if img, err = mutate.CreatedAt(img, v1.Time{Time: imageTime}); err != nil {
		return err
	}
	lay, err := os.MkdirTemp(filepath.Dir(archive), "layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(lay)
	if _, err := ocitar.WriteLayout(filepath.Join(lay, "oci"), img, names...); err != nil {
		return err
	}
	return ocitar.Write(archive, filepath.Join(lay, "oci"), nil, imageTime)
}
