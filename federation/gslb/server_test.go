package gslb

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/miekg/dns"
	"go.uber.org/zap/zaptest"

	"github.com/portico-edge/portico/test/testenv"
)

// testSites are three sites: a (10.1.0.0/16's clients), b (10.2.0.0/16's), c.
func testSites() []Site {
	return []Site{
		{Name: "a", Addrs: addrs("192.0.2.1", "2001:db8::1"), Subnets: prefixes("10.1.0.0/16"), Health: "http://a.invalid/health"},
		{Name: "b", Addrs: addrs("192.0.2.2"), Subnets: prefixes("10.2.0.0/16", "2001:db8:2::/48"), Health: "http://b.invalid/health"},
		{Name: "c", Addrs: addrs("192.0.2.3"), Health: "http://c.invalid/health"},
	}
}

func parseAll[T any](parse func(string) T, s ...string) []T {
	out := make([]T, 0, len(s))
	for _, v := range s {
		out = append(out, parse(v))
	}
	return out
}

func addrs(s ...string) []netip.Addr      { return parseAll(netip.MustParseAddr, s...) }
func prefixes(s ...string) []netip.Prefix { return parseAll(netip.MustParsePrefix, s...) }

func healthy(context.Context) Report { return Report{Healthy: true} }

// query builds a question, with an EDNS client subnet when ecs is valid.
func query(name string, qtype uint16, ecs netip.Prefix) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	if ecs.IsValid() {
		m.SetEdns0(1232, false)
		fam := uint16(1)
		if ecs.Addr().Is6() {
			fam = 2
		}
		m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: fam,
			SourceNetmask: uint8(ecs.Bits()), Address: ecs.Addr().AsSlice()})
	}
	return m
}

func answerAddrs(m *dns.Msg) []string {
	var out []string
	for _, rr := range m.Answer {
		switch r := rr.(type) {
		case *dns.A:
			out = append(out, r.A.String())
		case *dns.AAAA:
			out = append(out, r.AAAA.String())
		}
	}
	return out
}

