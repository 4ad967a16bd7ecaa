package nettest

import (
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/types/create"
)

func resultFactory(version string, out []byte) (types.Result, error) {
	return create.Create(version, out)
}
