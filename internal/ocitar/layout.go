package ocitar

import (
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// WriteLayout writes img as the one image of a new OCI image layout at dir, named
// ref (as written: docker.io/x:y stays that, where the parsed name would say
// index.docker.io), and returns its manifest digest. containerd and Docker name the image
// after the io.containerd.image.name annotation; skopeo's oci-archive:FILE:TAG and
// umoci look for the tag in org.opencontainers.image.ref.name. The descriptor is
// written by hand: layout.AppendImage would add an artifactType, which marks
// artifacts, not images. Write then makes the layout one archive.
func WriteLayout(dir string, img v1.Image, ref string) (v1.Hash, error) {
	tag, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image name %q: %w", ref, err)
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
	if err := lp.AppendDescriptor(v1.Descriptor{MediaType: mt, Size: size, Digest: digest,
		Annotations: map[string]string{
			"io.containerd.image.name":          ref,
			"org.opencontainers.image.ref.name": tag.TagStr(),
		}}); err != nil {
		return v1.Hash{}, fmt.Errorf("write OCI layout: %w", err)
	}
	return digest, nil
}
