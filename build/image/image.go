package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/portico-edge/portico/internal/ocitar"
)

// versionVar is the variable -ldflags -X sets to the binary's version.
const versionVar = "github.com/portico-edge/portico/internal/version.Version"

// The image's layout and the names of what build writes into its output folder.
const (
	binaryPath  = "usr/local/bin/portico"
	layoutDir   = "oci"         // OCI image layout
	archiveFile = "portico.tar" // the same layout as one tar, plus docker's manifest.json
	digestFile  = "digest"      // the manifest digest, sha256:...
)

// buildBinary builds cmd/portico as a static, reproducible binary at out: no cgo (the
// image has no libc the binary could rely on), no build paths, no build ID, no VCS
// stamp (a dirty tree would change it); its version (`portico version`,
// portico_build_info) is the image's tag.
func buildBinary(ctx context.Context, root, out, version string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false",
		"-ldflags", "-s -w -buildid= -X "+versionVar+"="+version, "-o", out, "./cmd/portico")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build cmd/portico: %w", err)
	}
	return nil
}

// rootfs runs build/image/rootfs.sh with args ("path" only looks), which builds the
// Debian rootfs tar or finds it in its cache, and returns the tar's path. cache, when
// not "", stands for the script's cache folder.
func rootfs(ctx context.Context, root, cache string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(root, "build/image/rootfs.sh"), args...)
	cmd.Stderr = os.Stderr
	if cache != "" {
		cmd.Env = append(os.Environ(), "PORTICO_IMAGE_CACHE="+cache)
	}
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("build the rootfs: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// staticELF returns the image architecture of the ELF executable in b, or an error
// when it is not one or needs a dynamic loader (the image ships no libc for it).
func staticELF(b []byte) (string, error) {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return "", fmt.Errorf("read ELF: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", fmt.Errorf("dynamically linked (PT_INTERP): build with CGO_ENABLED=0")
		}
	}
	switch f.Machine {
	case elf.EM_X86_64:
		return "amd64", nil
	case elf.EM_AARCH64:
		return "arm64", nil
	}
	return "", fmt.Errorf("unsupported machine %s", f.Machine)
}

// assemble makes the image: the rootfs tar as the first layer, the portico binary at
// /usr/local/bin/portico as the second, and a config whose every time is epoch, so
// that the same inputs give the same digest.
func assemble(rootfs string, binary []byte, ref name.Tag, epoch time.Time) (v1.Image, error) {
	arch, err := staticELF(binary)
	if err != nil {
		return nil, fmt.Errorf("portico binary: %w", err)
	}
	base, err := tarball.LayerFromFile(rootfs, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("rootfs layer %s: %w", rootfs, err)
	}
	bt, err := binaryTar(binary, epoch)
	if err != nil {
		return nil, err
	}
	bin, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(bt)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("binary layer: %w", err)
	}
	created := v1.Time{Time: epoch.UTC()}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: base, MediaType: types.OCILayer, History: v1.History{
			Created: created, CreatedBy: "build/image/rootfs.sh (" + filepath.Base(rootfs) + ")"}},
		mutate.Addendum{Layer: bin, MediaType: types.OCILayer, History: v1.History{
			Created: created, CreatedBy: "build/image: cmd/portico at /" + binaryPath}})
	if err != nil {
		return nil, fmt.Errorf("append layers: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Created = created
	cf.Config.Entrypoint = []string{"/" + binaryPath}
	cf.Config.User = "0"
	cf.Config.WorkingDir = "/"
	cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":   "portico",
		"org.opencontainers.image.source":  "https://github.com/portico-edge/portico",
		"org.opencontainers.image.version": ref.TagStr(),
		"org.opencontainers.image.created": created.Format(time.RFC3339),
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("set config: %w", err)
	}
	return img, nil
}

// binaryTar is the second layer: the binary, owned by root, mode 0755, with its parent
// folders as Debian has them, every time set to epoch.
func binaryTar(binary []byte, epoch time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range []string{"usr/", "usr/local/", "usr/local/bin/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755,
			ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, fmt.Errorf("binary layer: %w", err)
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: binaryPath, Mode: 0o755,
		Size: int64(len(binary)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
		return nil, fmt.Errorf("binary layer: %w", err)
	}
	if _, err := tw.Write(binary); err != nil {
		return nil, fmt.Errorf("binary layer: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("binary layer: %w", err)
	}
	return buf.Bytes(), nil
}

// write puts img into dir as an OCI image layout (dir/oci), the same layout as one
// archive (dir/portico.tar) and its digest (dir/digest). The archive also carries
// docker's manifest.json, as `docker save` has written since Docker 25: `skopeo copy
// oci-archive:`, `ctr images import` (both read index.json) and `docker load` (reads
// manifest.json) all take the one file. dir is replaced whole, so nothing of an
// earlier build stays behind.
func write(img v1.Image, ref name.Tag, dir string, epoch time.Time) (v1.Hash, error) {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return v1.Hash{}, err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "."+filepath.Base(dir)+"-")
	if err != nil {
		return v1.Hash{}, err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return v1.Hash{}, err
	}
	digest, err := ocitar.WriteLayout(filepath.Join(tmp, layoutDir), img, ref.Name())
	if err != nil {
		return v1.Hash{}, err
	}
	dm, err := dockerManifest(img, ref)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := ocitar.Write(filepath.Join(tmp, archiveFile), filepath.Join(tmp, layoutDir),
		map[string][]byte{"manifest.json": dm}, epoch); err != nil {
		return v1.Hash{}, fmt.Errorf("write archive: %w", err)
	}
	if err := os.WriteFile(filepath.Join(tmp, digestFile), []byte(digest.String()+"\n"), 0o644); err != nil {
		return v1.Hash{}, err
	}
	if err := os.RemoveAll(dir); err != nil {
		return v1.Hash{}, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return v1.Hash{}, err
	}
	return digest, nil
}

// dockerManifest is the manifest.json `docker load` reads: the config and layers as
// paths of the layout's blobs, and the image's name.
func dockerManifest(img v1.Image, ref name.Tag) ([]byte, error) {
	cfg, err := img.ConfigName()
	if err != nil {
		return nil, fmt.Errorf("config digest: %w", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("layers: %w", err)
	}
	blob := func(h v1.Hash) string { return path.Join("blobs", h.Algorithm, h.Hex) }
	m := struct {
		Config   string
		RepoTags []string
		Layers   []string
	}{Config: blob(cfg), RepoTags: []string{ref.Name()}}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return nil, fmt.Errorf("layer digest: %w", err)
		}
		m.Layers = append(m.Layers, blob(d))
	}
	return json.Marshal([]any{m})
}
