//go:build tools

// Package tools pins the containerd 2 commands hack/k8s/lib/build.sh
// builds for the lab's K8S_LAB_CONTAINERD=2 variant.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
