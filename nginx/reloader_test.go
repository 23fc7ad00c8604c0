package nginx

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/portico-edge/portico/controlplane/model"
)

func TestApplyValidatesSwapsAndSkipsUnchanged(t *testing.T) {
	runner := &fakeRunner{}
	r, _ := newTestReloader(t, runner, ReloaderConfig{})
	ctx := context.Background()
	fm := startFake(r, runner)

	res, err := r.ApplyNow(ctx, hostSnapshot("a.example.com"))
	if err != nil || res.Result != ResultSuccess {
		t.Fatalf("first apply: %+v, %v", res, err)
	}
	good, err := os.ReadFile(r.confPath())
	if err != nil {
		t.Fatal(err)
	}
	// nginx -t does not run Lua: the module the configuration requires must be on
	// disk beside it before the reload.
	if lua, err := os.ReadFile(filepath.Join(r.cfg.Dir, luaModuleFile)); err != nil || !bytes.Equal(lua, luaModule) {
		t.Errorf("Lua module beside nginx.conf: %v (equal to the embedded one: %v)", err, bytes.Equal(lua, luaModule))
	}
	if !bytes.Contains(good, []byte(`require "portico"`)) || luaModuleFile != "portico.lua" {
		t.Errorf("nginx.conf does not require the module the Reloader writes (%s)", luaModuleFile)
	}
	if n, _ := fm.state(); n != 1 {
		t.Fatalf("reloads after first apply = %d, want 1", n)
	}

	res, err = r.ApplyNow(ctx, hostSnapshot("a.example.com"))
	if err != nil || res.Result != ResultUnchanged {
		t.Fatalf("same snapshot again: %+v, %v, want unchanged", res, err)
	}
	if tests, _ := runner.snapshot(); tests != 1 {
		t.Errorf("nginx -t ran %d times, want 1 (unchanged skips it)", tests)
	}

	runner.mu.Lock()
	runner.testErr = errors.New("nginx: [emerg] something")
	runner.mu.Unlock()
	res, err = r.ApplyNow(ctx, withL4(hostSnapshot("a.example.com"), "app/b", 15000))
	if err == nil || res.Result != ResultInvalid {
		t.Fatalf("apply of an invalid candidate: %+v, %v, want invalid", res, err)
	}
	now, _ := os.ReadFile(r.confPath())
	if string(now) != string(good) {
		t.Error("nginx.conf changed although nginx -t refused the candidate")
	}
	if n, _ := fm.state(); n != 1 {
		t.Errorf("reloads after a refused candidate = %d, want still 1", n)
	}
	if got := testutil.ToFloat64(r.m.reloads.WithLabelValues(ResultInvalid)); got != 1 {
		t.Errorf("reloads_total{result=invalid} = %v, want 1", got)
	}
	// The refused text is not tested again until something changes.
	res, _ = r.ApplyNow(ctx, withL4(hostSnapshot("a.example.com"), "app/b", 15000))
	if res.Result != ResultUnchanged {
		t.Errorf("refused snapshot again: %s, want unchanged", res.Result)
	}
	if got := testutil.ToFloat64(r.m.configBytes); got != float64(len(good)) {
		t.Errorf("config_bytes = %v, want %d", got, len(good))
	}
}

// TestApplyRetriesAnAddressNotYetLocal: nginx -t failing to bind a listen address
// the node does not have yet (an L4 Service's VIP the announcer is adding to lo)
// is an error to retry, not a refusal: the same text is tested again.
func TestApplyRetriesAnAddressNotYetLocal(t *testing.T) {
	runner := &fakeRunner{}
	r, _ := newTestReloader(t, runner, ReloaderConfig{})
	ctx := context.Background()
	startFake(r, runner)
	if res, err := r.ApplyNow(ctx, hostSnapshot("a.example.com")); err != nil || res.Result != ResultSuccess {
		t.Fatalf("first apply: %+v, %v", res, err)
	}
	runner.mu.Lock()
	runner.testErr = errors.New("nginx: [emerg] 7#7: bind() to 192.0.2.53:53 failed (99: Cannot assign requested address)")
	runner.mu.Unlock()
	snap := withL4(hostSnapshot("a.example.com"), "app/b", 15000)
	if res, err := r.ApplyNow(ctx, snap); err == nil || res.Result != ResultError {
		t.Fatalf("apply while the address is missing: %+v, %v, want error", res, err)
	}
	runner.mu.Lock()
	runner.testErr = nil
	runner.mu.Unlock()
	if res, err := r.ApplyNow(ctx, snap); err != nil || res.Result != ResultSuccess {
		t.Fatalf("apply once the address is there: %+v, %v, want success", res, err)
	}
	if tests, _ := runner.snapshot(); tests != 3 {
		t.Errorf("nginx -t ran %d times, want 3", tests)
	}
}

