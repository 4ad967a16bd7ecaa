// Command cni-usernet-agent is the node agent, the DaemonSet's process
// (pkg/agent): it installs the plugin's binaries (cni-usernet and
// cni-usernet-stack, from beside its own) and the CNI configuration,
// supervises the pods' stacks, enforces NetworkPolicy and serves the
// metrics.
//
// It is its own binary because it links client-go, which the plugin's
// binary, run by the runtime at every ADD, must not carry.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/cni-usernet/cni-usernet/pkg/agent"
	"github.com/cni-usernet/cni-usernet/pkg/util/buildinfo"
)

func main() {
	if len(os.Args) == 2 && (os.Args[1] == "version" || os.Args[1] == "--version") {
		fmt.Println(buildinfo.String("cni-usernet-agent"))
		return
	}
	err := agent.Run(os.Args[1:])
	switch {
	case errors.Is(err, flag.ErrHelp):
		return
	case err != nil:
		fmt.Fprintln(os.Stderr, "cni-usernet-agent:", err)
		os.Exit(1)
	}
}
