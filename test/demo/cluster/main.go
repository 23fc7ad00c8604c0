// Command cluster is `make demo`: Portico on a real Kubernetes cluster, installed
// the way a user installs it. It builds Portico's image (build/image, as make image
// does), starts a control plane (etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler) and four kubelet nodes with their own containerd in network
// namespaces (test/cluster), imports the image into every node, labels and taints
// three nodes as edges, installs the Helm chart with helm, deploys example backends
// and Ingresses with kubectl, shows the cluster as kubectl sees it, sends HTTP and
// HTTPS through the VIP, kills the VIP owner with clients running and prints what
// they saw, waits for Kubernetes to notice, prints `portico status`, and tears
// everything down.
//
// With -hold it keeps the cluster up after the install, prints how to reach it and
// waits for Ctrl-C (make cluster-portico).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/portico-edge/portico/test/cluster"
)

func main() {
	portico := flag.String("portico", "bin/portico", "the portico binary (for portico status)")
	hold := flag.Bool("hold", false, "keep the cluster up after the install until interrupted")
	flag.Parse()
	if err := run(*portico, *hold); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) { fmt.Printf("\n==> "+format+"\n", args...) }

func run(portico string, hold bool) (err error) {
	if err := cluster.Available(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	t0 := time.Now()

	step("building Portico's image (build/image: Debian rootfs by mmdebstrap, static portico, go-containerregistry)")
	dir, err := os.MkdirTemp("", "portico-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	const tag = "demo"
	archive, err := cluster.BuildPorticoImage(ctx, ".", dir, tag)
	if err != nil {
		return err
	}
	fmt.Printf("  %s:%s in %.1f s\n", cluster.PorticoRepository, tag, time.Since(t0).Seconds())

	step("starting a control plane and 4 kubelet nodes, each with its own containerd, namespaces and bpffs; every node imports the image")
	c, err := cluster.Start(ctx, cluster.Options{Nodes: 4, Images: []string{archive}})
	if err != nil {
		return err
	}
	defer func() {
		step("tearing down")
		t := time.Now()
		if cerr := c.Close(); cerr != nil && err == nil {
			err = cerr
		}
		fmt.Printf("  every node's processes ended, namespaces and cgroups removed in %.1f s; the demo took %.0f s in all\n", time.Since(t).Seconds(), time.Since(t0).Seconds())
	}()
	fmt.Printf("  control plane ready in %.1f s, nodes Ready in %.1f s\n", c.Timings.ControlPlane.Seconds(), c.Timings.NodesReady.Seconds())
	edges, worker := c.Nodes[:3], c.Nodes[3]
	kubectl := func(args ...string) {
		fmt.Printf("\n$ kubectl %s\n", strings.Join(args, " "))
		out, err := c.Kubectl(ctx, nil, args...)
		if err != nil {
			fmt.Printf("  %v\n", err)
		}
		fmt.Print(out)
	}

	step("kubectl label/taint nodes %s, %s, %s portico.io/edge=true; helm install portico deploy/helm/portico -n portico-system --create-namespace \\\n"+
		"      --set iface=eth0 --set group.vip=%s --set vipPool=%s --set apiServer=https://%s:6443 --set image.tag=%s",
		edges[0].Name, edges[1].Name, edges[2].Name, cluster.GroupVIP, cluster.VIPPool, cluster.APIAddr, tag)
	t1 := time.Now()
	p, err := c.InstallPortico(ctx, cluster.PorticoOptions{Root: ".", Tag: tag, Edges: edges})
	if err != nil {
		return err
	}
	fmt.Printf("  the DaemonSet controller started an agent on each edge; all ready and the VIP answering %.1f s after helm install\n", time.Since(t1).Seconds())

	step("deploying backends (web: 3 pods, api: 1) and Ingresses web.example (/ and /api), secure.example and other.example (TLS)")
	certs, err := c.DeployExample(ctx, []*cluster.Node{worker})
	if err != nil {
		return err
	}
	kubectl("get", "nodes", "-o", "wide")
	kubectl("get", "pods", "-A", "-o", "wide")
	if err := p.ServedEverywhere(ctx, "web.example", "/", edges, time.Minute); err != nil {
		return err
	}
	kubectl("get", "ingress")

	if hold {
		return holdUp(ctx, c)
	}

	step("100 new connections to http://web.example/ through the VIP %s, from the client %s", cluster.GroupVIP, cluster.ClientAddr)
	hc := p.HTTPClient(false, 2*time.Second)
	perEdge, clients := map[string]int{}, map[string]int{}
	for range 100 {
		r, err := p.Get(ctx, hc, "web.example", "/")
		if err != nil {
			return err
		}
		perEdge[p.EdgeOf(r)]++
		clients[r.Client]++
	}
	printCounts("  served through edge", perEdge)
	printCounts("  the backends saw the client as", clients)

	step("HTTPS by SNI: each host's own certificate")
	for _, host := range []string{"secure.example", "other.example"} {
		r, names, err := p.GetTLS(ctx, host, certs[host])
		if err != nil {
			fmt.Printf("  %s: %v\n", host, err)
			continue
		}
		fmt.Printf("  https://%s/: certificate for %v, answered by %s\n", host, names, r.Pod)
	}

	owner, err := p.Owner(cluster.GroupVIP)
	if err != nil {
		return err
	}
	step("the VIP owner %s dies as a machine does (kubelet, containerd and its agent's processes killed, link cut),\n"+
		"    with 90 long-lived connections open (45 over IPv6) and a new connection every 5 ms; then Kubernetes notices", owner.Name)
	held, err := p.OpenHeld(ctx, 90, 0)
	if err != nil {
		return err
	}
	defer held.Close()
	d, err := p.KillOwner(ctx, held, true)
	if err != nil {
		return err
	}
	fmt.Printf("  the client sent to a new owner %v after the fault (VRRP takeover)\n", d.Takeover.Round(time.Millisecond))
	fmt.Printf("  long-lived connections on the surviving replicas (IPv4 and IPv6): %d of %d answered within %v of the takeover, %d of %d at the end\n",
		d.AfterTakeover.Kept, d.AfterTakeover.Total, cluster.HeldAnswer, d.AtEnd.Kept, d.AtEnd.Total)
	for _, f := range append(d.AfterTakeover.Failed, d.AtEnd.Failed...) {
		fmt.Printf("    failed: %s\n", f)
	}
	fmt.Printf("  new connections: %v\n", d.New)
	fmt.Printf("  Kubernetes marked %s NotReady and its agent's endpoint not ready %.1f s after the fault;\n", owner.Name, d.CaughtUp.Seconds())
	fmt.Printf("  new connections from %v after the fault to the end: %v\n", (d.Takeover + cluster.LivenessBound).Round(time.Millisecond), d.AfterBound)
	if d.Said != "" {
		fmt.Printf("  what the surviving agents said around those failures:\n%s", d.Said)
	}
	kubectl("get", "nodes")
	kubectl("-n", cluster.PorticoNamespace, "get", "pods", "-o", "wide")

	step("portico status (every agent's report, read from its Lease)")
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=/run/netns/" + c.Net.Switch, "--"}, portico, "status", "--kubeconfig", c.Kubeconfig)...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Printf("  portico status: %v\n", err)
	}
	return nil
}

func printCounts(label string, m map[string]int) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	fmt.Printf("%s: %s\n", label, strings.Join(parts, ", "))
}

// holdUp prints how to reach the cluster and waits for Ctrl-C.
func holdUp(ctx context.Context, c *cluster.Cluster) error {
	fmt.Printf("\nkubectl (the API server is https://%s:6443, inside namespace %s):\n  alias k='%s'\n",
		cluster.APIAddr, c.Net.Switch, strings.Join(c.KubectlCommand(), " "))
	fmt.Printf("client: ip netns exec %s curl -H 'Host: web.example' http://%s/\n", c.Client.NS, cluster.GroupVIP)
	for _, n := range c.Nodes {
		fmt.Printf("node %s (%s): nsenter -t %d -m -n -u sh   logs: %s\n", n.Name, n.IP, n.HolderPID(), filepath.Join(n.Dir, "{kubelet,containerd}.log"))
	}
	fmt.Println("\nCtrl-C tears it all down.")
	<-ctx.Done()
	return nil
}
