// Command portico is `make demo-quick` (and, with -lab, `make lab`): the whole
// system in network namespaces. It brings up a real kube-apiserver, three edge nodes each
// running `portico agent`, a client and two backend pods; applies a group, a
// backend Service and Ingresses (one with TLS); shows `kubectl get ingress` with
// the VIP; sends HTTP and HTTPS through the VIP and shows the spread over the
// replicas with the client's real address; kills the VIP owner and measures the
// outage and how many long-lived connections survived; prints `portico status`;
// and tears everything down.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/portico-edge/portico/test/lab"
	"github.com/portico-edge/portico/test/testcert"
	"github.com/portico-edge/portico/test/traffic"
)

func main() {
	portico := flag.String("portico", "bin/portico", "the portico binary")
	kubectl := flag.String("kubectl", "", "a kubectl binary (hack/kapi.sh builds one)")
	hold := flag.Bool("lab", false, "bring the lab up, print how to use it and keep it until interrupted (make lab)")
	flag.Parse()
	mode := run
	if *hold {
		mode = runLab
	}
	if err := withLab(*portico, func(ctx context.Context, l *lab.Lab) error { return mode(ctx, l, *portico, *kubectl) }); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// withLab starts the lab, runs f, and tears the lab down, also on Ctrl-C.
func withLab(portico string, f func(context.Context, *lab.Lab) error) (err error) {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (network namespaces, XDP, VRRP)")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	step("starting a kube-apiserver and the lab: 3 edge nodes, a client, 2 backend pods on one bridge")
	l, err := lab.Start(ctx, lab.Options{Portico: portico})
	if err != nil {
		return err
	}
	defer func() {
		step("tearing down")
		if cerr := l.Close(); cerr != nil && err == nil {
			err = cerr
		}
		fmt.Println("  agents stopped; namespaces, pins, nginx and the API server removed")
	}()
	return f(ctx, l)
}

func step(format string, args ...any) { fmt.Printf("\n==> "+format+"\n", args...) }

// run is the demo: the whole system shown once.
func run(ctx context.Context, l *lab.Lab, portico, kubectl string) error {
	for _, n := range append(append([]*lab.Node{l.Client}, l.Edges...), l.Pods...) {
		fmt.Printf("  %-3s %-15s namespace %s\n", n.Name, n.Addr, n.NS)
	}

	step("applied deploy/namespace.yaml, deploy/examples/group.yaml and web.yaml (group %s/%s, VIP %s, IngressClass portico, Ingress %s);\n    adding Service apps/echo and Ingresses echo.lab and secure.lab (TLS); starting 3 agents",
		lab.GroupNamespace, lab.GroupName, lab.VIP, lab.ExampleHost)
	cert, key, err := testcert.ECDSA("secure.lab")
	if err != nil {
		return err
	}
	if err := l.TLSSecret(ctx, "secure-tls", cert, key); err != nil {
		return err
	}
	if err := l.IngressRoutes(ctx, "secure", "secure.lab", "secure-tls", lab.Route{Path: "/", Service: "echo"}); err != nil {
		return err
	}
	if err := l.Up(ctx, 2*time.Minute); err != nil {
		return err
	}
	owner, err := l.Owner()
	if err != nil {
		return err
	}
	fmt.Printf("  all agents ready; %s owns the VIP\n", owner.Name)

	if kubectl != "" {
		step("kubectl get ingress -A")
		deadline := time.Now().Add(30 * time.Second)
		for {
			out, _ := exec.Command(kubectl, "--kubeconfig", l.API.Kubeconfig, "get", "ingress", "-A").CombinedOutput()
			if strings.Count(string(out), lab.VIP.String()) >= 3 || time.Now().After(deadline) {
				fmt.Print(indent(string(out)))
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
	}

	step("HTTP: 300 new connections to http://%s/ (Host echo.lab)", lab.VIP)
	c := l.HTTPClient(false, 2*time.Second)
	edges, pods, clients := map[string]int{}, map[string]int{}, map[string]bool{}
	failed := 0
	for range 300 {
		r, err := l.Get(ctx, c, "echo.lab", "/")
		if err != nil {
			failed++
			continue
		}
		edges[nameOf(l, r.Edge)]++
		pods[r.Pod]++
		clients[r.Client] = true
	}
	fmt.Printf("  served by edge replica: %s   backend pod: %s   failed: %d\n", counts(edges), counts(pods), failed)
	fmt.Printf("  client address the backends saw (X-Real-IP): %s, the client's own (%s): direct server return\n", keys(clients), l.Client.Addr.Addr())

	step("HTTPS: 60 connections to https://%s/ with SNI secure.lab", lab.VIP)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cert)
	tc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: l.Dial, DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{ServerName: "secure.lab", RootCAs: pool}}}
	tedges, cn, tfailed := map[string]int{}, "", 0
	for range 60 {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+lab.VIP.String()+"/", nil)
		req.Host = "secure.lab"
		resp, err := tc.Do(req)
		if err != nil {
			tfailed++
			continue
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		cn = resp.TLS.PeerCertificates[0].Subject.CommonName
		if r, err := traffic.ParseReply(string(body)); err == nil {
			tedges[nameOf(l, r.Edge)]++
		}
	}
	fmt.Printf("  certificate %q; served by edge replica: %s; failed: %d\n", cn, counts(tedges), tfailed)

	step("failover: 200 long-lived connections open; kill -9 the owner's agent (%s) and cut its link", owner.Name)
	res, _, err := l.Failover(ctx, "echo.lab", 200)
	if err != nil {
		return err
	}
	fmt.Printf("  %s took over; client-visible outage %v (1 ms probes)\n", res.New, res.Outage.Round(time.Millisecond))
	fmt.Printf("  long-lived connections on the surviving replicas still working: %d of %d (the new owner's Maglev table is the same)\n", res.Survived, res.Conns)

	step("portico status")
	time.Sleep(8 * time.Second) // long enough for the dead node's report to go stale
	out, err := exec.Command(portico, "status", "-kubeconfig", l.API.Kubeconfig).CombinedOutput()
	fmt.Print(indent(string(out)))
	if err != nil {
		return fmt.Errorf("portico status: %w", err)
	}
	if failed+tfailed > 0 || len(edges) != 3 || res.Survived != res.Conns {
		return fmt.Errorf("the demo saw failures: %d HTTP, %d HTTPS, %d of %d connections lost", failed, tfailed, res.Conns-res.Survived, res.Conns)
	}
	return nil
}

