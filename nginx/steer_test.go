package nginx

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/portico-edge/portico/controlplane/model"
	"github.com/portico-edge/portico/test/testenv"
)

// lineBackend is a TCP endpoint that answers each line it reads with its name
// and the line, so a client sees which endpoint holds its connection and what
// nginx sent first (a PROXY header, say).
func lineBackend(t *testing.T, name string) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					fmt.Fprintf(c, "%s %s\n", name, sc.Text())
				}
			}()
		}
	}()
	return netip.MustParseAddrPort(ln.Addr().String())
}

// lineClient is a connection to nginx that asks lineBackend.
type lineClient struct {
	c  net.Conn
	rd *bufio.Reader
}

func dialLine(t *testing.T, to netip.AddrPort) *lineClient {
	t.Helper()
	c, err := net.DialTimeout("tcp", to.String(), 2*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", to, err)
	}
	t.Cleanup(func() { c.Close() })
	return &lineClient{c: c, rd: bufio.NewReader(c)}
}

func (l *lineClient) ask(q string) (string, error) {
	l.c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := fmt.Fprintln(l.c, q); err != nil {
		return "", err
	}
	s, err := l.rd.ReadString('\n')
	return strings.TrimSuffix(s, "\n"), err
}

// TestSteeredL4ServicesNeedNoReload runs real nginx with the steered listeners
// (Options.L4Steered). A connection to a listener's own port on 127.0.0.1 is
// what the sk_lookup program makes of a connection to VIP 127.0.0.1 and that
// port, so Services on those VIP:ports exercise routes, files and portico.js
// without BPF. Asserted: after the first TCP Service, another Service, new
// endpoints, the PROXY protocol turned off and a Service removed each change
// routes and files only (no reload); SteerL4 gets every route, and nginx's
// master once, when it starts (its listeners stay the same without a reload); a held connection keeps its endpoint across all of it while new
// ones take the new endpoints; a removed route's file goes.
func TestSteeredL4ServicesNeedNoReload(t *testing.T) {
	e1, e2 := lineBackend(t, "e1"), lineBackend(t, "e2")
	steered := testenv.Ports(t, 2)
	vip := netip.MustParseAddr("127.0.0.1")
	plain, proxy := netip.AddrPortFrom(vip, steered[0]), netip.AddrPortFrom(vip, steered[1])
	svc := func(name string, port uint16, pp bool, eps ...netip.AddrPort) (model.Service, model.Upstream) {
		up := "t-" + name + "-tcp"
		return model.Service{Name: "t/" + name, VIPs: []netip.Addr{vip}, ProxyProtocol: pp,
			Ports: []model.ServicePort{{Protocol: model.TCP, Port: port, Upstream: up}}}, model.Upstream{Name: up, Endpoints: eps}
	}
	snap := func(svcs ...func() (model.Service, model.Upstream)) model.Snapshot {
		var s model.Snapshot
		for _, f := range svcs {
			sv, up := f()
			s.Services = append(s.Services, sv)
			s.Upstreams = append(s.Upstreams, up)
		}
		return s
	}
	a := func(eps ...netip.AddrPort) func() (model.Service, model.Upstream) {
		return func() (model.Service, model.Upstream) { return svc("a", steered[0], false, eps...) }
	}
	b := func(pp bool) func() (model.Service, model.Upstream) {
		return func() (model.Service, model.Upstream) { return svc("b", steered[1], pp, e1) }
	}

	var mu sync.Mutex
	var gotRoutes []L4Route
	var gotPID int
	steer := func(pid int, routes []L4Route) error {
		mu.Lock()
		defer mu.Unlock()
		gotPID, gotRoutes = pid, slices.Clone(routes)
		return nil
	}
	n := startNginxWith(t, snap(a(e1)), func(c *ReloaderConfig) { c.SteerL4 = steer },
		func(o *Options) { o.L4Steered = [2]uint16{steered[0], steered[1]}; o.ListenIPv6 = false })
	routes := func() ([]L4Route, int) {
		mu.Lock()
		defer mu.Unlock()
		return gotRoutes, gotPID
	}
	// The first apply comes before nginx starts (pid 0); the start steers
	// again, with the master.
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := routes(); pid == 0 && time.Now().Before(deadline); _, pid = routes() {
		time.Sleep(10 * time.Millisecond)
	}
	if r, pid := routes(); !slices.Equal(r, []L4Route{{VIP: plain, Class: PlainRoute}}) || pid == 0 {
		t.Fatalf("SteerL4 got %v from pid %d, want %v from nginx's master", r, pid, plain)
	}

	held := dialLine(t, plain)
	if got, err := held.ask("hello"); err != nil || got != "e1 hello" {
		t.Fatalf("first connection: %q, %v; want e1", got, err)
	}
	ctx := context.Background()
	dir := resolve(n.r.cfg.Dir, n.opt.L4Dir)
	for _, step := range []struct {
		name       string
		snap       model.Snapshot
		routes     []L4Route
		newA, newB string // what a new connection to each answers first ("" refused or closed)
		files      []string
	}{
		{"another Service, new endpoints", snap(a(e2), b(true)), []L4Route{{VIP: plain, Class: PlainRoute}, {VIP: proxy, Class: ProxyRoute}}, "e2 x", "e1 PROXY TCP4 127.0.0.1 127.0.0.1",
			[]string{"127.0.0.1_" + fmt.Sprint(steered[0]), "127.0.0.1_" + fmt.Sprint(steered[1])}},
		// The listener a connection reaches is the route's class; a direct
		// connection here cannot show it, the routes do.
		{"the PROXY protocol off", snap(a(e2), b(false)), []L4Route{{VIP: plain, Class: PlainRoute}, {VIP: proxy, Class: PlainRoute}}, "e2 x", "-",
			[]string{"127.0.0.1_" + fmt.Sprint(steered[0]), "127.0.0.1_" + fmt.Sprint(steered[1])}},
		{"a Service removed", snap(b(true)), []L4Route{{VIP: proxy, Class: ProxyRoute}}, "", "e1 PROXY TCP4 127.0.0.1 127.0.0.1",
			[]string{"127.0.0.1_" + fmt.Sprint(steered[1])}},
	} {
		res, err := n.r.ApplyNow(ctx, step.snap)
		if err != nil {
			t.Fatalf("%s: apply: %v", step.name, err)
		}
		if res.Result != ResultUnchanged && res.Result != ResultTable {
			t.Errorf("%s: apply result %q, want no reload", step.name, res.Result)
		}
		// Routes come sorted by VIP and port, files by name; the ports are
		// random.
		slices.SortFunc(step.routes, func(a, b L4Route) int { return a.VIP.Compare(b.VIP) })
		slices.Sort(step.files)
		if r, pid := routes(); !slices.Equal(r, step.routes) {
			t.Errorf("%s: routes %v, want %v", step.name, r, step.routes)
		} else if pid != 0 {
			t.Errorf("%s: SteerL4 was asked to register master %d's listeners again; nothing reloaded", step.name, pid)
		}
		ents, err := os.ReadDir(filepath.Join(dir, steeredDir))
		if err != nil {
			t.Fatal(err)
		}
		var files []string
		for _, e := range ents {
			files = append(files, e.Name())
		}
		if !slices.Equal(files, step.files) {
			t.Errorf("%s: route files %v, want %v", step.name, files, step.files)
		}
		for _, c := range []struct {
			to   netip.AddrPort
			want string
		}{{plain, step.newA}, {proxy, step.newB}} {
			if c.want == "-" {
				continue
			}
			got := ""
			if conn, err := net.DialTimeout("tcp", c.to.String(), 2*time.Second); err == nil {
				l := &lineClient{c: conn, rd: bufio.NewReader(conn)}
				got, _ = l.ask("x")
				conn.Close()
			}
			if !strings.HasPrefix(got, c.want) || (c.want == "") != (got == "") {
				t.Errorf("%s: a new connection to %s answered %q, want %q...", step.name, c.to, got, c.want)
			}
		}
		if got, err := held.ask("still"); err != nil || got != "e1 still" {
			t.Errorf("%s: the held connection answered %q, %v; want e1, which it opened on", step.name, got, err)
		}
	}
}
