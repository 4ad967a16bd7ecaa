module github.com/cni-usernet/cni-usernet/hack/sockmap-probe

go 1.26.8

require (
	github.com/cilium/ebpf v0.22.0
	golang.org/x/sys v0.50.0
)
