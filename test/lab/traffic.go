package lab

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/portico-edge/portico/test/netlab"
	"github.com/portico-edge/portico/test/traffic"
)

// ServePods starts an HTTP server on BackendPort in every pod namespace. Each
// answers "pod=<name> edge=<address nginx connected from> client=<X-Real-IP>",
// so a test can tell which edge node's nginx served a request and that the
// client's address survived.
func (l *Lab) ServePods() error {
	for _, p := range l.Pods {
		var ln net.Listener
		if err := netlab.Do(p.NS, func() (err error) {
			ln, err = net.Listen("tcp4", fmt.Sprintf(":%d", BackendPort))
			return err
		}); err != nil {
			return fmt.Errorf("listen in %s: %w", p.NS, err)
		}
		name := p.Name
		srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			edge, _, _ := net.SplitHostPort(r.RemoteAddr)
			fmt.Fprintf(w, "pod=%s edge=%s client=%s host=%s path=%s\n", name, edge, r.Header.Get("X-Real-IP"), r.Host, r.URL.Path)
		})}
		l.Net.OnClose(func() error { return srv.Close() })
		go srv.Serve(ln)
	}
	return nil
}

// capture starts a netlab.Capture of the lab's bridge for the test's length.
func (l *Lab) capture(t *testing.T) *netlab.Capture {
	t.Helper()
	c, err := l.Net.StartCapture(t.TempDir())
	if err != nil {
		t.Fatalf("capture: %v", err)
	}
	t.Cleanup(c.Stop)
	return c
}

// explain shows, for up to three failed attempts of a stream after fault,
// every captured frame of their connections, and which node each MAC is.
func (l *Lab) explain(c *netlab.Capture, atts []traffic.Attempt, fault time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "the fault at %.3f (Unix seconds, as the agents' logs)\n", float64(fault.UnixNano())/1e9)
	shown := 0
	for _, a := range atts {
		if a.Err == nil || a.SPort == 0 || a.Start.Before(fault) || shown == 3 {
			continue
		}
		shown++
		fmt.Fprintf(&b, "attempt from port %d, %v after the fault: %v\n", a.SPort, a.Start.Sub(fault).Round(time.Millisecond), a.Err)
		b.WriteString(c.Show(fmt.Sprintf("tcp port %d", a.SPort), 60))
		b.WriteString("\n")
	}
	if shown == 0 {
		return ""
	}
	b.WriteString("MACs:")
	for _, n := range append(append([]*Node{l.Client}, l.Edges...), l.Pods...) {
		if n != nil && len(n.MAC) > 0 {
			fmt.Fprintf(&b, " %s=%s", n.Name, n.MAC)
		}
	}
	if l.Router != nil {
		b.WriteString(" (the router's: the other)")
	}
	return b.String()
}
