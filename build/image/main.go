// Command image builds Portico's container image, the one the DaemonSet in deploy/
// runs, without Docker: a Debian bookworm rootfs from mmdebstrap (rootfs.sh, cached),
// the static portico binary, and an OCI config, assembled with go-containerregistry.
// The same source gives the same bytes: every time in the image is SOURCE_DATE_EPOCH
// (by default the last commit's time), tar entries are sorted, the binary is built
// with -trimpath and no build ID. `make image` runs it as
//
//	go run ./build/image -name ghcr.io/portico-edge/portico:TAG -out bin/image
//
// and it writes bin/image/oci (an OCI image layout), bin/image/portico.tar (an archive
// for docker load, ctr images import and skopeo copy oci-archive:) and
// bin/image/digest, and prints NAME@DIGEST.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
)

func main() {
	ref := flag.String("name", "ghcr.io/portico-edge/portico:dev", "image name (the Makefile's IMAGE)")
	out := flag.String("out", "bin/image", "output folder: oci/, portico.tar, digest")
	root := flag.String("root", ".", "the repository's root")
	flag.Parse()
	if err := run(context.Background(), *root, *ref, *out); err != nil {
		fmt.Fprintf(os.Stderr, "image: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, root, ref, out string) error {
	tag, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("image name %q (want REGISTRY/REPOSITORY:TAG): %w", ref, err)
	}
	epoch, err := sourceDateEpoch(root)
	if err != nil {
		return err
	}
	t0 := time.Now()
	base, err := rootfs(ctx, root, "")
	if err != nil {
		return err
	}
	t1 := time.Now()
	tmp, err := os.MkdirTemp("", "portico-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "portico")
	if err := buildBinary(ctx, root, bin, tag.TagStr()); err != nil {
		return err
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	t2 := time.Now()
	img, err := assemble(base, b, tag, epoch)
	if err != nil {
		return err
	}
	digest, err := write(img, tag, out, epoch)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "image: rootfs %s, binary %s, assembly %s; epoch %d\n",
		t1.Sub(t0).Round(100*time.Millisecond), t2.Sub(t1).Round(100*time.Millisecond),
		time.Since(t2).Round(100*time.Millisecond), epoch.Unix())
	fmt.Printf("%s@%s\n", tag.Name(), digest)
	return nil
}

// sourceDateEpoch is SOURCE_DATE_EPOCH when set, else the time of the last commit.
func sourceDateEpoch(root string) (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		out, err := exec.Command("git", "-C", root, "log", "-1", "--format=%ct").Output()
		if err != nil {
			return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH is not set and git has no last commit: %w", err)
		}
		s = strings.TrimSpace(string(out))
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err)
	}
	return time.Unix(n, 0).UTC(), nil
}