// TestAnswer: locality by source address or EDNS client subnet, the configured
// order when the nearest site is down, every site when none is up (never empty),
// REFUSED for other names, AAAA from the sites that have IPv6.
func TestAnswer(t *testing.T) {
	s, err := New(Config{Self: "a", Names: []string{"Shop.Example.Test"}, Sites: testSites(), OwnHealth: healthy}, zaptest.NewLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	setUp := func(up map[string]bool) {
		s.probe.mu.Lock()
		defer s.probe.mu.Unlock()
		for n, st := range s.probe.sites {
			st.up = up[n]
		}
		s.probe.publishLocked()
	}
	all := map[string]bool{"a": true, "b": true, "c": true}
	tests := []struct {
		name   string
		up     map[string]bool
		qname  string
		qtype  uint16
		from   string
		ecs    string
		want   []string
		rcode  int
		scope  int // -1: no ECS in the reply
		answer string
	}{
		{name: "a's client by source", up: all, from: "10.1.2.3", want: []string{"192.0.2.1"}, scope: -1},
		{name: "b's client by source", up: all, from: "10.2.9.9", want: []string{"192.0.2.2"}, scope: -1},
		{name: "b's client by client subnet behind a resolver", up: all, from: "127.0.0.1", ecs: "10.2.7.0/24", want: []string{"192.0.2.2"}, scope: 16},
		{name: "no locality: first site", up: all, from: "198.51.100.7", ecs: "198.51.100.0/24", want: []string{"192.0.2.1"}, scope: 0},
		{name: "b down: b's client goes to the first healthy", up: map[string]bool{"a": true, "c": true}, from: "10.2.9.9", want: []string{"192.0.2.1"}, scope: -1},
		{name: "a and b down", up: map[string]bool{"c": true}, from: "10.2.9.9", want: []string{"192.0.2.3"}, scope: -1},
		{name: "none up: every site, never empty", up: map[string]bool{}, from: "10.2.9.9", want: []string{"192.0.2.1", "192.0.2.2", "192.0.2.3"}, scope: -1},
		{name: "AAAA", up: all, qtype: dns.TypeAAAA, from: "10.1.0.9", want: []string{"2001:db8::1"}, scope: -1},
		{name: "AAAA of a site without IPv6: no data", up: all, qtype: dns.TypeAAAA, from: "10.2.0.9", want: nil, scope: -1},
		{name: "case and trailing dot do not matter", up: all, qname: "SHOP.example.test.", from: "10.1.0.9", want: []string{"192.0.2.1"}, scope: -1},
		{name: "another name: refused", up: all, qname: "other.example.test.", from: "10.1.0.9", rcode: dns.RcodeRefused, scope: -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			setUp(tc.up)
			if tc.qname == "" {
				tc.qname = "shop.example.test."
			}
			if tc.qtype == 0 {
				tc.qtype = dns.TypeA
			}
			var ecs netip.Prefix
			if tc.ecs != "" {
				ecs = netip.MustParsePrefix(tc.ecs)
			}
			m := s.answer(query(tc.qname, tc.qtype, ecs), netip.MustParseAddr(tc.from))
			if m.Rcode != tc.rcode {
				t.Fatalf("rcode %s, want %s", dns.RcodeToString[m.Rcode], dns.RcodeToString[tc.rcode])
			}
			if diff := cmp.Diff(tc.want, answerAddrs(m)); diff != "" {
				t.Errorf("answer (-want +got):\n%s", diff)
			}
			for _, rr := range m.Answer {
				if rr.Header().Ttl != 5 {
					t.Errorf("TTL %d, want 5", rr.Header().Ttl)
				}
			}
			scope := -1
			if opt := m.IsEdns0(); opt != nil {
				for _, o := range opt.Option {
					if e, ok := o.(*dns.EDNS0_SUBNET); ok {
						scope = int(e.SourceScope)
					}
				}
			}
			if scope != tc.scope {
				t.Errorf("client subnet scope %d, want %d", scope, tc.scope)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		change  func(*Config)
		wantErr string
	}{
		{name: "fine", change: func(*Config) {}},
		{name: "self unknown", change: func(c *Config) { c.Self = "x" }, wantErr: "not among"},
		{name: "no names", change: func(c *Config) { c.Names = nil }, wantErr: "no names"},
		{name: "bad name", change: func(c *Config) { c.Names = []string{"a..b"} }, wantErr: "not a domain name"},
		{name: "site twice", change: func(c *Config) { c.Sites[1].Name = "a" }, wantErr: "listed twice"},
		{name: "no addrs", change: func(c *Config) { c.Sites[2].Addrs = nil }, wantErr: "no addrs"},
		{name: "peer without health URL", change: func(c *Config) { c.Sites[1].Health = "b:8080" }, wantErr: "not an http"},
		{name: "no own health", change: func(c *Config) { c.OwnHealth = nil }, wantErr: "own health"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{Self: "a", Names: []string{"shop.example.test"}, Sites: testSites(), OwnHealth: healthy}
			tc.change(&c)
			err := c.Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if c.TTL != 5*time.Second || c.FailAfter != 3 || c.RiseAfter != 2 || c.Names[0] != "shop.example.test." {
					t.Errorf("defaults not filled: %+v", c)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
			}
		})
	}
}

// site is one running server of a three-site test federation on loopback.
type site struct {
	name    string
	server  *Server
	dns     string // its DNS address
	health  string // its health endpoint's host:port
	ok      atomic.Bool
	cancel  context.CancelFunc
	stopped chan struct{}
}

// probeTimeout bounds the test servers' probes.
const probeTimeout = time.Second

// federation starts a server per site, every one probing the others every
// interval; cut reports whether the link from one site to another is cut (the
// probes' dialer refuses it).
type federation struct {
	sites map[string]*site
	mu    sync.Mutex
	cut   map[[2]string]bool
}

func startFederation(t *testing.T, interval, ttl time.Duration) *federation {
	t.Helper()
	f := &federation{sites: map[string]*site{}, cut: map[[2]string]bool{}}
	listeners := map[string][3]any{}
	cfgSites := testSites()
	byHealth := map[string]string{} // health host:port -> site
	for i := range cfgSites {
		pc, tl := listenDNS(t)
		hl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		cfgSites[i].Health = "http://" + hl.Addr().String() + "/health"
		byHealth[hl.Addr().String()] = cfgSites[i].Name
		listeners[cfgSites[i].Name] = [3]any{pc, tl, hl}
		f.sites[cfgSites[i].Name] = &site{name: cfgSites[i].Name, dns: pc.LocalAddr().String(), health: hl.Addr().String()}
	}
	for _, cs := range cfgSites {
		st := f.sites[cs.Name]
		st.ok.Store(true)
		self := cs.Name
		// Probes may take up to probeTimeout: a loaded machine must not make a slow
		// answer look like a cut link.
		cfg := Config{Self: self, Names: []string{"shop.example.test"}, Sites: testSites(), TTL: ttl, Interval: interval, ProbeTimeout: probeTimeout,
			OwnHealth: func(context.Context) Report { return Report{Healthy: st.ok.Load()} },
			Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
				f.mu.Lock()
				cut := f.cut[[2]string{self, byHealth[addr]}]
				f.mu.Unlock()
				if cut {
					return nil, errors.New("link cut by the test")
				}
				var d net.Dialer
				return d.DialContext(ctx, network, addr)
			}}
		for i := range cfg.Sites {
			cfg.Sites[i].Health = cfgSites[i].Health
		}
		s, err := New(cfg, zaptest.NewLogger(t).Named(self), nil)
		if err != nil {
			t.Fatal(err)
		}
		st.server = s
		ctx, cancel := context.WithCancel(context.Background())
		st.cancel, st.stopped = cancel, make(chan struct{})
		l := listeners[self]
		go func() {
			defer close(st.stopped)
			if err := s.Serve(ctx, l[0].(net.PacketConn), l[1].(net.Listener), l[2].(net.Listener)); err != nil {
				t.Errorf("site %s: %v", self, err)
			}
		}()
		t.Cleanup(func() { st.stop() })
	}
	return f
}

// listenDNS opens a UDP socket and a TCP listener on one free loopback port (a
// free UDP port may be taken for TCP: try others).
func listenDNS(t *testing.T) (net.PacketConn, net.Listener) {
	t.Helper()
	for try := 0; ; try++ {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		tl, err := net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			return pc, tl
		}
		pc.Close()
		if try == 20 {
			t.Fatalf("no loopback port free for both UDP and TCP: %v", err)
		}
	}
}