func nameOf(l *lab.Lab, addr string) string {
	for _, e := range l.Edges {
		if e.Addr.Addr().String() == addr {
			return e.Name
		}
	}
	return addr
}

func counts(m map[string]int) string {
	var parts []string
	for _, k := range keysOf(m) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

func keysOf(m map[string]int) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func keys(m map[string]bool) string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

func indent(s string) string {
	return "  " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n  ") + "\n"
}

// runLab brings the lab up and keeps it, for exploring by hand.
func runLab(ctx context.Context, l *lab.Lab, portico, kubectl string) error {
	if err := l.Up(ctx, 2*time.Minute); err != nil {
		return err
	}
	owner, err := l.Owner()
	if err != nil {
		return err
	}
	step("the lab is up: %s owns VIP %s", owner.Name, lab.VIP)
	for _, n := range append(append([]*lab.Node{l.Client}, l.Edges...), l.Pods...) {
		fmt.Printf("  %-3s %-15s ip netns exec %s ...\n", n.Name, n.Addr, n.NS)
	}
	fmt.Printf(`
  try:
    ip netns exec %[1]s curl -s -H 'Host: echo.lab' http://%[2]s/
    ip netns exec %[1]s curl -s -H 'Host: %[3]s' http://%[2]s/
    %[4]s --kubeconfig %[5]s get ingress,svc,endpointslices -A
    %[6]s status -kubeconfig %[5]s
    %[6]s vips -pin /sys/fs/bpf/%[7]s      (and flows, counters)
    bpftool map dump pinned /sys/fs/bpf/%[7]s/backends
  agent logs: %[8]s/<edge>/agent.log

  Ctrl-C tears everything down.
`, l.Client.NS, lab.VIP, lab.ExampleHost, kubectl, l.API.Kubeconfig, portico, l.Net.Prefix+owner.Name, l.Dir)
	<-ctx.Done()
	return nil
}
