package deploy_test

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestReleaseVersionsAgree: a release is one version everywhere. The chart's
// version and appVersion are equal; its default image, the hand-written
// federation manifests' images and the generated manifests' are
// v<appVersion>; CHANGELOG.md has a section for it or for what is unreleased;
// and when HEAD is tagged vX.Y.Z (a release), the chart is X.Y.Z and the
// changelog has X.Y.Z's section.
func TestReleaseVersionsAgree(t *testing.T) {
	raw, err := os.ReadFile(chart + "/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(raw, &meta); err != nil {
		t.Fatal(err)
	}
	if meta.Version == "" || meta.Version != meta.AppVersion {
		t.Fatalf("Chart.yaml: version %q, appVersion %q: want one release in both", meta.Version, meta.AppVersion)
	}
	image := "ghcr.io/portico-edge/portico:v" + meta.AppVersion
	for _, f := range []string{"agent.yaml", "controller.yaml", "federation/controller.yaml", "federation/dns.yaml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`image: (\S+)`).FindAllSubmatch(b, -1) {
			if string(m[1]) != image {
				t.Errorf("%s: image %s, want %s (the chart's release)", f, m[1], image)
			}
		}
	}
	helm := helmBinary(t)
	out := run(t, nil, helm, "template", "portico", chart, "--show-only", "templates/agent.yaml")
	if !bytes.Contains(out, []byte("image: "+image+"\n")) {
		t.Errorf("the chart's default image is not %s:\n%s", image, out)
	}

	changelog, err := os.ReadFile("../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(changelog, []byte("\n## [Unreleased]")) && !bytes.Contains(changelog, []byte("\n## ["+meta.Version+"]")) {
		t.Errorf("CHANGELOG.md has neither an [Unreleased] nor a [%s] section", meta.Version)
	}
	tag, err := exec.Command("git", "describe", "--tags", "--exact-match", "--match", "v*", "HEAD").Output()
	if err != nil {
		t.Logf("HEAD is not a release (no vX.Y.Z tag on it): the tag checks do not apply")
		return
	}
	v := strings.TrimPrefix(strings.TrimSpace(string(tag)), "v")
	if v != meta.Version {
		t.Errorf("HEAD is tagged v%s, the chart says %s", v, meta.Version)
	}
	if !bytes.Contains(changelog, []byte("\n## ["+v+"]")) {
		t.Errorf("HEAD is tagged v%s and CHANGELOG.md has no [%s] section", v, v)
	}
}
