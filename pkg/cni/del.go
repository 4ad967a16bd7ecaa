package cni

import (
	"errors"
	"slices"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/attachment"
)

// cmdDel undoes an attachment. Everything already gone (state, stack,
// netns, veth, lease) counts as done, so DEL may be repeated and may come
// for a pod this plugin never set up.
func cmdDel(args *skel.CmdArgs) error {
	inv, err := startForDelete(args)
	if err != nil {
		return err
	}
	defer inv.close()
	lock, err := inv.store.Lock(args.ContainerID, args.IfName, lockTimeout)
	if err != nil {
		return cniError(types.ErrTryAgainLater, err)
	}
	att, err := inv.store.Load(args.ContainerID, args.IfName)
	switch {
	case errors.Is(err, state.ErrNotFound):
		att = nil
	case err != nil:
		// A corrupt or foreign state file must not block DEL forever: undo
		// what can be derived from the arguments, then drop the file.
		inv.log.Warn("unreadable state, deleting from arguments", "err", err)
		att = nil
	}
	td := inv.teardown(args.ContainerID, args.IfName, args.Netns)
	td.Chained = inv.chainedWithoutState()
	td.IPAMType, td.IPAMConf = inv.conf.IPAM.Type, args.StdinData
	if att != nil {
		td.FromState(att)
	}
	if err := td.Run(); err != nil {
		lock.Release()
		inv.log.Error("DEL failed", "err", err)
		return cniError(types.ErrInternal, err)
	}
	lock.Release()
	inv.log.Info("DEL done")
	return nil
}

// chainedWithoutState decides from the arguments alone whether the
// attachment was chained (its link and lease belong to an earlier plugin).
// A configuration without "ipam" can only chain. A prevResult is no proof:
// since CNI 0.4.0 runtimes send this plugin's own standalone result on DEL,
// and that result is recognised by the node-side veth named from the
// attachment.
func (inv *invocation) chainedWithoutState() bool {
	if inv.conf.IPAM.Type == "" {
		return true
	}
	if !inv.conf.Chained() {
		return false
	}
	prev, err := current.NewResultFromResult(inv.conf.PrevResult)
	if err != nil {
		return true // as ADD would have treated it
	}
	host := attachment.HostVethName(inv.args.ContainerID, inv.args.IfName)
	return !slices.ContainsFunc(prev.Interfaces, func(i *current.Interface) bool {
		return i != nil && i.Name == host && i.Sandbox == ""
	})
}
