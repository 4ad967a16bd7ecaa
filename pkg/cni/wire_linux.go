package cni

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/cni-usernet/cni-usernet/pkg/api/podnet"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/attachment"
	"github.com/cni-usernet/cni-usernet/pkg/node/podkernel"
	"github.com/cni-usernet/cni-usernet/pkg/node/sourceguard"
	"github.com/cni-usernet/cni-usernet/pkg/node/wirens"
)

// makeWireNetns creates the stack's own namespace, pinned at path, where
// the pod's link to the node will live. ADD runs only for an attachment
// that has no record (checked under its lock), so a pin already there was
// left by an ADD that died before its record: undone first (chained, the
// earlier plugin's interface goes back to the pod's namespace).
func (inv *invocation) makeWireNetns(path string, podNS ns.NetNS, u *undo) (ns.NetNS, error) {
	if wirens.Exists(path) && inv.conf.Chained() {
		if err := attachment.ReturnLink(path, podNS, inv.args.IfName, nil); err != nil {
			inv.log.Warn("an earlier ADD's wire namespace keeps the interface", "err", err)
		}
	}
	if err := wirens.Remove(path); err != nil {
		return nil, cniError(types.ErrInternal, fmt.Errorf("removing an earlier ADD's wire namespace: %w", err))
	}
	wire, err := wirens.Create(path)
	if err != nil {
		return nil, cniError(types.ErrInternal, err)
	}
	u.add(func() { wirens.Remove(path) })
	return wire, nil
}

// moveToWire is the chained path's hand-over: the earlier plugin's
// interface leaves the pod's namespace for the stack's. Moving a link
// drops its addresses and routes, so they are collected first into the
// spec the stack starts from (it loads a spec it finds instead of
// collecting). The interface comes back, with its addresses, on DEL and
// on a failed ADD (attachment.ReturnLink).
func (inv *invocation) moveToWire(podNS, wire ns.NetNS, specPath string, u *undo) error {
	ifName := inv.args.IfName
	// A link leaving a namespace leaves there an id (netnsid) for the
	// namespace it went to, and no call takes an id away; through it a
	// container with CAP_NET_ADMIN lists and creates links in that
	// namespace, and could build one on the pod's link again. So the link
	// goes through a namespace of passage, whose id in the pod's goes with
	// it when it is destroyed below.
	if err := wirens.Remove(wire.Path() + ".passage"); err != nil {
		return cniError(types.ErrInternal, err)
	}
	passage, err := wirens.Create(wire.Path() + ".passage")
	if err != nil {
		return cniError(types.ErrInternal, err)
	}
	defer func() {
		passage.Close()
		wirens.Remove(passage.Path())
	}()
	var spec *podnet.Spec
	err = podNS.Do(func(ns.NetNS) error {
		var err error
		if spec, err = podkernel.Collect(ifName); err != nil {
			return err
		}
		if err := spec.Validate(); err != nil {
			return fmt.Errorf("interface %s cannot be taken over: %w", ifName, err)
		}
		return nil
	})
	if err != nil {
		return cniError(types.ErrInternal, err)
	}
	var cidrs []string
	for _, a := range spec.Addrs {
		cidrs = append(cidrs, a.String())
	}
	giveBack := func(from string) {
		if err := attachment.ReturnLink(from, podNS, ifName, cidrs); err != nil {
			inv.log.Warn("cannot give the earlier plugin its interface back", "err", err)
		}
	}
	if err := wirens.MoveLink(podNS, ifName, passage); err != nil {
		return cniError(types.ErrInternal, err)
	}
	if err := wirens.MoveLink(passage, ifName, wire); err != nil {
		giveBack(passage.Path()) // back where it was, for the earlier plugin
		return cniError(types.ErrInternal, err)
	}
	// The path, not the handle: the undo may run after wire is closed.
	wirePath := wire.Path()
	u.add(func() { giveBack(wirePath) })
	if err := os.MkdirAll(filepath.Dir(specPath), 0o700); err != nil {
		return errStateDir(inv.conf.StateDir, fmt.Errorf("creating %s: %w", filepath.Dir(specPath), err))
	}
	if err := podnet.WriteSpec(specPath, spec); err != nil {
		return errStateDir(inv.conf.StateDir, fmt.Errorf("saving the spec of %s: %w", ifName, err))
	}
	return nil
}

// guardSources has the node accept from the node end of the pod's veth
// only frames with the pod's MAC and addresses (pkg/node/sourceguard): should
// the stack, which parses hostile traffic, ever be subverted, it still
// cannot speak for another pod. The node end is the veth peer of the
// pod's link in the stack's namespace: ours standalone, the earlier
// plugin's chained. A chained interface that is no veth (macvlan,
// ipvlan) has no node end to guard; that is logged, not refused.
func (inv *invocation) guardSources(wire ns.NetNS, att *state.Attachment, u *undo) error {
	var mac net.HardwareAddr
	peer := 0
	err := wire.Do(func(ns.NetNS) error {
		l, err := netlinksafe.LinkByName(inv.args.IfName)
		if err != nil {
			return fmt.Errorf("looking up %s in the stack's namespace: %w", inv.args.IfName, err)
		}
		mac = l.Attrs().HardwareAddr
		if v, ok := l.(*netlink.Veth); ok {
			if peer, err = netlink.VethPeerIndex(v); err != nil {
				return fmt.Errorf("finding the node end of %s: %w", inv.args.IfName, err)
			}
		}
		return nil
	})
	if err != nil {
		return cniError(types.ErrInternal, err)
	}
	if peer == 0 {
		inv.log.Warn("the pod's interface is no veth: the node does not check its sources", "ifName", inv.args.IfName)
		return nil
	}
	host, err := netlink.LinkByIndex(peer)
	if err != nil {
		return errorf(types.ErrInternal, "finding the node end of %s (index %d): %v", inv.args.IfName, peer, err)
	}
	g := sourceguard.Guard{Link: host.Attrs().Name, MAC: mac}
	for _, c := range att.IPs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return errorf(types.ErrInternal, "pod address %q: %v", c, err)
		}
		g.IPs = append(g.IPs, p.Addr())
	}
	if err := sourceguard.Install(g); err != nil {
		return cniError(types.ErrInternal, err)
	}
	u.add(func() { sourceguard.Remove(g.Link) })
	att.SourceGuard = g.Link
	return nil
}