func (s *site) stop() {
	s.cancel()
	<-s.stopped
}

func (f *federation) cutLink(a, b string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cut[[2]string{a, b}], f.cut[[2]string{b, a}] = true, true
}

// ask queries a site's server over UDP as a client of subnet ecs would through a
// resolver.
func ask(t *testing.T, server string, ecs string) []string {
	t.Helper()
	c := &dns.Client{Timeout: time.Second}
	m, _, err := c.Exchange(query("shop.example.test.", dns.TypeA, netip.MustParsePrefix(ecs)), server)
	if err != nil {
		t.Fatalf("query %s: %v", server, err)
	}
	return answerAddrs(m)
}

// waitAnswer waits until the server answers want for clients of ecs and returns how
// long that took.
func waitAnswer(t *testing.T, server, ecs string, want string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var got []string
	if _, err := testenv.Poll(context.Background(), within, 20*time.Millisecond, func() bool {
		got = ask(t, server, ecs)
		return len(got) == 1 && got[0] == want
	}); err != nil {
		t.Fatalf("%s for %s: answers %v after %v, want %s", server, ecs, got, within, want)
	}
	return time.Since(start)
}

// TestFailover runs three sites' servers on loopback: locality, a partition between
// two sites that moves nobody, a site that dies (confirmed by the third), a site
// that reports itself unhealthy, and none healthy.
func TestFailover(t *testing.T) {
	const interval = 200 * time.Millisecond
	f := startFederation(t, interval, time.Second)
	a, b, c := f.sites["a"], f.sites["b"], f.sites["c"]
	bClients := "10.2.3.0/24"
	waitAnswer(t, a.dns, bClients, "192.0.2.2", 10*time.Second)
	waitAnswer(t, a.dns, "10.1.3.0/24", "192.0.2.1", 10*time.Second)

	// A partition between a and b: c still reaches both, so neither fails the
	// other over.
	f.cutLink("a", "b")
	// Wait on rounds, not time: every server judges 2×FailAfter rounds after the cut
	// (a loaded machine makes rounds slower, not fewer).
	cutAt := map[string]int{}
	for n, st := range f.sites {
		cutAt[n] = st.server.probe.roundsDone()
	}
	if _, err := testenv.Poll(context.Background(), 30*time.Second, 20*time.Millisecond, func() bool {
		for n, st := range f.sites {
			if st.server.probe.roundsDone() < cutAt[n]+2*3 {
				return false
			}
		}
		return true
	}); err != nil {
		t.Fatal("the servers did not probe 6 rounds within 30 s")
	}
	if reaches := a.server.probe.report().Reaches; reaches["b"] {
		t.Fatalf("the cut did not take: a reaches b (%v)", reaches)
	}
	if got := ask(t, a.dns, bClients); len(got) != 1 || got[0] != "192.0.2.2" {
		t.Errorf("after a partition between a and b, a answers b's clients with %v, want b (192.0.2.2)", got)
	}
	if got := ask(t, b.dns, "10.1.3.0/24"); len(got) != 1 || got[0] != "192.0.2.1" {
		t.Errorf("after a partition between a and b, b answers a's clients with %v, want a (192.0.2.1)", got)
	}
	t.Logf("partition a-b for 6 probe rounds: a still sends b's clients to b, b a's to a")

	// b dies: a cannot reach it and c confirms; b's clients go to a.
	b.stop()
	took := waitAnswer(t, a.dns, bClients, "192.0.2.1", 10*time.Second)
	t.Logf("b dead: a sends b's clients to a after %v (probe every %v, down after 3 rounds)", took.Round(time.Millisecond), interval)

	// c reports itself unhealthy: a stops naming it.
	if got := ask(t, a.dns, "198.51.100.0/24"); len(got) != 1 || got[0] != "192.0.2.1" {
		t.Fatalf("no locality: %v, want a", got)
	}
	a.ok.Store(false)
	took = waitAnswer(t, c.dns, "10.1.3.0/24", "192.0.2.3", 10*time.Second)
	t.Logf("a unhealthy by its own report: c sends a's clients to c after %v", took.Round(time.Millisecond))

	// c unhealthy too, b dead: no site is up; answers name every site.
	c.ok.Store(false)
	if _, err := testenv.Poll(context.Background(), 10*time.Second, 20*time.Millisecond, func() bool { return len(ask(t, c.dns, bClients)) == 3 }); err != nil {
		t.Fatalf("no site healthy: c answers %v, want every site", ask(t, c.dns, bClients))
	}
	// a recovers: after RiseAfter rounds it is named again.
	a.ok.Store(true)
	took = waitAnswer(t, c.dns, bClients, "192.0.2.1", 10*time.Second)
	t.Logf("a healthy again: named after %v", took.Round(time.Millisecond))
}
