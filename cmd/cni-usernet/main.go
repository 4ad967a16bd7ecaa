// Command cni-usernet is the CNI plugin (when called with CNI_COMMAND set,
// as runtimes do), the node's status table
// ("status"), capture, the recent policy denials ("denials") and the
// by-hand installer; each command is a package under pkg/cli, and this
// file only dispatches to them. Pods' stacks run from cni-usernet-stack, installed
// beside it: this binary, which the runtime runs at every ADD, links no
// part of the stack (no netstack, no sandbox). The node agent is
// cni-usernet-agent, beside it in the image: it links client-go, which
// this binary must not.
package main

import (
	"fmt"
	"os"

	"github.com/cni-usernet/cni-usernet/pkg/cli/capture"
	"github.com/cni-usernet/cni-usernet/pkg/cli/denials"
	"github.com/cni-usernet/cni-usernet/pkg/cli/install"
	"github.com/cni-usernet/cni-usernet/pkg/cli/status"
	"github.com/cni-usernet/cni-usernet/pkg/cni"
	"github.com/cni-usernet/cni-usernet/pkg/util/buildinfo"
)

const usage = `usage:
  cni-usernet                         CNI plugin (CNI_COMMAND and friends in the environment)
  cni-usernet status [--json] [--state-dir DIR]
                                      every attachment on the node with its stack's health and GSO decision
  cni-usernet capture [flags] <namespace>/<pod> | <containerID>
                                      pcapng of a pod's traffic on both legs (root on the node)
  cni-usernet denials [-json] [--pod NS/NAME] [--last N] [--state-dir DIR]
                                      the recent network policy denials of the node's pods
  cni-usernet install|uninstall [flags]
                                      install the plugin and its CNI configuration by hand / restore the node
  cni-usernet version

The node agent (the DaemonSet's process) is cni-usernet-agent [flags]; "cni-usernet agent [flags]" runs it.
`

func main() {
	if os.Getenv("CNI_COMMAND") != "" || len(os.Args) < 2 {
		cni.Main()
		return
	}
	var err error
	switch os.Args[1] {
	case "status":
		err = status.Run(os.Args[2:], os.Stdout, os.Stderr)
	case "denials":
		err = denials.Run(os.Args[2:], os.Stdout, os.Stderr)
	case "capture":
		err = capture.Run(os.Args[2:], os.Stdout, os.Stderr)
	case "agent":
		err = execAgent(os.Args[2:])
	case "install":
		err = install.Run(os.Args[2:], os.Stdout, os.Stderr)
	case "uninstall":
		err = install.RunUninstall(os.Args[2:], os.Stderr)
	case "version", "--version":
		fmt.Println(buildinfo.String("cni-usernet"))
	case "help", "-h", "--help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "unknown command %q\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cni-usernet:", err)
		os.Exit(1)
	}
}
