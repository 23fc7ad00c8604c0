package lab

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/portico-edge/portico/test/netlab"
	"github.com/portico-edge/portico/test/traffic"
)

// ServePods starts an HTTP server on BackendPort in every pod namespace. Each
// answers "pod=<name> edge=<address nginx connected from> client=<X-Real-IP>",
// so a test can tell which edge node's nginx served a request and that the
// client's address survived. Two kinds of requests get that answer as lines of
// a long-lived exchange (traffic.Upgraded, traffic.Feed):
//   - one asking for an upgrade to websocket (Connection: Upgrade, Upgrade:
//     websocket), on any path, is answered 101 and then echoed: one answer for
//     each line it sends, and a heartbeat line ("ping ...") every 20 s;
//   - GET /feed is answered with a line every 500 ms, unbuffered by nginx
//     (X-Accel-Buffering: no), until the client goes.
//
// Each ends after 10 minutes at most; every line ends with " seq=<n>".
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
			answer := fmt.Sprintf("pod=%s edge=%s client=%s host=%s path=%s", name, edge, r.Header.Get("X-Real-IP"), r.Host, r.URL.Path)
			switch {
			case strings.EqualFold(r.Header.Get("Upgrade"), "websocket") && upgrades(r.Header):
				echoUpgraded(w, answer)
			case r.URL.Path == "/feed":
				feed(w, r, answer)
			default:
				fmt.Fprintln(w, answer)
			}
		})}
		l.Net.OnClose(func() error { return srv.Close() })
		go srv.Serve(ln)
	}
	return nil
}

// upgrades reports whether a request's Connection header has the token upgrade.
func upgrades(h http.Header) bool {
	for _, v := range h.Values("Connection") {
		for _, tok := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "upgrade") {
				return true
			}
		}
	}
	return false
}

// podLifetime bounds a pod's upgraded connections and streaming responses.
const podLifetime = 10 * time.Minute

// echoUpgraded answers 101 on the request's connection and then echoes: answer
// and a sequence number for every line the client sends; a heartbeat every 20 s,
// so that nginx's proxy_read_timeout (60 s) does not close an idle connection.
func echoUpgraded(w http.ResponseWriter, answer string) {
	c, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer c.Close()
	var mu sync.Mutex
	send := func(line string) error {
		mu.Lock()
		defer mu.Unlock()
		c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_, err := io.WriteString(c, line)
		return err
	}
	if err := send("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"); err != nil {
		return
	}
	end := time.Now().Add(podLifetime)
	done := make(chan struct{})
	defer close(done)
	go func() {
		tick := time.NewTicker(20 * time.Second)
		defer tick.Stop()
		for n := 1; time.Now().Before(end); n++ {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			if send(fmt.Sprintf("ping %s seq=%d\n", answer, n)) != nil {
				return
			}
		}
	}()
	c.SetReadDeadline(end)
	for n := 1; n <= 10000; n++ {
		if _, err := brw.ReadString('\n'); err != nil {
			return
		}
		if send(fmt.Sprintf("%s seq=%d\n", answer, n)) != nil {
			return
		}
	}
}

// feed answers a line every 500 ms until the client goes (at most
// podLifetime).
func feed(w http.ResponseWriter, r *http.Request, answer string) {
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("X-Accel-Buffering", "no")
	rc := http.NewResponseController(w)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for n := 1; n <= int(podLifetime/(500*time.Millisecond)); n++ {
		rc.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if _, err := fmt.Fprintf(w, "%s seq=%d\n", answer, n); err != nil {
			return
		}
		if rc.Flush() != nil {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
		}
	}
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
