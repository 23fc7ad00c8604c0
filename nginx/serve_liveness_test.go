package nginx

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/portico-edge/portico/controlplane/model"
)

// TestServeLiveness: the liveness server answers every director's probe, many
// on one kept-alive connection, and nothing else.
func TestServeLiveness(t *testing.T) {
	n := startNginx(t, model.Snapshot{})
	c, err := net.Dial("tcp", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), n.opt.LivenessPort).String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	var body string
	ask := func(path string) int {
		t.Helper()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: portico-liveness\r\n\r\n", path)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		resp.Body.Close()
		if resp.Close {
			t.Fatalf("%s: nginx closed the kept-alive connection", path)
		}
		return resp.StatusCode
	}
	for i := 0; i < 200; i++ {
		if got := ask("/live"); got != http.StatusOK || body != "live\n" {
			t.Fatalf("probe %d: status %d, %q (want 200, \"live\" and no verdicts)", i, got, body)
		}
	}
	if got := ask("/healthz"); got != http.StatusNotFound {
		t.Errorf("/healthz on the liveness port: %d, want 404", got)
	}

	// The agent's verdicts: answered to every probe (the other edges learn
	// from them that they are called down), replaced whole, checked line by
	// line (a bad table is refused and the last good one stays).
	ctx := context.Background()
	down := []netip.Addr{netip.MustParseAddr("10.0.0.3"), netip.MustParseAddr("fd00::7"), netip.MustParseAddr("::ffff:10.0.0.4")}
	if err := n.r.PushVerdicts(ctx, down); err != nil {
		t.Fatal(err)
	}
	want := "live\ndown 10.0.0.3\ndown fd00::7\ndown 10.0.0.4\n"
	if got := ask("/live"); got != http.StatusOK || body != want {
		t.Errorf("/live with verdicts: %d %q, want 200 %q", got, body, want)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPut, verdictsURL, strings.NewReader("down 10.0.0.3\nrm -rf /\n"))
	if _, err := controlDo(n.r.ctl, req); err == nil || !strings.Contains(err.Error(), "bad line") {
		t.Errorf("a bad verdicts table: %v, want refused (bad line)", err)
	}
	if got := ask("/live"); got != http.StatusOK || body != want {
		t.Errorf("/live after a refused table: %d %q, want the last good one %q", got, body, want)
	}
	if err := n.r.PushVerdicts(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if got := ask("/live"); got != http.StatusOK || body != "live\n" {
		t.Errorf("/live with no verdicts: %d %q", got, body)
	}
}
