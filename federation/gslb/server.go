package gslb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Site is one member site as the answers see it.
type Site struct {
	Name string `json:"name"`
	// Addrs are where its clients go (the site's VIPs), IPv4 and IPv6.
	Addrs []netip.Addr `json:"addrs"`
	// Subnets are the client networks nearest to it (locality).
	Subnets []netip.Prefix `json:"subnets,omitempty"`
	// Health is the URL of its health endpoint (its own server's /health).
	Health string `json:"health"`
}

// Config is one site's DNS server.
type Config struct {
	// Self names this server's own site among Sites.
	Self string `json:"self"`
	// Names are the fully qualified names answered (the federated hosts); the
	// server is authoritative for them and answers nothing else.
	Names []string `json:"names"`
	// Sites in order of preference after locality: a client goes to the first
	// healthy site whose Subnets hold its address (or its EDNS client subnet),
	// else to the first healthy site.
	Sites []Site `json:"sites"`
	// TTL of the answers (default 5s): failover through caching resolvers takes
	// at most the detection time plus TTL.
	TTL time.Duration `json:"ttl,omitempty"`
	// Interval between probe rounds (default 1s); ProbeTimeout bounds one probe
	// (default half the interval); a site changes standing after FailAfter
	// (default 3) rounds judged down or RiseAfter (default 2) judged up.
	Interval     time.Duration `json:"interval,omitempty"`
	ProbeTimeout time.Duration `json:"probeTimeout,omitempty"`
	FailAfter    int           `json:"failAfter,omitempty"`
	RiseAfter    int           `json:"riseAfter,omitempty"`

	// OwnHealth judges this site from its own cluster (not serialized).
	OwnHealth func(context.Context) Report `json:"-"`
	// Dial, when set, replaces the probes' dialer (tests cut links with it).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error) `json:"-"`
}

func (c *Config) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if c.Dial != nil {
		return c.Dial(ctx, network, addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// Validate fills the defaults and reports what makes the configuration unusable.
func (c *Config) Validate() error {
	if len(c.Sites) == 0 {
		return errors.New("no sites")
	}
	seen := map[string]bool{}
	for i, s := range c.Sites {
		if s.Name == "" || seen[s.Name] {
			return fmt.Errorf("sites[%d]: name %q empty or listed twice", i, s.Name)
		}
		seen[s.Name] = true
		if len(s.Addrs) == 0 {
			return fmt.Errorf("sites[%d] (%s): no addrs", i, s.Name)
		}
		if s.Name != c.Self && !strings.HasPrefix(s.Health, "http://") && !strings.HasPrefix(s.Health, "https://") {
			return fmt.Errorf("sites[%d] (%s): health %q is not an http(s) URL", i, s.Name, s.Health)
		}
	}
	if !seen[c.Self] {
		return fmt.Errorf("self %q is not among the sites", c.Self)
	}
	if len(c.Names) == 0 {
		return errors.New("no names")
	}
	for i, n := range c.Names {
		if _, ok := dns.IsDomainName(n); !ok || n == "" {
			return fmt.Errorf("names[%d]: %q is not a domain name", i, n)
		}
		c.Names[i] = dns.CanonicalName(n)
	}
	if c.OwnHealth == nil {
		return errors.New("no own health")
	}
	setDefault(&c.TTL, 5*time.Second)
	setDefault(&c.Interval, time.Second)
	setDefault(&c.ProbeTimeout, c.Interval/2)
	if c.FailAfter <= 0 {
		c.FailAfter = 3
	}
	if c.RiseAfter <= 0 {
		c.RiseAfter = 2
	}
	return nil
}

func setDefault(d *time.Duration, v time.Duration) {
	if *d <= 0 {
		*d = v
	}
}

// Server answers for the federated names with the sites it sees healthy.
type Server struct {
	cfg     Config
	log     *zap.Logger
	probe   *prober
	answers *prometheus.CounterVec
	changes *prometheus.CounterVec
}

// New checks cfg and builds a server; reg takes its metrics (nil: none).
func New(cfg Config, log *zap.Logger, reg prometheus.Registerer) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("gslb config: %w", err)
	}
	s := &Server{cfg: cfg, log: log}
	var err error
	if s.answers, s.changes, err = newMetrics(reg); err != nil {
		return nil, err
	}
	s.probe = newProber(cfg, log)
	s.probe.onChange = func(site string, up bool) {
		dir := map[bool]string{true: "up", false: "down"}[up]
		s.changes.WithLabelValues(dir).Inc()
		log.Info("site standing changed", zap.String("site", site), zap.String("to", dir))
	}
	return s, nil
}

// Up reports each site's standing now.
func (s *Server) Up() map[string]bool { return s.probe.up() }

// Run probes the sites and serves DNS on dnsAddr (UDP and TCP) and the health
// endpoint (GET /health) on healthAddr until ctx ends.
func (s *Server) Run(ctx context.Context, dnsAddr, healthAddr string) error {
	hl, err := net.Listen("tcp", healthAddr)
	if err != nil {
		return fmt.Errorf("listen health: %w", err)
	}
	pc, err := net.ListenPacket("udp", dnsAddr)
	if err != nil {
		hl.Close()
		return fmt.Errorf("listen dns/udp: %w", err)
	}
	tl, err := net.Listen("tcp", dnsAddr)
	if err != nil {
		hl.Close()
		pc.Close()
		return fmt.Errorf("listen dns/tcp: %w", err)
	}
	return s.Serve(ctx, pc, tl, hl)
}

