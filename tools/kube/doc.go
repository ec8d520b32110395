// Package kube holds the Kubernetes control plane pgwake's tests run
// against: thin mains over kube-apiserver, kube-controller-manager and etcd
// at the versions k8s.io/kubernetes v1.37.2 pins. It is its own module so
// pgwake's go.mod never depends on k8s.io/kubernetes; scripts/kube-tools
// builds it once per machine into a cache outside the repository.
package kube
