//go:build tools

// Package tools pins flannel's CNI plugin for `go build` (see go.mod).
package tools

import _ "github.com/containernetworking/plugins/plugins/meta/flannel"
