package cni

import (
	"errors"
	"fmt"

	"github.com/cni-usernet/cni-usernet/pkg/node/ingressdrop"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ipam"
)

// cmdGC undoes every attachment of this network that the runtime no longer
// lists in cni.dev/valid-attachments.
func cmdGC(args *skel.CmdArgs) error {
	inv, err := start(args)
	if err != nil {
		return err
	}
	defer inv.close()
	valid := make(map[[2]string]bool)
	for _, a := range inv.conf.ValidAttachments {
		valid[[2]string{a.ContainerID, a.IfName}] = true
	}
	atts, readErrs := inv.store.List()
	for _, e := range readErrs {
		inv.log.Warn("GC skipping unreadable state", "err", e)
	}
	var errs []error
	for _, att := range atts {
		if att.Network != inv.conf.Name || valid[[2]string{att.ContainerID, att.IfName}] {
			continue
		}
		lock, err := inv.store.Lock(att.ContainerID, att.IfName, lockTimeout)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		td := inv.teardown(att.ContainerID, att.IfName, att.Netns)
		td.FromState(att)
		err = td.Run()
		lock.Release()
		if err != nil {
			errs = append(errs, fmt.Errorf("collecting %s/%s: %w", att.ContainerID, att.IfName, err))
			continue
		}
		inv.log.Info("GC removed attachment", "containerID", att.ContainerID, "ifName", att.IfName)
	}
	if len(errs) > 0 {
		return cniError(types.ErrInternal, errors.Join(errs...))
	}
	return nil
}

// cmdStatus says whether the plugin can serve ADD: its state directory
// takes files, the kernel can fence the pod's link from its own stack, and
// the IPAM plugin is ready.
func cmdStatus(args *skel.CmdArgs) error {
	inv, err := start(args)
	if err != nil {
		return err
	}
	defer inv.close()
	if err := inv.store.Writable(); err != nil {
		return types.NewError(types.ErrPluginNotAvailable, err.Error(), "")
	}
	if err := ingressdrop.Supported(); err != nil {
		return types.NewError(types.ErrPluginNotAvailable, err.Error(), "")
	}
	if t := inv.conf.IPAM.Type; t != "" && !inv.conf.Chained() {
		if err := ipam.ExecStatus(t, args.StdinData); err != nil {
			return types.NewError(types.ErrPluginNotAvailable, fmt.Sprintf("IPAM %s: %v", t, err), "")
		}
	}
	return nil
}