// Serve is Run on listeners the caller opened; it closes them when ctx ends.
func (s *Server) Serve(ctx context.Context, udpConn net.PacketConn, tcpLn, healthLn net.Listener) error {
	// The health endpoint first, with this site's own verdict: the peers are
	// starting too, and each one's first round asks the others.
	s.probe.judgeOwn(ctx)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", s.serveHealth)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	errs := make(chan error, 3)
	go func() { errs <- hs.Serve(healthLn) }()
	s.probe.round(ctx) // know before answering
	go s.probe.run(ctx)
	udp := &dns.Server{PacketConn: udpConn, Handler: s}
	tcp := &dns.Server{Listener: tcpLn, Handler: s}
	go func() { errs <- udp.ActivateAndServe() }()
	go func() { errs <- tcp.ActivateAndServe() }()
	var err error
	select {
	case <-ctx.Done():
	case err = <-errs:
	}
	hs.Close()
	udp.Shutdown()
	tcp.Shutdown()
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func (s *Server) serveHealth(w http.ResponseWriter, _ *http.Request) {
	rep := s.probe.report()
	w.Header().Set("Content-Type", "application/json")
	if !rep.Healthy {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(rep)
}

// ServeDNS implements dns.Handler.
func (s *Server) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	m := s.answer(r, clientAddr(w.RemoteAddr()))
	if err := w.WriteMsg(m); err != nil {
		s.log.Debug("write dns answer", zap.Error(err))
	}
}

func clientAddr(a net.Addr) netip.Addr {
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// answer is the reply to r from a client at from (its EDNS client subnet wins).
func (s *Server) answer(r *dns.Msg, from netip.Addr) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	if len(r.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		return m
	}
	q := r.Question[0]
	name := dns.CanonicalName(q.Name)
	if !slices.Contains(s.cfg.Names, name) {
		m.Authoritative = false
		m.Rcode = dns.RcodeRefused
		s.answers.WithLabelValues("none").Inc()
		return m
	}
	client, ecs := from, (*dns.EDNS0_SUBNET)(nil)
	if opt := r.IsEdns0(); opt != nil {
		m.SetEdns0(opt.UDPSize(), false)
		for _, o := range opt.Option {
			if e, ok := o.(*dns.EDNS0_SUBNET); ok {
				if a, ok := netip.AddrFromSlice(e.Address); ok {
					client, ecs = a.Unmap(), e
				}
			}
		}
	}
	site, scope := s.pick(client)
	label := "all"
	var addrs []netip.Addr
	if site != nil {
		label, addrs = site.Name, site.Addrs
	} else {
		// No site is healthy: answer every site rather than nothing (an empty
		// answer is an outage for certain; a site judged down may still serve).
		for _, st := range s.cfg.Sites {
			addrs = append(addrs, st.Addrs...)
		}
	}
	s.answers.WithLabelValues(label).Inc()
	ttl := uint32(s.cfg.TTL / time.Second)
	hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: ttl}
	for _, a := range addrs {
		switch {
		case q.Qtype == dns.TypeA && a.Is4():
			hdr.Rrtype = dns.TypeA
			m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: a.AsSlice()})
		case q.Qtype == dns.TypeAAAA && a.Is6():
			hdr.Rrtype = dns.TypeAAAA
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
		}
	}
	if ecs != nil {
		reply := *ecs
		reply.SourceScope = scope
		if opt := m.IsEdns0(); opt != nil {
			opt.Option = append(opt.Option, &reply)
		}
	}
	return m
}

// pick chooses the site for a client: the first healthy site whose subnets hold it,
// else the first healthy site; nil when none is healthy. scope is the prefix length
// that decided (for an EDNS client subnet reply), 0 when locality did not.
func (s *Server) pick(client netip.Addr) (*Site, uint8) {
	up := s.probe.up()
	var first *Site
	for i := range s.cfg.Sites {
		st := &s.cfg.Sites[i]
		if !up[st.Name] {
			continue
		}
		if first == nil {
			first = st
		}
		for _, p := range st.Subnets {
			if client.IsValid() && p.Contains(client) {
				return st, uint8(p.Bits())
			}
		}
	}
	return first, 0
}

// newMetrics makes the server's series and registers them on reg (nil: none).
func newMetrics(reg prometheus.Registerer) (answers, changes *prometheus.CounterVec, err error) {
	answers = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "portico", Subsystem: "gslb", Name: "answers_total",
		Help: "DNS answers by the site they name (or all, when none is healthy; none for other names)."}, []string{"site"})
	changes = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "portico", Subsystem: "gslb", Name: "site_changes_total",
		Help: "Sites' changes of standing by direction (up, down)."}, []string{"direction"})
	if reg != nil {
		for _, c := range []prometheus.Collector{answers, changes} {
			if err := reg.Register(c); err != nil {
				return nil, nil, err
			}
		}
	}
	return answers, changes, nil
}

// DescribeMetrics registers on reg the server's series, with no values behind
// them: for the generated metrics table (hack/metricsdoc).
func DescribeMetrics(reg prometheus.Registerer) error {
	_, _, err := newMetrics(reg)
	return err
}
