// Command cni-usernet-stack is a pod's stack process, started by the
// cni-usernet plugin (and restarted by the node agent) as
// "cni-usernet-stack stack --config FILE": the same arguments as the
// multi-call binary's stack command, so that process listings and the
// agent's search for stacks see one form.
//
// It is its own binary because a node runs one stack per pod: without
// the plugin's, the agent's and the installer's packages its file is 30 %
// smaller and an idle stack maps 5 MiB less (docs/performance.md, "What
// a pod's stack costs").
package main

import (
	"fmt"
	"os"

	"github.com/cni-usernet/cni-usernet/pkg/stack"
	"github.com/cni-usernet/cni-usernet/pkg/util/buildinfo"
)

const usage = `usage:
  cni-usernet-stack stack --config FILE   run a pod's stack (started by the cni-usernet plugin)
  cni-usernet-stack version
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "stack":
		err = stack.Run(os.Args[2:])
	case "version", "--version":
		fmt.Println(buildinfo.String("cni-usernet-stack"))
	case "help", "-h", "--help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "unknown command %q\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cni-usernet-stack:", err)
		os.Exit(1)
	}
}
