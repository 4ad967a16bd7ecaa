// SPDX-License-Identifier: Apache-2.0

package cni

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/cni-usernet/cni-usernet/pkg/api/netconf"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
)

// mountNSNote, when not empty, says why this invocation runs in its
// caller's mount namespace rather than the node's; start logs it.
var mountNSNote string

// intoNodeMountNS runs this invocation again, as a child in the node's
// mount namespace (the conflist's "mountNS"), when its caller runs it in
// another one, and exits with the child's status. A meta-plugin in a
// container (Multus thick) or `ip netns exec` runs its delegates in a
// mount namespace of its own: a wire namespace pinned there would be seen
// by no later CHECK, DEL or stack restart, and state, sockets and the
// stack itself would live in a view of the node that goes with the
// caller. In the node's namespace the plugin works as it does when the
// runtime runs it. A mount namespace cannot be entered by a process of
// many threads, so the child is started from a thread that entered it
// (launch.InMountNS).
//
// It returns the configuration it read from stdin, for skel to read
// again, when the invocation stays here: VERSION, a caller already in the
// node's namespace, or a "mountNS" that cannot be opened (this process
// may not open PID 1's namespaces: some sandboxes deny it even to root).
func intoNodeMountNS() []byte {
	command := os.Getenv("CNI_COMMAND")
	if command == "" || command == "VERSION" {
		return nil
	}
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		exitWith(cniError(types.ErrIOFailure, fmt.Errorf("reading the network configuration: %w", err)))
	}
	// Leniently: a configuration the child refuses, it refuses with the
	// full parse's message; here only "mountNS" matters.
	conf, err := netconf.ParseForDelete(data)
	if err != nil {
		return data
	}
	same, err := sameMountNS(conf.MountNS)
	if err != nil {
		mountNSNote = fmt.Sprintf("staying in the caller's mount namespace: %v; a wire namespace pinned here is seen only by callers that share this mount namespace or receive its mounts", err)
		return data
	}
	if same {
		return data
	}
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = os.Args
	cmd.Env = os.Environ()
	cmd.Stdin = bytes.NewReader(data)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := launch.InMountNS(conf.MountNS, cmd.Start); err != nil {
		exitWith(cniError(types.ErrInternal, fmt.Errorf("running the plugin in the node's mount namespace %s: %w", conf.MountNS, err)))
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	switch {
	case err == nil:
		os.Exit(0)
	case errors.As(err, &exit) && exit.ExitCode() > 0:
		os.Exit(exit.ExitCode())
	}
	exitWith(cniError(types.ErrInternal, fmt.Errorf("running the plugin in the node's mount namespace %s: %w", conf.MountNS, err)))
	return nil
}

// sameMountNS reports whether path is this process's mount namespace.
func sameMountNS(path string) (bool, error) {
	own, err := os.Stat("/proc/self/ns/mnt")
	if err != nil {
		return false, fmt.Errorf("reading this process's mount namespace: %w", err)
	}
	f, err := os.Open(path)
	if err != nil {
		return false, fmt.Errorf("opening the node's mount namespace: %w", err)
	}
	defer f.Close()
	node, err := f.Stat()
	if err != nil {
		return false, fmt.Errorf("reading the node's mount namespace %s: %w", path, err)
	}
	return os.SameFile(own, node), nil
}

// exitWith prints err as the CNI error result, as skel does, and exits.
func exitWith(err error) {
	var e *types.Error
	if !errors.As(err, &e) {
		e = types.NewError(types.ErrInternal, err.Error(), "")
	}
	e.Print()
	os.Exit(1)
}

// stdinFrom makes data what skel reads from stdin, which
// intoNodeMountNS has read to the end.
func stdinFrom(data []byte) {
	r, w, err := os.Pipe()
	if err != nil {
		exitWith(cniError(types.ErrIOFailure, fmt.Errorf("passing on the network configuration: %w", err)))
	}
	go func() {
		w.Write(data)
		w.Close()
	}()
	os.Stdin = r
}
