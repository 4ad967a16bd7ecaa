package cni

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
)

// cmdCheck verifies that the attachment is as ADD left it: the stack runs
// and is healthy, it serves the addresses of prevResult, the applications'
// TUN (the pod's interface) carries them, and the kernel holds none on the
// pod's link in the stack's namespace.
func cmdCheck(args *skel.CmdArgs) error {
	inv, err := start(args)
	if err != nil {
		return err
	}
	defer inv.close()
	lock, err := inv.store.Lock(args.ContainerID, args.IfName, lockTimeout)
	if err != nil {
		return cniError(types.ErrTryAgainLater, err)
	}
	defer lock.Release()
	if err := inv.check(); err != nil {
		inv.log.Error("CHECK failed", "err", err)
		return cniError(types.ErrInternal, err)
	}
	return nil
}

func (inv *invocation) check() error {
	args := inv.args
	att, err := inv.store.Load(args.ContainerID, args.IfName)
	if errors.Is(err, state.ErrNotFound) {
		return fmt.Errorf("no attachment for container %s interface %s", args.ContainerID, args.IfName)
	}
	if err != nil {
		return errUnreadableState(err, args.ContainerID, args.IfName)
	}
	if sv := att.Supervision; sv != nil && sv.Unhealthy != "" {
		return fmt.Errorf("stack of %s is unhealthy: %s", args.ContainerID, sv.Unhealthy)
	}
	proc := launch.Process{PID: att.StackPID, StartTime: att.StackStartTime}
	if !launch.Alive(proc) {
		return fmt.Errorf("stack process %d of %s is not running", att.StackPID, args.ContainerID)
	}
	if err := control.Health(att.ControlSocket, 2*time.Second); err != nil {
		return err
	}
	var st control.Status
	if err := control.FetchStatus(att.ControlSocket, 2*time.Second, &st); err != nil {
		return err
	}
	want, err := inv.expectedIPs(att)
	if err != nil {
		return err
	}
	for _, ip := range want {
		if !slices.ContainsFunc(st.Spec.Addrs, func(p netip.Prefix) bool { return p.Addr() == ip }) {
			return fmt.Errorf("stack does not serve %s", ip)
		}
	}
	netns, err := ns.GetNS(args.Netns)
	if err != nil {
		return fmt.Errorf("opening netns %s: %w", args.Netns, err)
	}
	defer netns.Close()
	err = netns.Do(func(ns.NetNS) error {
		tun, err := netlinksafe.LinkByName(st.TUNName)
		if err != nil {
			return fmt.Errorf("TUN %s of the applications: %w", st.TUNName, err)
		}
		if _, ok := tun.(*netlink.Tuntap); !ok {
			return fmt.Errorf("%s in the pod is a %s, not the stack's TUN", st.TUNName, tun.Type())
		}
		have, err := addrsOf(tun)
		if err != nil {
			return err
		}
		for _, ip := range want {
			if !slices.Contains(have, ip) {
				return fmt.Errorf("TUN %s lacks pod address %s", st.TUNName, ip)
			}
		}
		if att.WireNetns != "" {
			return nil
		}
		return kernelHoldsNone(args.IfName)
	})
	if err != nil || att.WireNetns == "" {
		return err
	}
	wire, err := ns.GetNS(att.WireNetns)
	if err != nil {
		return fmt.Errorf("the stack's namespace, which holds the pod's link: %w", err)
	}
	defer wire.Close()
	return wire.Do(func(ns.NetNS) error { return kernelHoldsNone(args.IfName) })
}

// kernelHoldsNone checks, in the namespace that holds the pod's link, that
// the kernel has no address on it that the stack took over.
func kernelHoldsNone(ifName string) error {
	link, err := netlinksafe.LinkByName(ifName)
	if err != nil {
		return fmt.Errorf("pod link %s: %w", ifName, err)
	}
	kernel, err := addrsOf(link)
	if err != nil {
		return err
	}
	for _, a := range kernel {
		if !a.IsLinkLocalUnicast() {
			return fmt.Errorf("kernel holds %s on %s, which the stack owns", a, ifName)
		}
	}
	return nil
}

// expectedIPs are the addresses of prevResult (CHECK's contract), or those
// ADD recorded when the runtime sends none.
func (inv *invocation) expectedIPs(att *state.Attachment) ([]netip.Addr, error) {
	var out []netip.Addr
	if inv.conf.PrevResult != nil {
		prev, err := current.NewResultFromResult(inv.conf.PrevResult)
		if err != nil {
			return nil, fmt.Errorf("converting prevResult: %w", err)
		}
		for _, ipc := range prev.IPs {
			a, _ := netip.AddrFromSlice(ipc.Address.IP)
			out = append(out, a.Unmap())
		}
		return out, nil
	}
	for _, s := range att.IPs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("state address %q: %w", s, err)
		}
		out = append(out, p.Addr())
	}
	return out, nil
}

func addrsOf(link netlink.Link) ([]netip.Addr, error) {
	addrs, err := netlinksafe.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("listing addresses of %s: %w", link.Attrs().Name, err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}
