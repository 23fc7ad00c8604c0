// Command up brings Portico's real-cluster lab (test/cluster) up and keeps it until
// Ctrl-C (make cluster): etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler and N kubelet nodes in namespaces, then prints how to reach them.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/portico-edge/portico/test/cluster"
)

func main() {
	nodes := flag.Int("nodes", 3, "kubelet nodes")
	grace := flag.Duration("node-monitor-grace-period", 16*time.Second, "how long a silent node stays Ready")
	var images images
	flag.Var(&images, "image", "an OCI archive for every node to import (repeatable), e.g. Portico's image")
	flag.Parse()
	if err := run(cluster.Options{Nodes: *nodes, NodeMonitorGracePeriod: *grace, Images: images}); err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
}

type images []string

func (i *images) String() string     { return strings.Join(*i, ",") }
func (i *images) Set(s string) error { *i = append(*i, s); return nil }

func run(opts cluster.Options) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Printf("starting a control plane and %d kubelet nodes…\n", opts.Nodes)
	c, err := cluster.Start(ctx, opts)
	if err != nil {
		return err
	}
	kubectl := strings.Join(c.KubectlCommand(), " ")
	fmt.Printf("control plane ready in %.1f s, %d nodes Ready in %.1f s\n\n", c.Timings.ControlPlane.Seconds(), opts.Nodes, c.Timings.NodesReady.Seconds())
	fmt.Printf("kubectl (the API server is https://%s:6443, inside namespace %s):\n  alias k='%s'\n  k get nodes -o wide\n\n", cluster.APIAddr, c.Net.Switch, kubectl)
	fmt.Printf("images on every node (imagePullPolicy: Never): %s, %s", cluster.EchoImage, cluster.PauseImage)
	if len(opts.Images) > 0 {
		fmt.Printf(" and those of %s", strings.Join(opts.Images, " "))
	}
	fmt.Println()
	for _, n := range c.Nodes {
		fmt.Printf("node %s (%s, pods %s): nsenter -t %d -m -n -u sh   logs: %s/{kubelet,containerd}.log\n", n.Name, n.IP, n.PodCIDR, n.HolderPID(), n.Dir)
	}
	fmt.Printf("client (%s): ip netns exec %s curl http://<pod or node address>:%d/\n", cluster.ClientAddr, c.Client.NS, cluster.EchoPort)
	fmt.Printf("control plane logs: %s/*.log\n\nCtrl-C tears it all down.\n", c.Dir)
	<-ctx.Done()
	t0 := time.Now()
	err = c.Close()
	fmt.Printf("\ntorn down in %.1f s\n", time.Since(t0).Seconds())
	return err
}
