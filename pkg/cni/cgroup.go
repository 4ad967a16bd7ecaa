package cni

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/cni-usernet/cni-usernet/pkg/api/netconf"
	"github.com/cni-usernet/cni-usernet/pkg/node/podcgroup"
)

// stackCgroup decides which cgroup the pod's stack is charged to
// (docs/accounting.md), creates what it needs, and logs the decision.
// path is for launch.Options.CgroupPath, relative to /sys/fs/cgroup; ""
// leaves the stack in the cgroup of the process that ran the plugin.
// note, when not empty, says why the stack is not charged to its pod
// though the conflist asks for it: the caller posts it as a Warning Event
// on the pod. A stack that cannot be charged to its pod still serves it:
// only a runtime cgroupPath that breaks a rule (code 7, the runtime's
// configuration is wrong, and the pod would be charged to a cgroup no one
// checked) or a cgroup that cannot be created (code 999) fails ADD.
func (inv *invocation) stackCgroup() (path, note string, err error) {
	return inv.stackCgroupUnder(podcgroup.DefaultRoot)
}

// stackCgroupUnder is stackCgroup with the cgroup mount at root.
func (inv *invocation) stackCgroupUnder(root string) (path, note string, err error) {
	var loc podcgroup.Location
	if inv.conf.StackCgroup == netconf.StackCgroupNode {
		if loc, err = podcgroup.Node(root); err != nil {
			note = fmt.Sprintf(`"stackCgroup" is %q, but %v: the stack stays in the cgroup of the process that ran the plugin`, netconf.StackCgroupNode, err)
			inv.log.Warn("stack cgroup", "path", "", "reason", note)
			return "", note, nil
		}
	} else {
		loc, err = podcgroup.Find(podcgroup.Query{
			Root:        root,
			RuntimePath: inv.conf.RuntimeConfig.CgroupPath,
			PodUID:      string(inv.pod.K8S_POD_UID),
		})
		var refused *podcgroup.RefusedError
		switch {
		case errors.As(err, &refused):
			return "", "", errorf(types.ErrInvalidNetworkConfig,
				`%v; "stackCgroup": %q in the conflist charges stacks to the node instead (docs/accounting.md)`, err, netconf.StackCgroupNode)
		case errors.Is(err, podcgroup.ErrNotFound):
			why := err
			if loc, err = podcgroup.Node(root); err != nil {
				// No kubepods tree: not a node kubelet runs pods on (a
				// runtime driven by hand, a test), where there is no pod
				// to warn.
				inv.log.Warn("stack cgroup", "path", "", "reason", fmt.Sprintf(
					"the stack serves the pod but is not charged to it (%v), nor to the node (%v): it stays in the cgroup of the process that ran the plugin", why, err))
				return "", "", nil
			}
			note = fmt.Sprintf("the stack serves the pod but is charged to the node (%s): %v", loc.Path, why)
		case err != nil:
			return "", "", cniError(types.ErrInternal, fmt.Errorf("finding the pod's cgroup: %w", err))
		}
	}
	if path, err = podcgroup.Prepare(root, loc); err != nil {
		return "", "", cniError(types.ErrInternal, err)
	}
	if note != "" {
		inv.log.Warn("stack cgroup", "path", path, "source", loc.Source, "reason", note)
	} else {
		inv.log.Info("stack cgroup", "path", path, "source", loc.Source)
	}
	return path, note, nil
}
