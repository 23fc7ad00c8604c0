package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/portico-edge/portico/dataplane"
	"github.com/portico-edge/portico/test/testenv"
)

// The repository's root, seen from this package's folder.
const repoRoot = "../.."

// TestImage builds the image the way `make image` does, twice, and checks that both
// builds are the same bytes, that skopeo reads the archive both as an OCI archive and
// as docker's (what `docker load` reads), and that the image's programs run: the
// portico binary, nginx with the Lua module, ip. When the rootfs is not cached yet
// (a fresh machine, as in CI) it is built twice, into two caches, and the two tars
// must be the same bytes too (1-3 min more; PORTICO_IMAGE_ROOTFS_TWICE=1 does
// it with a warm cache as well).
func TestImage(t *testing.T) {
	testenv.RequireRoot(t, "mmdebstrap builds the rootfs; chroot runs the image's programs")
	testenv.RequireProgram(t, "mmdebstrap")
	skopeo := testenv.RequireProgram(t, "skopeo")
	ctx := context.Background()

	cached, err := rootfs(ctx, repoRoot, "", "path")
	if err != nil {
		t.Fatal(err)
	}
	_, statErr := os.Stat(cached)
	cold := errors.Is(statErr, os.ErrNotExist)
	base, err := rootfs(ctx, repoRoot, "")
	if err != nil {
		t.Fatal(err)
	}
	if cold || os.Getenv("PORTICO_IMAGE_ROOTFS_TWICE") == "1" {
		start := time.Now()
		again, err := rootfs(ctx, repoRoot, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		a, b := mustSHA256(t, base), mustSHA256(t, again)
		if a != b {
			t.Fatalf("two rootfs builds differ: %s %s, %s %s", base, a, again, b)
		}
		t.Logf("rootfs built twice in %s, the same bytes: sha256 %s", time.Since(start).Round(time.Second), a)
	}

	binPath := filepath.Join(t.TempDir(), "portico")
	if err := buildBinary(ctx, repoRoot, binPath, "v0.0.0-test"); err != nil {
		t.Fatal(err)
	}
	bin, err := os.ReadFile(binPath)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.NewTag("registry.test/portico:test", name.StrictValidation)
	if err != nil {
		t.Fatal(err)
	}
	epoch := time.Unix(1700000000, 0).UTC()

	var dirs [2]string
	var digests [2]v1.Hash
	for i := range dirs {
		dirs[i] = filepath.Join(t.TempDir(), "image")
		img, err := assemble(base, bin, ref, epoch)
		if err != nil {
			t.Fatal(err)
		}
		if digests[i], err = write(img, ref, dirs[i], epoch); err != nil {
			t.Fatal(err)
		}
	}
	if digests[0] != digests[1] {
		t.Fatalf("two builds from the same inputs: digests %s and %s", digests[0], digests[1])
	}
	if a, b := mustSHA256(t, filepath.Join(dirs[0], archiveFile)), mustSHA256(t, filepath.Join(dirs[1], archiveFile)); a != b {
		t.Fatalf("two builds from the same inputs: archives differ (sha256 %s, %s)", a, b)
	}
	t.Logf("built twice: %s, archive sha256 %s", digests[0], mustSHA256(t, filepath.Join(dirs[0], archiveFile)))
	dir := dirs[0]
	archive := filepath.Join(dir, archiveFile)
	if got, err := os.ReadFile(filepath.Join(dir, digestFile)); err != nil || strings.TrimSpace(string(got)) != digests[0].String() {
		t.Errorf("%s: %q, %v; want %s", digestFile, got, err, digests[0])
	}

	img := layoutImage(t, filepath.Join(dir, layoutDir), ref)
	t.Run("config", func(t *testing.T) {
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		type config struct {
			OS, Arch, User string
			Entrypoint     []string
			Created        time.Time
			Layers         int
		}
		want := config{OS: "linux", Arch: runtime.GOARCH, User: "0", Entrypoint: []string{"/usr/local/bin/portico"}, Created: epoch, Layers: 2}
		got := config{OS: cf.OS, Arch: cf.Architecture, User: cf.Config.User, Entrypoint: cf.Config.Entrypoint,
			Created: cf.Created.UTC(), Layers: len(cf.RootFS.DiffIDs)}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("config (-want +got):\n%s", diff)
		}
	})

	t.Run("skopeo", func(t *testing.T) {
		// The OCI side (index.json), read by skopeo copy and ctr images import, and
		// the docker side (manifest.json), read by docker load.
		type inspect struct {
			Digest       string
			Architecture string
			Os           string
			Layers       []string
		}
		for _, tc := range []struct {
			name, transport string
			digest          bool // the OCI manifest is stored as is; docker-archive converts
		}{
			{name: "oci-archive", transport: "oci-archive:" + archive, digest: true},
			{name: "docker-archive", transport: "docker-archive:" + archive},
		} {
			t.Run(tc.name, func(t *testing.T) {
				out, err := exec.Command(skopeo, "inspect", tc.transport).Output()
				if err != nil {
					t.Fatalf("skopeo inspect %s: %v: %s", tc.transport, err, stderr(err))
				}
				var got inspect
				if err := json.Unmarshal(out, &got); err != nil {
					t.Fatalf("skopeo inspect: %v: %s", err, out)
				}
				if tc.digest && got.Digest != digests[0].String() {
					t.Errorf("digest %s, want %s", got.Digest, digests[0])
				}
				if got.Architecture != runtime.GOARCH || got.Os != "linux" || len(got.Layers) != 2 {
					t.Errorf("skopeo sees %s/%s with %d layers, want linux/%s with 2", got.Os, got.Architecture, len(got.Layers), runtime.GOARCH)
				}
			})
		}
		// A copy reads every blob and checks it against its digest, and keeps the
		// manifest as it is (what a push to a registry does too): the same digest.
		copied := t.TempDir()
		out, err := exec.Command(skopeo, "copy", "--quiet", "oci-archive:"+archive, "dir:"+copied).CombinedOutput()
		if err != nil {
			t.Fatalf("skopeo copy oci-archive: dir: %v: %s", err, out)
		}
		if got := "sha256:" + mustSHA256(t, filepath.Join(copied, "manifest.json")); got != digests[0].String() {
			t.Errorf("skopeo copy wrote manifest %s, want %s unchanged", got, digests[0])
		}
	})

	t.Run("programs", func(t *testing.T) {
		fsDir := unpack(t, img)
		b, err := os.ReadFile(filepath.Join(fsDir, binaryPath))
		if err != nil {
			t.Fatal(err)
		}
		if arch, err := staticELF(b); err != nil || arch != runtime.GOARCH {
			t.Fatalf("/%s: %s, %v; want a static %s ELF", binaryPath, arch, err, runtime.GOARCH)
		}
		if _, err := os.Stat(filepath.Join(fsDir, "etc/ssl/certs/ca-certificates.crt")); err != nil {
			t.Errorf("CA certificates: %v", err)
		}
		// The two modules the agent's nginx.conf loads (nginx/templates/nginx.conf.tmpl).
		conf := `load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
pid nginx.pid;
events {}
http { server { listen 127.0.0.1:8080; location / { content_by_lua_block { ngx.say("ok") } } } }
`
		if err := os.MkdirAll(filepath.Join(fsDir, "tmp/nginx"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(fsDir, "tmp/nginx/nginx.conf"), []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name string
			argv []string
			want string // in the combined output
		}{
			{name: "portico", argv: []string{"/usr/local/bin/portico", "maglev", "10.0.0.1", "10.0.0.2"}, want: fmt.Sprintf("%d slots", dataplane.DefaultRingSize)},
			{name: "nginx with lua", argv: []string{"/usr/sbin/nginx", "-p", "/tmp/nginx/", "-c", "nginx.conf", "-e", "stderr", "-t"}, want: "test is successful"},
			{name: "ip", argv: []string{"/usr/bin/ip", "-V"}, want: "iproute2"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				out, err := exec.Command("chroot", append([]string{fsDir}, tc.argv...)...).CombinedOutput()
				if err != nil || !strings.Contains(string(out), tc.want) {
					t.Errorf("chroot %s: %v; want %q in:\n%s", strings.Join(tc.argv, " "), err, tc.want, out)
				}
			})
		}
	})
}

