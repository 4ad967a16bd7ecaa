package main

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// agentBinary is the node agent's own binary, installed beside this one
// in the image.
const agentBinary = "cni-usernet-agent"

// execAgent replaces this process by the agent beside it, with args. A
// DaemonSet written for the image whose entrypoint ran the agent as
// `cni-usernet agent` (an earlier chart, a manifest kept by an operator)
// runs this release's image unchanged: its pods stay served while a
// helm upgrade or kubectl apply brings the new DaemonSet.
func execAgent(args []string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding %s beside this binary: %w", agentBinary, err)
	}
	path := filepath.Join(filepath.Dir(self), agentBinary)
	if err := unix.Exec(path, append([]string{path}, args...), os.Environ()); err != nil {
		return fmt.Errorf("running the node agent %s: %w", path, err)
	}
	return nil // not reached: Exec returns only on failure
}
