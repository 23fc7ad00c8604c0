// Command etcd is go.etcd.io/etcd/server/v3's etcd built from the Go module proxy: the
// store behind the kube-apiserver that Portico's integration tests (test/kapi) run against.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