// layoutImage reads the one image of the OCI layout at dir and checks its name
// annotations.
func layoutImage(t *testing.T, dir string, ref name.Tag) v1.Image {
	t.Helper()
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 {
		t.Fatalf("index.json has %d manifests, want 1", len(m.Manifests))
	}
	d := m.Manifests[0]
	want := map[string]string{"io.containerd.image.name": ref.Name(), "org.opencontainers.image.ref.name": ref.TagStr()}
	if diff := cmp.Diff(want, d.Annotations); diff != "" {
		t.Errorf("index.json annotations (-want +got):\n%s", diff)
	}
	img, err := idx.Image(d.Digest)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// unpack extracts img's layers in order into a new folder with GNU tar, which creates
// the rootfs' absolute symlinks as links and never writes through them.
func unpack(t *testing.T, img v1.Image) string {
	t.Helper()
	dir := t.TempDir()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("tar", "-x", "-C", dir, "--numeric-owner", "--same-permissions", "-f", "-")
		cmd.Stdin = rc
		out, err := cmd.CombinedOutput()
		rc.Close()
		if err != nil {
			t.Fatalf("unpack layer %d: %v: %s", i, err, out)
		}
	}
	return dir
}

// TestBinaryTar checks the binary layer's entries: parents first, root-owned, every
// time the epoch.
func TestBinaryTar(t *testing.T) {
	epoch := time.Unix(1700000000, 0).UTC()
	b, err := binaryTar([]byte("\x7fELF"), epoch)
	if err != nil {
		t.Fatal(err)
	}
	type entry struct {
		Name string
		Mode int64
		Size int64
		Time time.Time
	}
	var got []entry
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, entry{h.Name, h.Mode, h.Size, h.ModTime.UTC()})
	}
	want := []entry{
		{"usr/", 0o755, 0, epoch},
		{"usr/local/", 0o755, 0, epoch},
		{"usr/local/bin/", 0o755, 0, epoch},
		{"usr/local/bin/portico", 0o755, 4, epoch},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("binary layer (-want +got):\n%s", diff)
	}
}

// mustSHA256 is the hex SHA-256 of a file's bytes.
func mustSHA256(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func stderr(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(ee.Stderr)
	}
	return ""
}