func TestApplyReportsProblemsAndKeepsTheRest(t *testing.T) {
	runner := &fakeRunner{}
	r, _ := newTestReloader(t, runner, ReloaderConfig{})
	res, err := r.ApplyNow(context.Background(), hostSnapshot("good.example.com", "bad;host"))
	if err != nil || res.Result != ResultSuccess {
		t.Fatalf("apply: %+v, %v", res, err)
	}
	if len(r.Problems()) != 1 || r.Problems()[0].Reason != model.ReasonInvalidHost {
		t.Fatalf("problems = %v, want one InvalidHost", r.Problems())
	}
	if got := testutil.ToFloat64(r.m.problems.WithLabelValues(string(model.ReasonInvalidHost))); got != 1 {
		t.Errorf("problems{reason=InvalidHost} = %v, want 1", got)
	}
	if r.appliedTable["h:good.example.com"] == "" {
		t.Error("good host missing from the table")
	}
}

// The Reloader is a control-plane sink (controlplane.Sink, not imported here: nginx
// stays free of client-go).
var _ interface {
	Name() string
	Apply(context.Context, model.Snapshot) error
} = (*Reloader)(nil)

// TestCertificateExpiry: portico_tls_certificate_expiry_timestamp_seconds has
// the NotAfter of each Secret's leaf that a host uses, and no series for a
// Secret no host uses any more, nor for one that does not parse.
func TestCertificateExpiry(t *testing.T) {
	runner := &fakeRunner{}
	r, reg := newTestReloader(t, runner, ReloaderConfig{})
	ctx := context.Background()
	startFake(r, runner)
	a, b := selfSigned(t, "a.example.com"), selfSigned(t, "b.example.com")
	a.Name, b.Name = "shop/a-tls", "shop/b-tls"
	broken := model.Certificate{Name: "shop/broken", CertPEM: []byte("not a certificate"), KeyPEM: a.KeyPEM}
	notAfter := func(c model.Certificate) float64 {
		blk, _ := pem.Decode(c.CertPEM)
		leaf, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return float64(leaf.NotAfter.Unix())
	}
	// Each step listens on another L4 port: a reload (a change of the table
	// alone goes to a control socket the fake nginx does not have).
	snap := func(port uint16, certs ...model.Certificate) model.Snapshot {
		s := withL4(hostSnapshot(), "app/l4", port)
		for _, c := range certs {
			s.Certificates = append(s.Certificates, c)
			host := strings.TrimSuffix(strings.TrimPrefix(c.Name, "shop/"), "-tls") + ".example.com"
			s.Servers = append(s.Servers, model.Server{Host: host, TLSCertificate: c.Name,
				Locations: []model.Location{{Path: "/", Type: model.PathPrefix, Upstream: "ns-svc-80"}}})
		}
		return s
	}
	series := func() map[string]float64 {
		got := map[string]float64{}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "portico_tls_certificate_expiry_timestamp_seconds" {
				continue
			}
			for _, m := range mf.GetMetric() {
				l := map[string]string{}
				for _, p := range m.GetLabel() {
					l[p.GetName()] = p.GetValue()
				}
				got[l["secret_namespace"]+"/"+l["secret"]] = m.GetGauge().GetValue()
			}
		}
		return got
	}
	for i, step := range []struct {
		name  string
		certs []model.Certificate
		want  map[string]float64
	}{
		{"two Secrets", []model.Certificate{a, b}, map[string]float64{"shop/a-tls": notAfter(a), "shop/b-tls": notAfter(b)}},
		{"one no longer used", []model.Certificate{a}, map[string]float64{"shop/a-tls": notAfter(a)}},
		{"one that does not parse", []model.Certificate{a, broken}, map[string]float64{"shop/a-tls": notAfter(a)}},
		{"none", nil, map[string]float64{}},
	} {
		if _, err := r.ApplyNow(ctx, snap(uint16(15000+i), step.certs...)); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if d := cmp.Diff(step.want, series()); d != "" {
			t.Errorf("%s: certificate expiry series (-want +got):\n%s", step.name, d)
		}
	}
}
