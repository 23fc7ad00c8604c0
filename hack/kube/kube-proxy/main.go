// Command kube-proxy is k8s.io/kubernetes/cmd/kube-proxy built from the Go module
// proxy: Kubernetes' own Service proxy on every node of Portico's real-cluster
// lab (test/cluster), in iptables mode, beside Portico's traffic.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-proxy/app"
)

func main() {
	os.Exit(cli.Run(app.NewProxyCommand()))
}
