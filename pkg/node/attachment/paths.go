// Package attachment owns an attachment's life after ADD has made its
// link and lease: where its stack's files live, and undoing it — its
// stack, what the stack left in the pod's namespace, the node-side veth,
// the IP lease, the files and the state record — from the record alone.
// The plugin's DEL and GC, the undo of a failed ADD and the node agent's
// reclaim all go through it.
package attachment

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/wirens"
)

// Paths are an attachment's files.
type Paths struct {
	// StackDir holds Config and Spec.
	StackDir, Config, Spec string
	// Socket is the stack's control socket, Log its log.
	Socket, Log string
	// Policy is the pod's compiled network policy (pkg/api/policy), which the
	// node agent writes and the stack reads at start.
	Policy string
}

// PathsFor gives the files of the attachment of containerID's ifName:
// under stateDir (config and spec), runDir (control socket) and logDir.
func PathsFor(stateDir, runDir, logDir, containerID, ifName string) Paths {
	key := state.Key(containerID, ifName)
	dir := filepath.Join(stateDir, "stacks", key)
	return Paths{
		StackDir: dir,
		Config:   filepath.Join(dir, "config.json"),
		Spec:     filepath.Join(dir, "spec.json"),
		Policy:   filepath.Join(dir, "policy.json"),
		Socket:   filepath.Join(runDir, key+".sock"),
		Log:      filepath.Join(logDir, key+".log"),
	}
}

// WirePath is the pin of the stack's own network namespace, which holds
// the pod's link (pkg/node/wirens), in netnsDir.
func WirePath(netnsDir, containerID, ifName string) string {
	return wirens.Path(netnsDir, state.Key(containerID, ifName))
}

// HostVethName derives the node-side veth name from the attachment, so
// that DEL can find it even when the state file is gone. 15 bytes: the
// kernel's limit.
func HostVethName(containerID, ifName string) string {
	return "usn" + state.Key(containerID, ifName)[:12]
}

// StopGrace is how long a stack gets to close its connections on SIGTERM.
const StopGrace = 5 * time.Second

// StackBinary is the executable that runs pods' stacks for the plugin (or
// agent) whose executable is exe: cni-usernet-stack beside it (exe itself
// when exe is that file). The plugin's own binary carries no stack, so
// that the file the runtime runs at every ADD links neither netstack nor
// the sandbox; a node with only the plugin's file gets a clear error.
func StackBinary(exe string) (string, error) {
	p := exe
	if !strings.HasSuffix(p, "-stack") {
		p += "-stack"
	}
	fi, err := os.Stat(p)
	if err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
		return p, nil
	}
	if err == nil {
		err = errors.New("not an executable file")
	}
	return "", fmt.Errorf("finding the stack's binary beside %s (install cni-usernet-stack with it): %w", exe, err)
}
