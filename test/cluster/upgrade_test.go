package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/portico-edge/portico/test/testenv"
	"github.com/portico-edge/portico/test/traffic"
)

// TestUpgradeFromPrevious installs the previous release on two edges, its chart
// and its image, then upgrades it to this tree's chart and image with helm
// upgrade, as an operator would, under load: a stream of new connections and
// kept-alive requests, none of which may fail; every agent runs the new image
// after. The previous release is the last tag reachable from HEAD, or HEAD's
// parent while there is none (PORTICO_UPGRADE_FROM names another revision).
func TestUpgradeFromPrevious(t *testing.T) {
	Require(t)
	if _, err := HelmBinary(root); err != nil {
		testenv.Unavailable(t, "%v", err)
	}
	from, err := previousRevision(root)
	if err != nil {
		testenv.Unavailable(t, "no previous revision to upgrade from: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	t0 := time.Now()
	prev := filepath.Join(t.TempDir(), "prev")
	if err := exportRevision(ctx, root, from.commit, prev); err != nil {
		t.Fatal(err)
	}
	// The exported tree has no git history: the image's time is its commit's.
	oldImage, err := BuildPorticoImage(ctx, prev, filepath.Join(t.TempDir(), "image-prev"), "e2e-prev", "SOURCE_DATE_EPOCH="+from.time)
	if err != nil {
		t.Fatalf("the previous release's image (%s): %v", from, err)
	}
	newImage, err := BuildPorticoImage(ctx, root, filepath.Join(t.TempDir(), "image"), "e2e-1")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("images of %s and of this tree built: %.1f s", from, time.Since(t0).Seconds())
	c, err := Start(ctx, Options{Nodes: 3, Images: []string{oldImage, newImage}})
	if err != nil {
		t.Fatalf("start the cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	edges, worker := c.Nodes[:2], c.Nodes[2]
	p, err := c.InstallPortico(ctx, PorticoOptions{Root: root, Chart: filepath.Join(prev, "deploy/helm/portico"), Tag: "e2e-prev", Edges: edges})
	if err != nil {
		t.Fatalf("install the previous release (%s): %v\n%s", from, err, c.tails())
	}
	if p.Traffic, err = p.C.Net.StartCaptureOf(t.TempDir(), fmt.Sprintf("tcp port 80 and host %s", GroupVIP)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Traffic.Stop)
	if _, err := c.DeployExample(ctx, []*Node{worker}); err != nil {
		t.Fatal(err)
	}
	waitServed(t, p, "web.example", "/", edges)

	logs := p.RecordAgentLogs(ctx, "portico-agent")
	defer logs.Stop()
	load := startKeepAliveLoad(ctx, p, 4)
	stream := p.StartStream(ctx, "web.example", traffic.StreamOptions{Every: 10 * time.Millisecond, Timeout: slowAnswer, For: 4 * time.Minute})
	time.Sleep(time.Second)
	start := time.Now()
	upErr := p.Upgrade(ctx, 4*time.Minute, "image.tag=e2e-1")
	took := time.Since(start)
	time.Sleep(2 * time.Second)
	atts := stream.Stop()
	ok, failed, errs := load.Stop()
	if upErr != nil {
		t.Fatalf("helm upgrade from %s: %v", from, upErr)
	}
	t.Logf("helm upgrade from %s to this tree rolled %d agents out: %.1f s; kept-alive requests: %d answered, %d failed %v",
		from, len(edges), took.Seconds(), ok, failed, errs)
	if f := failures(t, p, atts, start); f.Failed > 0 || failed > 0 {
		t.Errorf("during the upgrade %d new connections and %d kept-alive requests failed, want 0", f.Failed, failed)
		t.Logf("what xdp_lb counted:\n%s", p.AgentCommand(ctx, "portico-agent", "counters"))
		t.Logf("what the agents said:\n%s", logs.Lines(`"level":"info"`, `"level":"warn"`, `"level":"error"`))
	}
	if ok == 0 {
		t.Error("no kept-alive request was answered")
	}
	agents, err := p.Agents(ctx, "portico-agent")
	if err != nil {
		t.Fatal(err)
	}
	if len(agents) != len(edges) {
		t.Errorf("agents after the upgrade: %v, want one on each of %d edges", agents, len(edges))
	}
	want := PorticoRepository + ":e2e-1"
	for node, name := range agents {
		pod, err := c.Kube.CoreV1().Pods(PorticoNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := pod.Spec.Containers[0].Image; got != want {
			t.Errorf("agent on %s runs %s after the upgrade, want %s", node, got, want)
		}
	}
}

// revision is a commit to upgrade from, what named it, and its time (Unix
// seconds).
type revision struct{ name, commit, time string }

func (r revision) String() string { return fmt.Sprintf("%s (%.12s)", r.name, r.commit) }

// previousRevision is PORTICO_UPGRADE_FROM if set, else the last tag reachable
// from HEAD, else HEAD's parent, in the repository at dir.
func previousRevision(dir string) (revision, error) {
	git := func(args ...string) (string, error) {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		out, err := cmd.Output()
		return strings.TrimSpace(string(out)), err
	}
	name := os.Getenv("PORTICO_UPGRADE_FROM")
	if name == "" {
		if tag, err := git("describe", "--tags", "--abbrev=0", "HEAD"); err == nil && tag != "" {
			name = tag
		} else {
			name = "HEAD~1"
		}
	}
	commit, err := git("rev-parse", "--verify", name+"^{commit}")
	if err != nil {
		return revision{}, fmt.Errorf("git rev-parse %s: %w", name, err)
	}
	when, err := git("log", "-1", "--format=%ct", commit)
	if err != nil {
		return revision{}, fmt.Errorf("git log %s: %w", name, err)
	}
	return revision{name, commit, when}, nil
}

// exportRevision writes the tree of commit in the repository at dir into out
// (git archive: the repository is not changed).
func exportRevision(ctx context.Context, dir, commit, out string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", dir, commit, out)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("export %.12s: %w: %s", commit, err, b)
	}
	return nil
}
