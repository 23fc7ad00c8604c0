// Command kubectl is the real kubectl, built from the Go module proxy, for the
// lab and the demo (a fresh machine has none).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
)

func main() {
	os.Exit(cli.Run(cmd.NewDefaultKubectlCommand()))
}
