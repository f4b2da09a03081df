//go:build tools

// Package controlplane pins the Kubernetes and etcd releases whose binaries
// the test control plane runs. Nothing here is compiled into the project: the
// imports only make `go build` resolve the commands at the versions in go.mod.
package controlplane

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
