// Command kube-apiserver is the upstream API server, built from the Go
// module proxy for pgwake's Kubernetes tests (no release binaries or
// images are reachable on the test machines).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() { os.Exit(cli.Run(app.NewAPIServerCommand())) }
