package lab

import (
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/portico-edge/portico/test/netlab"
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
