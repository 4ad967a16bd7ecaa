package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/cni-usernet/cni-usernet/pkg/ingressdrop"
	"github.com/cni-usernet/cni-usernet/pkg/launch"
	"github.com/cni-usernet/cni-usernet/pkg/podnet"
	"github.com/cni-usernet/cni-usernet/pkg/state"
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
	td := teardown{
		inv:         inv,
		containerID: args.ContainerID,
		ifName:      args.IfName,
		netns:       args.Netns,
		chained:     inv.chainedWithoutState(),
		ipamType:    inv.conf.IPAM.Type,
		ipamConf:    args.StdinData,
	}
	if att != nil {
		td.fromState(att)
	}
	if err := td.run(); err != nil {
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
	host := hostVethName(inv.args.ContainerID, inv.args.IfName)
	return !slices.ContainsFunc(prev.Interfaces, func(i *current.Interface) bool {
		return i != nil && i.Name == host && i.Sandbox == ""
	})
}

// teardown is everything needed to undo one attachment.
type teardown struct {
	inv         *invocation
	containerID string
	ifName      string
	netns       string
	chained     bool
	proc        launch.Process
	ipamType    string
	ipamConf    []byte
	// cniPath finds the IPAM plugin; empty: CNI_PATH.
	cniPath string
}

func (td *teardown) fromState(att *state.Attachment) {
	td.chained = att.Chained
	td.proc = launch.Process{PID: att.StackPID, StartTime: att.StackStartTime}
	if att.Netns != "" && td.netns == "" {
		td.netns = att.Netns
	}
	if att.IPAMType != "" {
		td.ipamType, td.ipamConf = att.IPAMType, att.IPAMConf
	}
}

func (td *teardown) run() error {
	var errs []error
	p := td.inv.pathsFor(td.containerID, td.ifName)
	procs := []launch.Process{td.proc}
	if td.proc.PID == 0 {
		// No state: the stack, if it runs, is the process started with
		// this attachment's config path.
		procs = launch.Find("stack", "--config", p.config)
	}
	for _, proc := range procs {
		if err := launch.Stop(proc, stopGrace); err != nil {
			errs = append(errs, fmt.Errorf("stopping stack: %w", err))
		}
	}
	if err := td.cleanNetns(); err != nil {
		errs = append(errs, err)
	}
	if !td.chained {
		if err := delLink(hostVethName(td.containerID, td.ifName)); err != nil {
			errs = append(errs, err)
		}
		if td.ipamType != "" {
			if err := td.releaseLease(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, path := range []string{p.stackDir, p.socket, p.log} {
		if err := os.RemoveAll(path); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		// Keep the state so that a retried DEL or GC can finish the job.
		return errors.Join(errs...)
	}
	return td.inv.store.Delete(td.containerID, td.ifName)
}

// cleanNetns removes what the stack left in the pod's namespace: the TUN,
// the ingress drop and, standalone, the pod's veth end. A namespace that
// is gone took all of it with it.
func (td *teardown) cleanNetns() error {
	if td.netns == "" {
		return nil
	}
	netns, err := ns.GetNS(td.netns)
	if err != nil {
		var notExist ns.NSPathNotExistErr
		var notNS ns.NSPathNotNSErr
		if errors.As(err, &notExist) || errors.As(err, &notNS) || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("opening netns %s: %w", td.netns, err)
	}
	defer netns.Close()
	if !isNetNS(netns) {
		return nil // another kind of namespace: nothing of ours can be in it
	}
	tun := td.inv.conf.TUNName
	// The pod's link is ours only as the peer of this attachment's veth:
	// a DEL after an ADD that found CNI_IFNAME taken must leave it.
	host := 0
	if !td.chained {
		host = hostIndex(td.containerID, td.ifName)
	}
	return netns.Do(func(ns.NetNS) error {
		if err := podnet.DeleteTUN(tun); err != nil {
			return err
		}
		if err := podnet.RemoveDivert(); err != nil {
			return err
		}
		if err := ingressdrop.Remove(td.ifName); err != nil {
			return err
		}
		if l, err := netlinksafe.LinkByName(td.ifName); err == nil && isPeerOf(l, host) {
			return delLink(td.ifName)
		}
		return nil
	})
}

// releaseLease runs the IPAM plugin's DEL with the attachment's own
// identity (GC runs it for attachments other than the one in CNI_*).
func (td *teardown) releaseLease() error {
	cniPath := td.cniPath
	if cniPath == "" {
		cniPath = os.Getenv("CNI_PATH")
	}
	path, err := invoke.FindInPath(td.ipamType, filepath.SplitList(cniPath))
	if err != nil {
		return fmt.Errorf("finding IPAM plugin %s: %w", td.ipamType, err)
	}
	args := &invoke.Args{
		Command:     "DEL",
		ContainerID: td.containerID,
		NetNS:       td.netns,
		IfName:      td.ifName,
		Path:        cniPath,
	}
	if err := invoke.ExecPluginWithoutResult(context.Background(), path, td.ipamConf, args, nil); err != nil {
		return fmt.Errorf("releasing lease with %s: %w", td.ipamType, err)
	}
	return nil
}
