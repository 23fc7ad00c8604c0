package cluster

import (
	"bytes"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// The Gateway API conformance suite (sigs.k8s.io/gateway-api/conformance) deploys its
// backends from registry.k8s.io with imagePullPolicy IfNotPresent. The test cluster
// reaches no registry, so hack/conformance.sh builds those backends from their Go
// sources and BuildConformanceImages packs them under the names the suite's
// manifests use: the suite runs unmodified, and finds them already on each node.
const (
	// GatewayAPIVersion is the conformance suite's version, whose echo-basic
	// hack/conformance.sh builds (hack/conformance/echo-basic/go.mod).
	GatewayAPIVersion = "v1.6.3"
	// CoreDNSVersion is the CoreDNS hack/conformance.sh builds
	// (hack/conformance/coredns/go.mod): the suite's UDPRoute backend.
	CoreDNSVersion = "v1.12.2"
	// CoreDNSImage is the name the suite gives CoreDNS.
	CoreDNSImage = "registry.k8s.io/coredns/coredns:" + CoreDNSVersion
)

// EchoBasicImages are the names the suite's manifests give echo-basic: upstream they
// are builds of different commits; here each is the echo-basic of GatewayAPIVersion's
// own sources, which serves everything the suite's pods ask of any of them (the TCP
// and UDP echo servers the TCPRoute and UDPRoute tests start from v1.6.0-dev.2, the
// retry handler infra-backend-v3 runs from v1.6.0-dev.3).
// TestConformanceImageNames fails when the suite's manifests name another.
var EchoBasicImages = []string{
	"registry.k8s.io/gateway-api/echo-basic:v1.5.1",
	"registry.k8s.io/gateway-api/echo-basic:v1.6.0-dev.2",
	"registry.k8s.io/gateway-api/echo-basic:v1.6.0-dev.3",
}

// BuildConformanceImages builds echo-basic and CoreDNS with hack/conformance.sh
// (static; cached by version, so a second call only packs them) and writes them into
// dir as OCI archives for `ctr images import`: echo-basic.oci.tar, one image under
// every name in EchoBasicImages, and coredns.oci.tar, named CoreDNSImage. Each
// binary is its image's entry point at the path the upstream image has it
// (/echo-basic, /coredns): the suite's pods give CoreDNS only arguments (-conf
// /root/Corefile, mounted from a ConfigMap) and echo-basic only environment
// variables. It returns the archives' paths. It needs the go command and this
// module's sources (hack/).
func BuildConformanceImages(dir string) ([]string, error) {
	bins, err := conformanceBinaries()
	if err != nil {
		return nil, err
	}
	images := []struct {
		bin     string
		archive string
		names   []string
	}{
		{bins["echo-basic"], "echo-basic.oci.tar", EchoBasicImages},
		{bins["coredns"], "coredns.oci.tar", []string{CoreDNSImage}},
	}
	var archives []string
	for _, img := range images {
		archive := filepath.Join(dir, img.archive)
		if err := writeImage(archive, img.bin, "/"+filepath.Base(img.bin), img.names...); err != nil {
			return nil, fmt.Errorf("write image %s: %w", img.names[0], err)
		}
		archives = append(archives, archive)
	}
	return archives, nil
}

// conformanceBinaries runs hack/conformance.sh and returns the paths it prints, by
// program name: echo-basic, coredns and conformance.test (the suite).
func conformanceBinaries() (map[string]string, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	script := filepath.Join(root, "hack/conformance.sh")
	var stderr bytes.Buffer
	cmd := exec.Command(script)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %s", script, err, stderr.Bytes())
	}
	bins := map[string]string{}
	for _, p := range strings.Fields(string(out)) {
		bins[filepath.Base(p)] = p
	}
	for _, name := range []string{"echo-basic", "coredns", "conformance.test"} {
		if bins[name] == "" {
			return nil, fmt.Errorf("%s printed no path of %s: %q", script, name, out)
		}
	}
	return bins, nil
}

// moduleRoot is the folder of the main module's go.mod, as the go command finds it
// from the working directory: the repository, where hack/ is.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == "/dev/null" {
		return "", fmt.Errorf("the working directory is outside Portico's module (go env GOMOD: %q)", gomod)
	}
	return filepath.Dir(gomod), nil
}
