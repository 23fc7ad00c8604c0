package traffic

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/portico-edge/portico/test/netlab"
	"github.com/portico-edge/portico/test/testenv"
)

// TestStreamLateAnswers: a backend that answers every third request 1.2 s late
// (past the stream's 500 ms) and every other at once. The late ones fail, and,
// with StreamOptions.Late, the stream tells when their answers came; without it,
// nothing.
func TestStreamLateAnswers(t *testing.T) {
	testenv.RequireRoot(t, "a network namespace")
	lab, err := netlab.New("ps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Errorf("clean up lab: %v", err)
		}
	})
	mac, _ := net.ParseMAC("02:00:0a:d8:00:01")
	n, err := lab.AddNode("c", netip.MustParsePrefix("10.216.0.1/24"), mac)
	if err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	if err := netlab.Do(n.NS, func() (err error) {
		ln, err = net.Listen("tcp", "10.216.0.1:80")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var served atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if served.Add(1)%3 == 0 {
			time.Sleep(1200 * time.Millisecond)
		}
		fmt.Fprint(w, "pod=p1 edge=e1\n")
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	l := Target{NS: n.NS, VIP: n.Addr.Addr()}
	for _, late := range []time.Duration{0, 3 * time.Second} {
		served.Store(0)
		start := time.Now()
		s := l.StartStream(context.Background(), "x", StreamOptions{Every: 50 * time.Millisecond, Timeout: 500 * time.Millisecond, Max: 30, Late: late})
		time.Sleep(30*50*time.Millisecond + 200*time.Millisecond) // its 30 attempts started
		atts := s.Stop()
		f := FailuresAround(atts, start)
		if f.Total != 30 || f.Failed != 10 || f.Unanswered != 10 {
			t.Fatalf("Late %v: %v, want 10 of 30 failed, each unanswered", late, f)
		}
		got := LateAnswers(atts, start)
		t.Logf("Late %v: %s", late, got)
		if late == 0 {
			if !strings.HasPrefix(got, "0 of 10 ") {
				t.Errorf("without Late: %q, want none answered later", got)
			}
			continue
		}
		if !strings.HasPrefix(got, "10 of 10 ") || !strings.Contains(got, "map[e1:10]") {
			t.Errorf("with Late: %q, want all 10 answered later, by e1", got)
		}
		for _, a := range atts {
			if a.Err != nil && (a.Late < 1200*time.Millisecond || a.Late > 3*time.Second) {
				t.Errorf("a late answer noted after %v, want 1.2 s and a little more", a.Late)
			}
		}
	}
}
