package ocitar

import (
	"errors"
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// WriteLayout writes img as the one image of a new OCI image layout at dir, named
// each of refs (as written: docker.io/x:y stays that, where the parsed name would say
// index.docker.io), and returns its manifest digest. containerd and Docker name the image
// after the io.containerd.image.name annotation; skopeo's oci-archive:FILE:TAG and
// umoci look for the tag in org.opencontainers.image.ref.name. Each name is a
// descriptor of its own, all of the same manifest: `ctr images import` makes an image
// of each, so one archive serves every tag a program is known by. The descriptors are
// written by hand: layout.AppendImage would add an artifactType, which marks
// artifacts, not images. Write then makes the layout one archive.
func WriteLayout(dir string, img v1.Image, refs ...string) (v1.Hash, error) {
	if len(refs) == 0 {
		return v1.Hash{}, errors.New("an image needs a name")
	}
	tags := make([]name.Tag, len(refs))
	for i, ref := range refs {
		tag, err := name.NewTag(ref, name.StrictValidation)
		if err != nil {
			return v1.Hash{}, fmt.Errorf("image name %q: %w", ref, err)
		}
		tags[i] = tag
	}
	digest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image digest: %w", err)
	}
	mt, err := img.MediaType()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("manifest media type: %w", err)
	}
	size, err := img.Size()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("manifest size: %w", err)
	}
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("write OCI layout: %w", err)
	}
	if err := lp.WriteImage(img); err != nil {
		return v1.Hash{}, fmt.Errorf("write OCI layout: %w", err)
	}
	for i, ref := range refs {
		if err := lp.AppendDescriptor(v1.Descriptor{MediaType: mt, Size: size, Digest: digest,
			Annotations: map[string]string{
				"io.containerd.image.name":          ref,
				"org.opencontainers.image.ref.name": tags[i].TagStr(),
			}}); err != nil {
			return v1.Hash{}, fmt.Errorf("write OCI layout: %w", err)
		}
	}
	return digest, nil
}
