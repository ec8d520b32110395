// Command etcd is the upstream etcd server, at the version kube-apiserver
// itself is built against, for pgwake's Kubernetes tests.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
