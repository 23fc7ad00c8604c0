// Command kube-controller-manager is k8s.io/kubernetes/cmd/kube-controller-manager built
// from the Go module proxy: the DaemonSet, EndpointSlice, node-lifecycle and garbage
// collection controllers of Portico's real-cluster lab (test/cluster).
package main

import (
	"os"
	_ "time/tzdata"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}
