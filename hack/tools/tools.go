//go:build tools

// Package tools records the commands this module builds, so that `go mod tidy` keeps their
// dependencies in go.mod and go.sum. Build them with hack/build-apiserver.sh.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
