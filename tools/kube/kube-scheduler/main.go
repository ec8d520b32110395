// Command kube-scheduler is the upstream scheduler, built from the Go
// module proxy like kube-apiserver: it binds project Pods to the test's
// simulated node once their PersistentVolumeClaims are bound.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() { os.Exit(cli.Run(app.NewSchedulerCommand())) }
