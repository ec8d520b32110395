// Command kube-controller-manager is the upstream controller manager
// (pgwake's tests run its statefulset and garbagecollector controllers),
// built from the Go module proxy like kube-apiserver.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() { os.Exit(cli.Run(app.NewControllerManagerCommand())) }
