package cluster

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/portico-edge/portico/controlplane"
	"github.com/portico-edge/portico/test/testenv"
)

// knownFailures are the suite's tests make test skips, each with why, until
// Portico passes them (make conformance runs them all); none today.
var knownFailures []string

// TestGatewayConformance runs Gateway API's conformance suite, v1.6.3, unmodified
// (hack/conformance.sh compiles its own test), against Portico installed by its
// chart on a real cluster: three kubelet nodes, two of them edges, the suite's
// backends (echo-basic, CoreDNS) built from their sources and imported into every
// node under the names its manifests use. The suite runs from the client's
// network namespace, which reaches both the API server and the Gateways' VIPs.
//
// make test runs the GATEWAY-HTTP profile, knownFailures skipped. make
// conformance (PORTICO_CONFORMANCE=1) runs every test of
// PORTICO_CONFORMANCE_PROFILES (default GATEWAY-HTTP), or PORTICO_CONFORMANCE_RUN
// alone, and writes the suite's report to PORTICO_CONFORMANCE_REPORT.
func TestGatewayConformance(t *testing.T) {
	Require(t)
	if _, err := HelmBinary(root); err != nil {
		testenv.Unavailable(t, "%v", err)
	}
	full := os.Getenv("PORTICO_CONFORMANCE") != ""
	profiles := cmpOr(os.Getenv("PORTICO_CONFORMANCE_PROFILES"), "GATEWAY-HTTP")
	if !full {
		profiles = "GATEWAY-HTTP"
	}
	timeout := 20 * time.Minute
	if full {
		timeout = 85 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// Every profile needs both backends: the suite's base manifests start CoreDNS
	// too, and wait for every pod.
	bins, err := conformanceBinaries()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	archive, err := BuildPorticoImage(ctx, root, filepath.Join(dir, "image"), "conformance")
	if err != nil {
		t.Fatal(err)
	}
	images, err := BuildConformanceImages(dir)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Start(ctx, Options{Nodes: 3, Images: append([]string{archive}, images...)})
	if err != nil {
		t.Fatalf("start the cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	// Every Gateway has an address of its own: a VIP pool with room for all
	// those the suite creates (the lab's /28 has 14).
	if _, err := c.InstallPortico(ctx, PorticoOptions{Root: root, Tag: "conformance", Edges: c.Nodes[:2], Set: []string{"vipPool=" + conformancePool.String()}}); err != nil {
		t.Fatalf("install Portico: %v\n%s", err, c.tails())
	}
	report := os.Getenv("PORTICO_CONFORMANCE_REPORT")
	if report == "" || !full {
		report = filepath.Join(dir, "report.yaml")
	}
	args := []string{"nsenter", "--net=/run/netns/" + c.Client.NS, "--", bins["conformance.test"],
		"-test.v", "-test.run", "^TestConformance$", "-test.timeout", "80m",
		"-kubeconfig", c.Kubeconfig, "-gateway-class", "portico",
		"-conformance-profiles", profiles, "-supported-features", strings.Join(controlplane.GatewayFeatures, ","),
		"-organization", "portico-edge", "-project", "portico", "-url", "https://github.com/portico-edge/portico",
		"-version", "main", "-contact", "https://github.com/portico-edge/portico/issues", "-mode", "default",
		"-report-output", report,
		// GatewayStaticAddresses: an address of the chart's VIP pool, and a
		// node's (never a VIP).
		"-usable-address", lastUsable(conformancePool).String(), "-unusable-address", c.Nodes[0].IP.String()}
	if one := os.Getenv("PORTICO_CONFORMANCE_RUN"); one != "" && full {
		args = append(args, "-run-test", one)
	}
	if !full && len(knownFailures) > 0 {
		args = append(args, "-skip-tests", strings.Join(knownFailures, ","))
	}
	log := filepath.Join(dir, "suite.log")
	if d := os.Getenv("PORTICO_CONFORMANCE_LOG"); d != "" && full {
		log = d
	}
	t.Logf("running the suite (%s), its log in %s", profiles, log)
	res, err := runSuite(ctx, args, log)
	t.Logf("suite: %d passed, %d failed, %d skipped (%v)", len(res.passed), len(res.failed), len(res.skipped), err)
	t.Logf("passed: %s", strings.Join(res.passed, " "))
	t.Logf("skipped: %s", strings.Join(res.skipped, " "))
	if len(res.failed) > 0 || err != nil {
		t.Errorf("failed: %s; %v\n%s", strings.Join(res.failed, " "), err, res.tail)
	}
	if os.Getenv("PORTICO_CONFORMANCE_RUN") == "" && len(res.passed) < 60 {
		t.Errorf("%d of the suite's tests passed, want 60 or more (GATEWAY-HTTP: 36 core and 27 extended pass)", len(res.passed))
	}
	if b, err := os.ReadFile(report); err == nil {
		t.Logf("report %s:\n%s", report, b)
	}
}

// conformancePool is the chart's vipPool for the suite: free addresses of the
// bridge's subnet (nodes are .11 up, the client .100, GroupVIP .200, VIPPool
// .208/28).
var conformancePool = netip.MustParsePrefix("10.251.0.128/26")

// lastUsable is the last address of an IPv4 prefix but its broadcast address:
// one the Gateways the suite creates before its static-address test do not
// take (the pool hands out its lowest free addresses first).
func lastUsable(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	n := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	n |= 1<<(32-p.Bits()) - 1
	n--
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// suiteResult is what the suite's verbose output says of each of its tests
// (TestConformance/<ShortName>).
type suiteResult struct {
	passed, failed, skipped []string
	tail                    string // the output's last lines
}

var suiteLine = regexp.MustCompile(`^\s*--- (PASS|FAIL|SKIP): TestConformance/([A-Za-z0-9]+) `)

// runSuite runs the suite's binary (argv), its output to log, and reads each
// test's result from it.
func runSuite(ctx context.Context, argv []string, log string) (suiteResult, error) {
	var res suiteResult
	f, err := os.Create(log)
	if err != nil {
		return res, err
	}
	defer f.Close()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = filepath.Dir(log)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return res, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait(); pw.Close() }()
	var tail []string
	sc := bufio.NewScanner(pr)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(f, line)
		tail = append(tail, line)
		if len(tail) > 60 {
			tail = tail[1:]
		}
		m := suiteLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		switch m[1] {
		case "PASS":
			res.passed = append(res.passed, m[2])
		case "FAIL":
			res.failed = append(res.failed, m[2])
		case "SKIP":
			res.skipped = append(res.skipped, m[2])
		}
	}
	err = <-done
	for _, l := range []*[]string{&res.passed, &res.failed, &res.skipped} {
		slices.Sort(*l)
		*l = slices.Compact(*l)
	}
	res.tail = strings.Join(tail, "\n")
	return res, err
}
